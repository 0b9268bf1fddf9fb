"""The device seam, launcher side.

The launcher asks it which device to use (`resolve_device`), how many ranks to start
(`default_nproc`), which environment the workers get (`worker_env`) and which torchtitan
overrides the device needs (`override_imports`). Each worker calls `fixes.install(device)` before
it imports torchtitan, which makes stock torchtitan 0.3.0 run on that device.

On CPU, `fixes.install` applies the fixes measured for torchtitan 0.3.0 on CPU. Each fix
is applied only when a probe shows the capability it supplies is missing (never by version
string), and applying it twice changes nothing.

Process-group backend: torchtitan picks it itself (distributed/utils.py `init_distributed`):
`torch.distributed.Backend.default_device_backend_map[device_type]` - gloo for cpu, nccl for
cuda, and whatever torch-neuronx registers for neuron - with ",cpu:gloo" appended when
`training.enable_cpu_offload` is set. Nothing needs setting as long as torchtitan's
`device_type` is right (`fixes`); `dist_backend` reports the same choice for the launcher.

Neuron: torch-neuronx (TorchNeuron) registers the `neuron` device (PrivateUse1, `torch.neuron`)
and the `neuron` process-group backend; it is never imported when this module is imported. What a
trn2.48xlarge run needs beyond torchtitan's own device pick:
- 64 ranks per node: 16 Trainium2 chips x 8 physical NeuronCores, paired by LNC=2
  (`NEURON_LOGICAL_NC_CONFIG=2`, `worker_env`; the compiler's `--logical-nc-config` must match);
- `compile.backend=neuron` (TorchNeuron's TorchDynamo backend; torchtitan passes
  `compile.backend` to `torch.compile`), set by the plan unless the user chose one
  (`compile_backend`);
- no FlexAttention: torchtitan refuses a non-inductor compile backend for FlexAttention models, so
  `override_imports` swaps it for SDPA on the same mask (`kernels/attention/neuron.py`) and
  `install` does the same for the HF backend;
- neuronx-cc flags (`compiler_env`) and TorchNeuron's persistent NEFF cache (`neff_cache_dir`,
  `device.cache_dir`): TorchNeuron (Neuron 2.30+, no PyTorch/XLA) stores every graph it compiles
  there, keyed by the graph, and reuses it in later runs; with no TORCH_NEURONX_NEFF_CACHE_DIR it
  uses /tmp. `neuron_parallel_compile` and NEURON_COMPILE_CACHE_URL belong to the PyTorch/XLA
  path that Neuron 2.30 retired: nothing here sets or reads them.
A dry run may plan for a device that is not here (`resolve_device(..., dry_run=True)`); the plan
then says so (`unavailable_reason`).

torch is imported only where a question needs it: the launcher resolves a CPU job's device and
starts torchrun without it (`_torch_build_has_gpu_support` reads the build's version file).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import types
from dataclasses import dataclass
from pathlib import Path

from qwen3_neuron.errors import ConfigError, DeviceUnavailableError

DEVICE_TYPES = ("cpu", "cuda", "neuron")

NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
# trn2.48xlarge: 16 Trainium2 chips x 8 physical NeuronCores, paired into logical cores by LNC=2.
TRN2_48XLARGE_LOGICAL_CORES = 64
TRN2_LOGICAL_NC_CONFIG = "2"
CPU_RANKS = 2  # the CPU path is 2-rank FSDP on gloo: the smallest setup that exercises sharding

_PROCESS_GROUP_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "neuron": "neuron"}
# CPU: SDPA in place of FlexAttention, which cannot train there, as an override.imports entry (a
# string, so the launcher need not import torchtitan).
SDPA_FOR_FLEX_OVERRIDE = "qwen3_neuron.kernels.attention.sdpa.sdpa_for_flex"
# Neuron compiles no FlexAttention: the same SDPA computation, in a module torchtitan lets
# compile.backend=neuron compile (kernels/attention/neuron.py says why).
NEURON_ATTENTION_OVERRIDE = "qwen3_neuron.kernels.attention.neuron.sdpa_for_neuron"
_COMPILE_BACKENDS = {"neuron": "neuron"}  # cpu/cuda: torchtitan's default (inductor)
# neuronx-cc flags for trn2 training (NEURON_CC_FLAGS, read by TorchNeuron's compile path): the
# target, the LNC that must match NEURON_LOGICAL_NC_CONFIG, and transformer-tuned scheduling.
TRN2_NEURON_CC_FLAGS = f"--target=trn2 --logical-nc-config={TRN2_LOGICAL_NC_CONFIG} --model-type=transformer"
# TorchNeuron's persistent NEFF cache (TorchNeuron environment variables reference, "caching").
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
# The project's per-user cache root (peak_flops.json lives there too); tests point it at a temp dir.
USER_CACHE_ENV = "QWEN3_NEURON_CACHE"


# ---- launcher side ---------------------------------------------------------------------------


def resolve_device(requested: str, *, dry_run: bool = False) -> str:
    """`auto` -> neuron, else cuda, else cpu; an explicit device is checked, never swapped.

    `dry_run=True` plans for an explicit device even when it is not here (nothing will run);
    `unavailable_reason` then says what is missing, for the plan to state it."""
    if requested == "auto":
        if _neuron_problem() is None:
            return "neuron"
        return "cuda" if _torch_build_has_gpu_support() and _torch().cuda.is_available() else "cpu"
    if requested not in DEVICE_TYPES:
        raise DeviceUnavailableError(
            f"unknown device {requested!r}: choose one of auto, {', '.join(DEVICE_TYPES)}"
        )
    problem = unavailable_reason(requested)
    if problem is not None and not dry_run:
        raise DeviceUnavailableError(f"device={requested} is not available: {problem}")
    return requested


def unavailable_reason(device_type: str) -> str | None:
    """Why `device_type` cannot run here (what to install or check), or None when it can."""
    _check_known(device_type)
    return {"cpu": lambda: None, "cuda": _cuda_problem, "neuron": _neuron_problem}[device_type]()


def default_nproc(device_type: str) -> int:
    """Ranks per node: one per accelerator (per logical NeuronCore), `CPU_RANKS` on CPU."""
    _check_known(device_type)
    if device_type == "cpu":
        return CPU_RANKS
    if device_type == "cuda":
        return _torch().cuda.device_count()
    neuron = _torch_neuron_module()
    if neuron is not None and neuron.is_available():
        return neuron.device_count()  # documented torch.neuron API, counts logical cores
    return TRN2_48XLARGE_LOGICAL_CORES


def dist_backend(device_type: str) -> str:
    """The process-group backend torchtitan will pick for this device (see module docstring)."""
    _check_known(device_type)
    return _PROCESS_GROUP_BACKENDS[device_type]


def worker_env(device_type: str, nproc: int | None = None) -> dict[str, str]:
    """Environment variables the launcher sets for the workers (command.sh records them)."""
    _check_known(device_type)
    if device_type == "cpu":
        # torchrun would set 1 thread per rank; split the cores between the ranks instead, unless
        # the user exported a thread count (README: one thread for runs compared number for number)
        ranks = nproc or default_nproc("cpu")
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // ranks))
        return {"OMP_NUM_THREADS": threads}
    if device_type == "neuron":
        # Logical NeuronCore = 2 physical cores (Trn2's default, stated so the rank count holds);
        # docs: about-neuron/arch/neuron-features/logical-neuroncore-config.
        return {"NEURON_LOGICAL_NC_CONFIG": TRN2_LOGICAL_NC_CONFIG}
    return {}


def launch_python_path() -> list[str]:
    """Where this launch imports from besides the installed packages (the workers' PYTHONPATH, `run.python_path`
    once settled): its directory, then $PYTHONPATH."""
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return list(dict.fromkeys([os.getcwd(), *map(os.path.abspath, inherited)]))


def override_imports(device_type: str, model_kind: str) -> list[str]:
    """`override.imports` entries the device needs for a model kind (`hf`, `native`, `moe`)."""
    _check_known(device_type)
    if model_kind == "hf":
        return []  # the HF backend gets its SDPA from install() instead
    if device_type == "cpu" and not _flex_attention_trains_on_cpu():
        return [SDPA_FOR_FLEX_OVERRIDE]
    if device_type == "neuron":
        return [NEURON_ATTENTION_OVERRIDE]
    return []


def compile_backend(device_type: str) -> str | None:
    """The `compile.backend` the device needs when `compile.enable=true`; None: torchtitan's
    default (inductor). TorchNeuron lowers through its own backend, not inductor."""
    _check_known(device_type)
    return _COMPILE_BACKENDS.get(device_type)


def mixed_precision_param(device_type: str) -> str | None:
    """FSDP's parameter dtype (`training.mixed_precision_param`) when the user sets none; None:
    torchtitan's (bfloat16). A CPU without bf16 matmul units (AVX512_BF16, AMX) emulates bf16:
    a tiny Qwen3 step runs about 10x slower than in float32 there."""
    _check_known(device_type)
    if device_type == "cpu" and not _cpu_has_bf16_units():
        return "float32"
    return None


def _cpu_has_bf16_units() -> bool:
    # torch's own probes (the ones its CPU kernels dispatch on); absent ones count as "no"
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(_torch().cpu, name, lambda: False)() for name in probes)


def compiler_env(device_type: str) -> dict[str, str]:
    """Compiler variables the device's workers need, minus those the user exported (theirs are
    kept: the launcher passes its own environment on). The NEFF cache is `neff_cache_dir`'s."""
    _check_known(device_type)
    if device_type != "neuron":
        return {}
    wanted = {"NEURON_CC_FLAGS": TRN2_NEURON_CC_FLAGS}
    return {name: value for name, value in wanted.items() if name not in os.environ}


def default_neff_cache_dir() -> Path:
    """Under the user's cache dir, not the run dir: every run and every job of a sweep with the
    same graphs reuses what an earlier one compiled ($QWEN3_NEURON_CACHE/neff, else
    ~/.cache/qwen3_neuron/neff)."""
    root = os.environ.get(USER_CACHE_ENV) or Path.home() / ".cache" / "qwen3_neuron"
    return Path(root).expanduser() / "neff"


def neff_cache_dir(requested: str | None) -> tuple[Path, str]:
    """TorchNeuron's NEFF cache for a device=neuron run, and where that choice came from.

    `requested` is `device.cache_dir` (null: not set). An exported TORCH_NEURONX_NEFF_CACHE_DIR
    is used when the key is not set (a cluster's prolog or a user's shell profile names the shared
    cache once for every tool); when both are set they must name the same dir. Two different
    answers are refused rather than one silently dropped: the plan and command.sh must say where
    the workers' NEFFs go. A relative path is taken from the launch directory."""
    exported = os.environ.get(NEFF_CACHE_ENV)
    if requested is None:
        if exported:
            return _absolute(exported), f"exported {NEFF_CACHE_ENV}"
        return default_neff_cache_dir(), "default: the user's cache dir"
    chosen = _absolute(requested)
    if exported and _absolute(exported) != chosen:
        raise ConfigError(
            f"device.cache_dir={requested} and the exported {NEFF_CACHE_ENV}={exported} name two "
            f"different NEFF caches. Set one: unset {NEFF_CACHE_ENV}, or drop device.cache_dir "
            "(the exported one is then used), or make them the same dir."
        )
    if chosen.exists() and not chosen.is_dir():
        raise ConfigError(f"device.cache_dir={requested}: {chosen} exists and is not a directory.")
    return chosen, "device.cache_dir"


def _absolute(path: str) -> Path:
    return Path(path).expanduser().absolute()


# ---- the Neuron SDK: which TorchNeuron's rules apply -----------------------------------------

# torch-neuronx's version after torch's major.minor -> its Neuron SDK release (the TorchNeuron
# release notes: 2.13.3.0 / 2.14.3.0 are SDK 2.33, 2.13.3.1 / 2.14.3.1 are SDK 2.34).
NEURON_SDK_RELEASES = {(3, 0): (2, 33), (3, 1): (2, 34)}


@dataclass(frozen=True)
class NeuronSdk:
    """The Neuron SDK whose rules the plan applies, and where that came from."""

    release: tuple[int, int]
    source: str  # the torch-neuronx it was read from, or why its rules are assumed

    @property
    def name(self) -> str:
        return f"Neuron SDK {self.release[0]}.{self.release[1]}"

    def __str__(self) -> str:
        return f"{self.name}: {self.source}"


def torch_neuronx_version() -> str | None:
    """The installed torch-neuronx's version (read from its metadata, not imported)."""
    try:
        return importlib.metadata.version("torch-neuronx")
    except importlib.metadata.PackageNotFoundError:
        return None


def neuron_sdk(torch_neuronx: str | None) -> NeuronSdk:
    """The Neuron SDK of a torch-neuronx version. None (not installed: a dry run elsewhere) and
    versions older than the known releases get the oldest's rules, newer ones the newest's."""
    oldest, newest = min(NEURON_SDK_RELEASES.values()), max(NEURON_SDK_RELEASES.values())
    if torch_neuronx is None:
        return NeuronSdk(oldest, "torch-neuronx is not installed here, the oldest TorchNeuron assumed")
    parts = re.match(r"\d+\.\d+\.(\d+)\.(\d+)", torch_neuronx)
    key = (int(parts[1]), int(parts[2])) if parts else (-1, -1)
    if key in NEURON_SDK_RELEASES:
        return NeuronSdk(NEURON_SDK_RELEASES[key], f"torch-neuronx {torch_neuronx}")
    if key > max(NEURON_SDK_RELEASES):
        return NeuronSdk(newest, f"torch-neuronx {torch_neuronx}, newer than the releases this project knows")
    return NeuronSdk(oldest, f"torch-neuronx {torch_neuronx}, older than TorchNeuron (Neuron SDK 2.33)")


# ---- device availability ---------------------------------------------------------------------


def _check_known(device_type: str) -> None:
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"unknown device type {device_type!r}: expected one of {DEVICE_TYPES}")


def _torch():
    import torch  # a second or more: imported by the questions that need it

    return torch


@functools.cache
def _torch_build_has_gpu_support() -> bool:
    """Whether the installed torch is a CUDA or ROCm build, read from its `torch/version.py`
    (written at build time) without importing torch: a CPU build never sees a GPU."""
    spec = importlib.util.find_spec("torch")
    version_file = spec and spec.submodule_search_locations and os.path.join(
        spec.submodule_search_locations[0], "version.py"
    )
    if not version_file or not os.path.exists(version_file):
        return True  # unknown layout: ask torch itself
    module_spec = importlib.util.spec_from_file_location("_torch_build_version", version_file)
    version = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(version)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


def _cuda_problem() -> str | None:
    torch = _torch()
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build. Install a CUDA build, e.g. "
            "`pip install torch --index-url https://download.pytorch.org/whl/cu128`, "
            "on a machine with an NVIDIA GPU."
        )
    return (
        f"torch is built for CUDA {torch.version.cuda} but sees no GPU "
        "(check `nvidia-smi` and CUDA_VISIBLE_DEVICES)."
    )


def _neuron_problem() -> str | None:
    if importlib.util.find_spec("torch_neuronx") is None:
        return (
            "torch-neuronx is not installed. It is not on PyPI: on a Trainium (trn2/trn3) "
            "instance run `pip install torch-neuronx --extra-index-url "
            f"{NEURON_PIP_INDEX}` (see the AWS Neuron setup guide)."
        )
    neuron = _torch_neuron_module()
    if neuron is None:
        return "torch-neuronx is installed but failed to import or did not register torch.neuron."
    if not neuron.is_available():
        return "torch-neuronx is installed but sees no Neuron device (check `neuron-ls`)."
    return None


def _torch_neuron_module() -> types.ModuleType | None:
    """`torch.neuron`, importing torch-neuronx lazily; None when it is not installed."""
    if importlib.util.find_spec("torch_neuronx") is None:
        return None
    try:
        importlib.import_module("torch_neuronx")
    except ImportError:
        return None
    return getattr(_torch(), "neuron", None)


@functools.cache
def _flex_attention_trains_on_cpu() -> bool:
    """Probe: does flex_attention accept inputs that require grad on CPU? (not in torch 2.13)"""
    from torch.nn.attention.flex_attention import flex_attention

    q_BNLH = _torch().zeros(1, 1, 16, 16, requires_grad=True)
    try:
        flex_attention(q_BNLH, q_BNLH, q_BNLH).sum().backward()
    except NotImplementedError:  # "FlexAttention does not support backward on CPU"
        return False
    return True
