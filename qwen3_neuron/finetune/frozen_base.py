"""Worker side of finetune=lora: keep the frozen base frozen through torchtitan's parallelisation.

torchtitan 0.3.0's `Module._spmd_distribute_state` (protocols/module.py, the default
`parallelism.spmd_backend=spmd_types`) re-registers every parameter as `nn.Parameter(tensor)`,
which sets `requires_grad=True`: the base weights LoRAConverter froze become trainable again and
go into the optimizer (measured: 78 parameter tensors in AdamW instead of the 40 adapters, and a
base that moved). Its `partial_dtensor` branch passes `requires_grad=param.requires_grad`.
Wrapping the method to put back each parameter's flag does what that branch does, on both
backends, and changes nothing where the flag already survives. model=hf takes the same path: the
backend turns every Transformers module into such a `Module` before distributing it.
"""

from __future__ import annotations

_WRAPPED = "_qwen3_neuron_keeps_requires_grad"


def keep_requires_grad_through_distribution() -> None:
    """Install the wrapper (idempotent). Call before the trainer parallelises the model."""
    from torchtitan.protocols.module import Module

    original = Module._spmd_distribute_state
    if getattr(original, _WRAPPED, False):
        return

    def distribute_keeping_requires_grad(self, parallel_dims, name, tensor, layout, *, is_param):
        requires_grad = tensor.requires_grad
        original(self, parallel_dims, name, tensor, layout, is_param=is_param)
        if is_param:
            self._parameters[name].requires_grad_(requires_grad)

    setattr(distribute_keeping_requires_grad, _WRAPPED, True)
    Module._spmd_distribute_state = distribute_keeping_requires_grad
