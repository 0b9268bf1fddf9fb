# Set-up and the everyday commands. `make run` and `make test` do all set-up first.
PYTHON ?= python3
# torch: 2.13.0 from pip's index by default (CI's index has the CPU wheel; PyPI's Linux wheel is the
# CUDA build, several GB; TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" takes
# the CPU-only one). `make test TORCH=2.14.1`
# (or run, setup, ...) uses that torch in its own venv, .venv-torch2.14.1; PyPI's Linux wheels
# from 2.14 on are CUDA builds (several GB), which also run on CPU.
DEFAULT_TORCH := 2.13.0
TORCH ?= $(DEFAULT_TORCH)
VENV ?= $(if $(filter $(DEFAULT_TORCH),$(TORCH)),.venv,.venv-torch$(TORCH))
PY := $(VENV)/bin/python
# Extra pip arguments for torch alone, e.g. another CUDA build's wheel index:
#   make setup TORCH_PIP_ARGS="--index-url <PyTorch's wheel index for your CUDA version>"
TORCH_PIP_ARGS ?=
export HF_HUB_OFFLINE := 1

.PHONY: setup setup-neuron assets run test test-isa test-recipes test-unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml scripts/uv_pip.py
	# uv installs in seconds what pip takes minutes for; scripts/uv_pip.py hands it pip's indexes.
	# torch first (TORCH_PIP_ARGS: another index), then the project with torch held at that version.
	$(PY) -m pip install --quiet uv
	echo "torch==$(TORCH)" > $(VENV)/torch-pin.txt
	$(PY) scripts/uv_pip.py install --quiet $(TORCH_PIP_ARGS) -c $(VENV)/torch-pin.txt "torch==$(TORCH)"
	$(PY) scripts/uv_pip.py install --quiet -c $(VENV)/torch-pin.txt -e ".[dev]"
	# This venv caches each module's bytecode at its first import, also where PYTHONDONTWRITEBYTECODE
	# is set (which would have every process compile every import again). The suite imports a
	# quarter of what is installed: compiling it all at install took longer than that quarter.
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'qwen3_neuron_bytecode.pth').write_text('import sys; sys.dont_write_bytecode = False\\n')"
	touch $@

setup: $(VENV)/.installed assets

# A Trainium instance: into the active environment that holds AWS's torch-neuronx and torchtitan
# (the torchtitan-neuron fork or upstream 0.3.0), the project and its own dependencies, never torch
# or torchtitan (scripts/setup_neuron.py says how). `make setup-neuron PYTHON=python`;
# PIP_ARGS="..." goes to pip.
setup-neuron:
	$(PYTHON) scripts/setup_neuron.py $(PIP_ARGS)
	$(PYTHON) -m qwen3_neuron.assets

assets: $(VENV)/.installed
	$(PY) -m qwen3_neuron.assets

run: setup
	$(PY) launch.py $(ARGS)

test: setup
	bash scripts/install_slurm.sh   # a local SLURM for tests/test_slurm.py (skips, saying why, if it cannot)
	# three test processes on two cores, a test file each at a time (tests/conftest.py: files
	# sharing a trained run together, the longest first): a launch leaves its cores idle while its
	# ranks start, wait on each other and write, which the other processes' launches then use
	# (AMD EPYC, 2 cores, a fresh clone: -n 2 610.8 s, -n 3 531.9 s). --durations: the times
	# LONGEST_FIRST is ordered by
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=40 -m "not recipe" $(ARGS)

# The bundled recipes that learn (tests/test_recipes.py), each as its docs give it: minutes apiece
test-recipes: setup
	$(PY) -m pytest -q -m recipe -s $(ARGS)

# The numerics tests again with oneDNN capped at AVX2, then at AVX-512 without BF16/AMX: bf16 work
# rounds differently per instruction set, so a tolerance sized on one CPU fails here, not on the next
# machine (pytest's 5: no test selected, e.g. ARGS with -k)
test-isa: setup
	for isa in AVX2 AVX512_CORE; do \
	  echo "ONEDNN_MAX_CPU_ISA=$$isa"; \
	  ONEDNN_MAX_CPU_ISA=$$isa $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m numerics $(ARGS) \
	    || [ $$? -eq 5 ] || exit 1; \
	done

test-unit: setup
	$(PY) -m pytest -q -m "not integration" $(ARGS)

bench: setup
	$(PY) bench/launch_overhead.py

clean:
	rm -rf outputs multirun
