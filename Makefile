# Set-up and the everyday commands. `make run` and `make test` do all set-up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup assets run test test-unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel first, so the project's `torch>=2.13` is already met (no CUDA download).
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed assets

assets: $(VENV)/.installed
	$(PY) -m qwen3_neuron.assets

run: setup
	$(PY) launch.py $(ARGS)

test: setup
	bash scripts/install_slurm.sh   # a local SLURM for tests/test_slurm.py (skips, saying why, if it cannot)
	# two test processes, a test file each at a time (its module fixtures train once): a launch
	# leaves a core idle for much of its start-up, which the other file's launch then uses
	$(PY) -m pytest -q -n 2 --dist loadfile $(ARGS)

test-unit: setup
	$(PY) -m pytest -q -m "not integration" $(ARGS)

bench: setup
	$(PY) bench/launch_overhead.py

clean:
	rm -rf outputs multirun
