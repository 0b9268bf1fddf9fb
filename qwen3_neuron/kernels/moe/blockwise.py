"""Blockwise MoE experts in plain torch: the NKI MoE algorithm, runnable on any device.

Activate with `override.imports=["qwen3_neuron.kernels.moe.blockwise.blockwise_experts"]`
(`kernels=blockwise` in this project). It replaces torchtitan's `GroupedExperts` (the
`moe.routed_experts.inner_experts` node of every MoE layer) and keeps its contract:

    forward(x_RD, num_tokens_per_expert_E) -> out_RD

- `x_RD`: the routed rows, already grouped by expert by torchtitan's token dispatcher
  (expert 0's rows first); `num_tokens_per_expert_E[e]` rows belong to expert e and their sum
  is at most R (rows past it are padding; their output is zero).
- `out_RD[r] = w2[e] @ (silu(w1[e] @ x[r]) * (w3[e] @ x[r]))` for the expert e owning row r.
- Routing scores are NOT applied here: the dispatcher's `combine` multiplies by them and
  scatter-adds the rows back to tokens. Neither module takes the scores.
- Like torchtitan, the matmuls run in bf16 whatever the input dtype, and the output has the
  input's dtype.
- The parameters are torchtitan's own (`w1_EFD`, `w2_EDF`, `w3_EFD`, same shapes, same init,
  same sharding): state dicts, checkpoints and HF export do not change.

The algorithm (see `block_layout.py` for the layout):
1. gather: copy the rows into fixed-size blocks, one expert per block, padding = zero rows;
2. per block: gate/up matmul -> silu(gate) * up -> down matmul, batched over blocks with
   `torch.bmm` on the weights gathered per block (`w[block_to_expert]`);
3. scatter: copy each block row back to its routed row; padding rows are dropped.

Forward and backward are plain autograd. The per-block weight gather costs G copies of the
expert weights (G = number of blocks); that is the price of a batched reference. The NKI kernel
reads the weights in place instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts

from qwen3_neuron.kernels.moe.block_layout import build_block_layout

__all__ = [
    "BlockwiseGroupedExperts",
    "blockwise_experts",
    "blockwise_swiglu",
    "torch_block_mlp",
]

# Shape suffixes: as in block_layout.py (R rows, E experts, D dim, F hidden, G blocks,
# S block size).

DEFAULT_BLOCK_SIZE = 128
"""128 rows per block: the Trainium tensor engine's tile height (128 partitions), so a block
is exactly one matmul tile for the NKI kernel, and the reference cuts the same blocks as the
kernel it is the oracle for. Smaller blocks waste less padding (each expert pads its last block,
on average S / 2 rows) but give the hardware smaller matmuls."""


def torch_block_mlp(
    x_GSD: torch.Tensor,
    block_to_expert_G: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU of every block with its expert's weights: (G, S, D) -> (G, S, D).

    The weights are gathered per block in their own dtype and only then cast to `x_GSD`'s:
    the backward of the gather sums each expert's per-block gradients in the weights' dtype
    (fp32 params: fp32 sums, as torchtitan's grouped matmul accumulates).
    """
    dtype = x_GSD.dtype
    # Gate and up in one matmul, chunked apart after. The weights are transposed (one copy
    # per expert) before the per-block gather, so that gather, the matmuls and the gradient
    # scatter all see contiguous tensors: on CPU, index_select / index_add on strided tensors
    # are many times slower.
    w13T_ED2F = torch.cat([w1_EFD, w3_EFD], dim=1).transpose(1, 2).contiguous()
    w13T_GD2F = w13T_ED2F.index_select(0, block_to_expert_G).to(dtype)
    gate_up_GS2F = torch.bmm(x_GSD, w13T_GD2F)
    gate_GSF, up_GSF = gate_up_GS2F.chunk(2, dim=-1)
    h_GSF = F.silu(gate_GSF) * up_GSF
    w2T_EFD = w2_EDF.transpose(1, 2).contiguous()
    w2T_GFD = w2T_EFD.index_select(0, block_to_expert_G).to(dtype)
    return torch.bmm(h_GSF, w2T_GFD)


def blockwise_swiglu(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
    *,
    block_size: int,
    block_mlp=torch_block_mlp,
) -> torch.Tensor:
    """Experts' SwiGLU on rows grouped by expert, computed block by block; keeps x's dtype.

    `block_mlp(x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD) -> y_GSD` does the per-block
    matmuls (`torch_block_mlp` here, the NKI kernel in `nki.py`). Padding rows are zero
    and a SwiGLU without biases maps zero to zero, so padding contributes nothing anywhere.
    """
    R, D = x_RD.shape
    layout = build_block_layout(
        num_tokens_per_expert_E, num_rows=R, block_size=block_size
    )
    G, S = layout.num_blocks, layout.block_size
    position_to_row_P = layout.token_position_to_id_P

    # Gather: row R of the padded input is the zero row that padding positions read.
    x_padded_RD = torch.cat([x_RD, x_RD.new_zeros(1, D)])
    x_GSD = x_padded_RD.index_select(0, position_to_row_P).view(G, S, D)

    y_GSD = block_mlp(x_GSD, layout.block_to_expert_G, w1_EFD, w2_EDF, w3_EFD)

    # Scatter: every real row receives exactly one block row; all padding lands on row R,
    # which is dropped.
    out_padded_RD = y_GSD.new_zeros(R + 1, D).index_add(
        0, position_to_row_P, y_GSD.reshape(G * S, D)
    )
    return out_padded_RD[:R]


class BlockwiseGroupedExperts(GroupedExperts):
    """torchtitan's `GroupedExperts` (same parameters) computed block by block in torch."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        block_size: int = DEFAULT_BLOCK_SIZE
        """Rows per block (S). Each expert's rows are padded up to a multiple of it."""

        def __post_init__(self) -> None:
            if self.block_size < 1:
                raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def __init__(self, config: Config):
        super().__init__(config)
        self.block_size = config.block_size

    def forward(
        self,
        x_RD: torch.Tensor,
        num_tokens_per_expert_E: torch.Tensor,
    ) -> torch.Tensor:
        w1_EFD, w2_EDF, w3_EFD = self._local_weights()
        # bf16 matmuls whatever the input dtype, output in the input's dtype: as GroupedExperts.
        return blockwise_swiglu(
            x_RD.bfloat16(),
            num_tokens_per_expert_E,
            w1_EFD,
            w2_EDF,
            w3_EFD,
            block_size=self.block_size,
            block_mlp=self._block_mlp,
        ).type_as(x_RD)

    def _block_mlp(
        self,
        x_GSD: torch.Tensor,
        block_to_expert_G: torch.Tensor,
        w1_EFD: torch.Tensor,
        w2_EDF: torch.Tensor,
        w3_EFD: torch.Tensor,
    ) -> torch.Tensor:
        """Per-block matmuls; the seam the NKI subclass replaces."""
        return torch_block_mlp(x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD)

    def _local_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Plain local tensors of the weights (EP/TP hand DTensors; the rows are local)."""
        weights = (self.w1_EFD, self.w2_EDF, self.w3_EFD)
        return tuple(w.to_local() if isinstance(w, DTensor) else w for w in weights)


@override(
    target=GroupedExperts.Config,
    exact=True,  # subclasses (gpt-oss biases, other kernels) have other contracts
    description="Blockwise MoE experts in plain torch (the NKI algorithm; any device).",
)
def blockwise_experts(
    cfg: GroupedExperts.Config, *, block_size: int = DEFAULT_BLOCK_SIZE
) -> BlockwiseGroupedExperts.Config:
    return derive(cfg, BlockwiseGroupedExperts.Config, block_size=block_size)
