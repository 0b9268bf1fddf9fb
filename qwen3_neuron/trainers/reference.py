"""The reference model that DPO's and GRPO's objectives hold the policy to.

finetune=lora: the same model with every adapter's output scaled by 0 (`adapters_off`), under
no_grad: no second copy of the weights. finetune=full: a frozen copy of the starting weights
(`FrozenReference`: each rank copies its own shards once torchtitan has loaded them, at the first
step), swapped into the model's parameters in place for the reference forward and back after
it, so FSDP gathers them as it gathers the policy's; the copy is a checkpoint state, so a resumed
run keeps the reference it started with.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor


@contextmanager
def adapters_off(model: torch.nn.Module):
    """The model as it was before LoRA: every LoRALinear's adapter output scaled by 0."""
    layers = [m for m in model.modules() if hasattr(m, "lora_a") and hasattr(m, "_lora_scaling")]
    scalings = [m._lora_scaling for m in layers]
    for layer in layers:
        layer._lora_scaling = 0.0
    try:
        yield
    finally:
        for layer, scaling in zip(layers, scalings):
            layer._lora_scaling = scaling


class FrozenReference(Stateful):
    """finetune=full: the starting weights, kept beside the model's parameters (local shards)."""

    def __init__(self, model: torch.nn.Module):
        self.parameters = list(model.parameters())
        with torch.no_grad():  # allocated now, so that a checkpoint load has tensors to load into
            self.copies = [p.detach().clone() for p in self.parameters]
        self.taken = torch.zeros((), dtype=torch.int64)

    def take(self) -> None:
        """Copy the weights as they are now (call after torchtitan's initial load)."""
        with torch.no_grad():
            for parameter, copy in zip(self.parameters, self.copies):
                _local(copy).copy_(_local(parameter))
        self.taken.fill_(1)

    @contextmanager
    def swapped_in(self):
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def _swap(self) -> None:
        with torch.no_grad():
            for parameter, copy in zip(self.parameters, self.copies):
                current, frozen = _local(parameter), _local(copy)
                held = current.clone()  # one parameter at a time
                current.copy_(frozen)
                frozen.copy_(held)

    def state_dict(self) -> dict:
        return {"taken": self.taken, **{f"weight_{i}": copy for i, copy in enumerate(self.copies)}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.taken.copy_(state_dict["taken"])
        for i, copy in enumerate(self.copies):
            loaded = state_dict[f"weight_{i}"]
            if loaded is not copy:
                _local(copy).copy_(_local(loaded))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
