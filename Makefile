# Set-up and the everyday commands. `make run` and `make test` do all set-up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra pip arguments for torch alone, e.g. another CUDA build's wheel index:
#   make setup TORCH_PIP_ARGS="--index-url <PyTorch's wheel index for your CUDA version>"
TORCH_PIP_ARGS ?=
export HF_HUB_OFFLINE := 1

.PHONY: setup assets run test test-unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, so the project's `torch>=2.13` is already met: on a machine without a GPU the CPU
	# wheel (here it lies on disk); on a Linux GPU machine PyPI's torch==2.13.0 is the CUDA build.
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "torch==2.13.0"
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
