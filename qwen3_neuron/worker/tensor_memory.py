"""The tensor memory a rank really used, measured inside the worker: `<run dir>/tensor_memory.json`.

What is measured is what the plan's memory estimate (qwen3_neuron.job.checks.memory) predicts, so the
two can be compared run by run:

    tensor memory = local parameters + local gradients + optimizer states   (their real sizes)
                  + the peak of the bytes autograd holds for backward        (activations)

- The static parts are the local sizes of the tensors after training: a DTensor (FSDP, TP)
  counts its local shard only.
- Activations: every tensor autograd saves for backward passes through
  `torch.autograd.graph.saved_tensors_hooks` while one of the first `MEASURED_STEPS` training
  steps runs (every step has the same shapes; the hooks' Python per saved tensor would cost
  every later step its time, and a compiled step its graph). Each storage counts
  once (views of one storage share it) until autograd lets go of the last tensor that holds it
  (the packed object is dropped when backward has used it). Parameters are left out: they are
  counted above, and FSDP's unsharded copies of them are freed after each layer's forward.
  torch's checkpoint (activation_checkpoint.*) saves its blocks' inputs through the same hooks;
  what it recomputes in backward is held under checkpoint's own hooks and is not seen here.
- On CUDA the allocator's own peak (`torch.cuda.max_memory_allocated`) is the measured total
  instead; the parts are recorded as well.

Only rank 0 writes the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from qwen3_neuron.run_dir import TENSOR_MEMORY_FILE, write_json

GIB = 2**30
MEASURED_STEPS = 2  # forward_backward_step calls: a microbatch each, all of one shape


class SavedTensorMeter:
    """Bytes autograd holds for backward, deduplicated by storage; `peak_bytes` is their peak."""

    def __init__(self) -> None:
        self.live: dict[tuple, list[int]] = {}  # storage key -> [holders, bytes]
        self.current_bytes = 0
        self.peak_bytes = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor):
        if isinstance(tensor._base if tensor._base is not None else tensor, torch.nn.Parameter):
            return tensor  # a weight or a view of one: counted as a parameter (FSDP's unsharded
            # copies, bf16 under mixed precision, are freed after each layer's forward)
        storage = _local(tensor).untyped_storage()
        if storage.nbytes() == 0:
            return tensor
        key = (storage.device, storage.data_ptr())
        entry = self.live.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.current_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[0] += 1
        return _Held(tensor, key, self)

    def _release(self, key: tuple) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.current_bytes -= entry[1]
            del self.live[key]


class _Held:
    """What autograd keeps instead of the tensor: dropped when backward no longer needs it."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, key: tuple, meter: SavedTensorMeter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self) -> None:
        self.meter._release(self.key)


def _unpack(packed):
    return packed.tensor if isinstance(packed, _Held) else packed


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor that holds the bytes: a DTensor's local shard, and inside it what a
    wrapper subclass wraps (TP's outputs can be an AsyncCollectiveTensor, whose own storage is
    not real). Attribute reads only: no autograd op may run inside a hook."""
    while hasattr(type(tensor), "__tensor_flatten__"):
        inner_names, _ = tensor.__tensor_flatten__()
        tensor = getattr(tensor, inner_names[0])
    return tensor


def measure_training(trainer) -> SavedTensorMeter:
    """Count what the trainer's first steps save for backward; later steps run untouched."""
    meter = SavedTensorMeter()
    step = trainer.forward_backward_step
    calls = 0

    def measured_step(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == MEASURED_STEPS:
            trainer.forward_backward_step = step  # the next calls go straight to torchtitan's
        with meter.hooks():
            return step(*args, **kwargs)

    trainer.forward_backward_step = measured_step
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainer.device)
    return meter


def write_measurement(trainer, meter: SavedTensorMeter, run_dir: Path) -> None:
    """After training: the static parts' local sizes + the activations' peak, on rank 0."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    parameters = [p for part in trainer.model_parts for p in part.parameters()]
    states = [
        value for optimizer in trainer.optimizers.optimizers for state in optimizer.state.values()
        for value in state.values() if isinstance(value, torch.Tensor)
    ]  # fmt: skip
    parts = {
        "parameters_gib": _gib(parameters),
        "gradients_gib": _gib([p.grad for p in parameters if p.grad is not None]),
        "optimizer_gib": _gib(states),
        "activations_gib": meter.peak_bytes / GIB,
    }
    if trainer.device.type == "cuda":
        measured, method = torch.cuda.max_memory_allocated(trainer.device) / GIB, "torch.cuda.max_memory_allocated"
    else:
        measured, method = sum(parts.values()), "local tensor sizes + peak of saved-for-backward bytes"
    write_json(run_dir / TENSOR_MEMORY_FILE, {"tensor_memory_gib": measured, "method": method, **parts})


def _gib(tensors: list[torch.Tensor]) -> float:
    """Local bytes, each storage once (a tied weight is one tensor)."""
    storages = {}
    for tensor in tensors:
        storage = _local(tensor).untyped_storage()
        storages[(storage.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values()) / GIB
