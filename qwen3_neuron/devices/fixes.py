"""Worker side of the device seam: `install(device)` makes stock torchtitan 0.3.0 run on that
device. Call it before any torchtitan module is imported (they copy the device type at import).

On CPU the fixes are the ones measured in the project's notes on torchtitan 0.3.0 on CPU. Each
is applied only when its probe (beside it) shows the capability it supplies is missing, never by
version string, and applying it twice changes nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from datetime import timedelta

import torch

from qwen3_neuron.devices.policy import _check_known, _flex_attention_trains_on_cpu
from qwen3_neuron.devices.torch_capabilities import fsdp_takes_spmd_types
from qwen3_neuron.errors import DeviceUnavailableError

_HF_BACKEND_MODEL = "torchtitan.experiments.transformers_modeling_backend.model"


# ---- worker side -----------------------------------------------------------------------------


def install(device_type: str) -> None:
    """Make torchtitan run on `device_type`. Call before importing torchtitan (idempotent)."""
    _check_known(device_type)
    if device_type == "cpu":
        _point_torchtitan_at("cpu", _cpu_device_module())
        _add_set_timeout_fallback()
        _sum_fsdp_gradients_without_premul_sum()
        _use_plain_fsdp_mesh_without_spmd_types_support()
        _route_hf_flex_attention_to_sdpa()  # native models: an override (policy.override_imports)
        _build_block_masks_without_compiling()
    elif device_type == "neuron":
        _point_torchtitan_at("neuron", _import_torch_neuronx())
        _after_import(_HF_BACKEND_MODEL, _use_hf_sdpa_attention)  # no flex_attention on Neuron
    # cuda: torchtitan's own pick (tools/utils.py get_device_info) is already right.


def _import_torch_neuronx() -> types.ModuleType:
    """`torch.neuron`, from importing torch-neuronx, which registers it and the `neuron` process-group
    backend. torchtitan reads the device type when it is imported: this comes first (torch autoloads
    torch-neuronx too, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). A failure stops the worker here,
    not as a "cuda" device torchtitan falls back to."""
    try:
        importlib.import_module("torch_neuronx")
    except ImportError as e:
        raise DeviceUnavailableError(f"device=neuron: torch-neuronx does not import: {e}") from e
    neuron = getattr(torch, "neuron", None)
    if neuron is None:
        raise DeviceUnavailableError(
            "device=neuron: torch-neuronx imported but registered no torch.neuron device: TorchNeuron is "
            "torch-neuronx 2.13.3 / 2.14.3 and later (Neuron SDK 2.33+); older ones are PyTorch/XLA's."
        )
    return neuron


# ---- torchtitan's device pick and a CPU device module -----------------------------------------


def _point_torchtitan_at(device_type: str, device_module) -> None:
    """torchtitan's `tools.utils` falls back to "cuda" when no accelerator is found, and the
    trainer then dies in torch._C._cuda_setDevice. Set torchtitan's module-level
    device_type/device_module, and the copies that modules already imported took
    (distributed/utils.py, components/metrics.py, ... copy them at import)."""
    from torchtitan.tools import utils

    old_type, old_module = utils.device_type, utils.device_module
    if old_type == device_type and old_module is device_module:
        return
    for module in _loaded_torchtitan_modules():
        if getattr(module, "device_type", None) is old_type:
            module.device_type = device_type
        if getattr(module, "device_module", None) is old_module:
            module.device_module = device_module


class _CpuDeviceModule(types.ModuleType):
    """`torch.cpu` plus the CUDA-style calls torchtitan makes on its device module."""

    def __getattr__(self, name: str):  # only reached for names not set on the instance
        return getattr(torch.cpu, name)


_cpu_module: _CpuDeviceModule | None = None


def _cpu_device_module() -> _CpuDeviceModule:
    """torchtitan's metrics (`components.metrics`) call get_device_name, get_device_properties,
    memory_stats, reset_peak_memory_stats and empty_cache, which torch.cpu lacks, and
    distributed/utils.py barrier(device_ids=[current_device()]) needs an int. Supply only what
    torch.cpu lacks; peak memory is the process's peak RSS."""
    global _cpu_module
    if _cpu_module is None:
        _cpu_module = _CpuDeviceModule("qwen3_neuron.devices.policy.cpu")
        for name, fallback in _CPU_MEMORY_API.items():
            if not hasattr(torch.cpu, name):
                setattr(_cpu_module, name, fallback)
        if not isinstance(torch.cpu.current_device(), int):
            _cpu_module.current_device = lambda: 0
    return _cpu_module


def _cpu_name(device=None) -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "CPU"


def _cpu_properties(device=None) -> types.SimpleNamespace:
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(name=_cpu_name(), total_memory=total_memory)


def _peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status: the peak resident set size of this process."""
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    return -1


def _memory_stats(device=None) -> dict[str, int]:
    peak = _peak_rss_bytes()
    return {
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.peak": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def _reset_peak_memory_stats(device=None) -> None:
    try:  # "5" resets VmHWM to the current RSS (proc(5), /proc/pid/clear_refs)
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass  # not permitted here: the peak then covers the whole run


_CPU_MEMORY_API: dict[str, Callable] = {
    "get_device_name": _cpu_name,
    "get_device_properties": _cpu_properties,
    "memory_stats": _memory_stats,
    "reset_peak_memory_stats": _reset_peak_memory_stats,
    "empty_cache": lambda: None,
}


# ---- torch.distributed.set_timeout -----------------------------------------------------------


def _add_set_timeout_fallback() -> None:
    """torchtitan's `distributed.utils` calls torch.distributed.set_timeout after step 1; torch
    2.13 has only the private distributed_c10d._set_pg_timeout, which does the same."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if hasattr(dist, "set_timeout") or not hasattr(distributed_c10d, "_set_pg_timeout"):
        return

    def set_timeout(timeout: timedelta, group=None) -> None:
        distributed_c10d._set_pg_timeout(timeout, group)

    dist.set_timeout = set_timeout


# ---- FSDP gradient reduction on gloo ---------------------------------------------------------


def _sum_fsdp_gradients_without_premul_sum() -> None:
    """torchtitan's `distributed.fsdp` sets gradient_divide_factor=1.0, so FSDP2 reduce-scatters
    with ReduceOp.PREMUL_SUM, which gloo rejects. Forcing plain SUM reductions afterwards is
    numerically identical (the factor is 1)."""
    if _gloo_supports_premul_sum():
        return
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import fsdp

    original = fsdp.disable_fsdp_gradient_division
    if getattr(original, "_qwen3_neuron_fix", False):
        return

    def disable_fsdp_gradient_division(model: torch.nn.Module) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_fsdp_gradient_division._qwen3_neuron_fix = True
    _replace_function(original, disable_fsdp_gradient_division)


def _gloo_supports_premul_sum() -> bool:
    """Probe: all-reduce with PREMUL_SUM on a private one-rank gloo group."""
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    options = dist.AllreduceOptions()
    try:
        options.reduceOp = dist.distributed_c10d._make_nccl_premul_sum(1.0)
        group.allreduce([torch.ones(1)], options).wait()
    except (RuntimeError, AttributeError):  # "Cannot use ReduceOp.PREMUL_SUM with Gloo"
        return False
    return True


# ---- FSDP mesh under the spmd_types backend --------------------------------------------------


def _use_plain_fsdp_mesh_without_spmd_types_support() -> None:
    """The default parallelism.spmd_backend="spmd_types" passes FSDP DataParallelMeshDims
    (torchtitan's `distributed.full_dtensor.resolve_fsdp_mesh`), which torch FSDP handles only once it has
    FSDPParam._resolve_spmd_types_for_storage (torch 2.14). When the storage mesh holds only
    data-parallel axes (no TP/CP), drop the dims: that mesh is then classic 1-D FSDP2 (2-D HSDP)."""
    if fsdp_takes_spmd_types():
        return
    from torchtitan.distributed import full_dtensor

    original = full_dtensor.resolve_fsdp_mesh
    if getattr(original, "_qwen3_neuron_fix", False):
        return

    def resolve_fsdp_mesh(parallel_dims):
        mesh, dp_mesh_dims = original(parallel_dims)
        if set(mesh.mesh_dim_names or ()) <= {"dp_replicate", "dp_shard"}:
            return mesh, None
        return mesh, dp_mesh_dims

    resolve_fsdp_mesh._qwen3_neuron_fix = True
    _replace_function(original, resolve_fsdp_mesh)


# ---- the HF backend's flex attention ---------------------------------------------------------


def _route_hf_flex_attention_to_sdpa() -> None:
    """The Transformers backend calls transformers' flex_attention_forward (torchtitan's
    `experiments.transformers_modeling_backend.model`), which cannot train on CPU.
    Replace it there with the SDPA version once that module is imported (importing it here
    would cost every native run the Transformers import)."""
    if _flex_attention_trains_on_cpu():
        return
    _after_import(_HF_BACKEND_MODEL, _use_hf_sdpa_attention)


def _use_hf_sdpa_attention(model_module: types.ModuleType) -> None:
    from qwen3_neuron.kernels.attention.sdpa import hf_sdpa_attention_forward

    model_module.flex_attention_forward = hf_sdpa_attention_forward


# ---- BlockMasks built without torch.compile -------------------------------------------------

_ATTENTION_MODULE = "torchtitan.models.common.attention"
_CP_ATTENTION_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"


def _build_block_masks_without_compiling() -> None:
    """torchtitan builds every BlockMask through `torch.compile(create_block_mask)`, and torch's
    context parallelism each rank's share of one through its own, which costs each worker seconds
    of Dynamo tracing before step 1 (and again for each new shape; on a machine with no Inductor
    cache yet, seconds more of C++ compiling). Where flex_attention cannot train, the SDPA attention
    (native and HF) only ever evaluates the mask's `mask_mod` densely, so the eager
    `create_block_mask` gives the same mask without the compile."""
    if _flex_attention_trains_on_cpu():
        return
    _after_import(_ATTENTION_MODULE, _use_eager_create_block_mask)
    _after_import(_CP_ATTENTION_MODULE, _use_eager_create_block_mask)


def _use_eager_create_block_mask(attention_module: types.ModuleType) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    # looked up on every call (context parallelism compiles it at its first, if still None)
    attention_module._compiled_create_block_mask = create_block_mask


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `patch(module)` right after `module_name` is executed by its normal loader."""

    def __init__(self, module_name: str, patch: Callable[[types.ModuleType], None]):
        self.module_name, self.patch = module_name, patch
        self._loader: importlib.abc.Loader | None = None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self.patch(module)


def _after_import(module_name: str, patch: Callable[[types.ModuleType], None]) -> None:
    if module_name in sys.modules:
        patch(sys.modules[module_name])
    elif not any(getattr(f, "module_name", None) == module_name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(module_name, patch))


# ---- helpers ---------------------------------------------------------------------------------


def _loaded_torchtitan_modules() -> list[types.ModuleType]:
    return [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "torchtitan" and m]


def _replace_function(original: Callable, replacement: Callable) -> None:
    """Rebind `original` in its own module and in every torchtitan module that imported it by
    name, so callers see `replacement` whichever was imported first."""
    replacement.__name__, replacement.__qualname__ = original.__name__, original.__qualname__
    replacement.__doc__ = original.__doc__
    sys.modules[original.__module__].__dict__[original.__name__] = replacement
    for module in _loaded_torchtitan_modules():
        if getattr(module, original.__name__, None) is original:
            setattr(module, original.__name__, replacement)
