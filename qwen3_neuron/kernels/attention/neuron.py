"""FlexAttention computed by SDPA on Neuron, so `compile.backend=neuron` can compile the model.

Why: torchtitan 0.3.0 runs FlexAttention through a class-level `torch.compile(flex_attention)`
with inductor options (models/common/attention.py), and refuses any other compile backend for a
model holding FlexAttention modules: `distributed/compile.py` `_maybe_regional_inductor_backend`
raises "Model uses FlexAttention but compile backend 'neuron' is neither 'inductor' nor
'aot_eager'". TorchNeuron's `backend="neuron"` lowers through StableHLO and neuronx-cc, not
inductor, so on Neuron the attention must not be FlexAttention.

`sdpa_for_neuron` (an `@override` of `FlexAttention.Config`, listed by
`devices.override_imports("neuron", ...)`) swaps in `NeuronSDPAAttention`:
- its Config subclasses `FlexAttention.Config`, so torchtitan still builds the causal +
  packed-document BlockMask for it (trainer.py, models/common/decoder.py isinstance checks);
- its module is *not* a `FlexAttention`, so torchtitan compiles the blocks with the configured
  backend (`neuron`) instead of refusing;
- forward is `F.scaled_dot_product_attention` (an ATen op TorchNeuron implements) on the dense
  mask of that BlockMask, the same computation as the CPU stand-in in `sdpa.py`.

Checked here on CPU (same outputs as FlexAttention, tests/test_parallelism.py); not run on a
Neuron device from this project.

Shapes: B batch, L sequence, N heads, H head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask
from torchtitan.config import derive, override
from torchtitan.models.common.attention import FlexAttention
from torchtitan.protocols.module import Module

from qwen3_neuron.kernels.attention.sdpa import sdpa_on_block_mask


class NeuronSDPAAttention(Module):
    """FlexAttention's interface and config; SDPA with a dense mask; not a FlexAttention module."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        # a FlexAttention.Config, so torchtitan keeps building the BlockMask this layer reads
        pass

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: BlockMask,
        score_mod=None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform=None,
        **kwargs,
    ) -> torch.Tensor:
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError(
                "sdpa_for_neuron supports mask_mod only; score_mod and out_transform (attention "
                "sinks, LSE outputs) need flex_attention, which Neuron does not compile."
            )
        return sdpa_on_block_mask(q_BLNH, k_BLNH, v_BLNH, attention_masks, scale=scale, enable_gqa=enable_gqa)


@override(
    target=FlexAttention.Config,
    description="SDPA on a dense mask instead of flex_attention (Neuron compiles no FlexAttention)",
)
def sdpa_for_neuron(config: FlexAttention.Config) -> NeuronSDPAAttention.Config:
    return derive(config, NeuronSDPAAttention.Config)
