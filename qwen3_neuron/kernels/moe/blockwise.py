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
- Like torchtitan, the matmuls run in bf16 whatever the input dtype (`compute_dtype=float32`:
  in float32), and the output has the input's dtype.
- The parameters are torchtitan's own (`w1_EFD`, `w2_EDF`, `w3_EFD`, same shapes, same init,
  same sharding): state dicts, checkpoints and HF export do not change.

The algorithm (see `block_layout.py` for the layout):
1. gather: copy the rows into fixed-size blocks, one expert per block, padding = zero rows;
2. per block: gate/up matmul -> silu(gate) * up -> down matmul, batched over blocks with
   `torch.bmm` on the weights gathered per block (`w[block_to_expert]`, cast to bf16 once per
   expert before the gather);
3. scatter: copy each block row back to its routed row; padding rows are dropped.

Step 2 is a `torch.autograd.Function` with a hand-written backward (`_BlockSwiGLU`), so that all
six matmuls (two forward, four backward; gate and up fused) take their operands stored
contraction dimension first -- the NKI kernel's layout, and the one torch's CPU bf16 matmul is
fast on (12-22x over row-major operands on this project's CPU; see `_bmm_k_major`). Steps
1 and 3 are plain autograd.

Cost, against torchtitan's `GroupedExperts` (`bench/moe_experts.py`): the matmuls run on the
static number of blocks, the worst case over routings (`max_num_blocks`): with 128-row blocks,
1.22x the routed rows at tiny_moe's shape, 1.49x at debugmodel_moe's (64 experts); plus G
copies of the expert weights (G = number of blocks) and the fp32 sum of their gradients. The
NKI kernel reads the weights in place instead. Measured on 2 shared CPU cores (torch 2.13,
1 thread, fwd+bwd medians of 5 interleaved repeats, three runs): blockwise / grouped_mm =
0.19-0.21x at tiny_moe's shape, 0.25-0.31x at debugmodel_moe's; before the contraction-first
layout 1.25x and 1.50x. Both sides pay CPU bf16 matmul costs that depend on layout; on a GPU,
where layout matters little, the padding factor and the weight copies above set the ratio (not
measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
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
    """SwiGLU of every block with its expert's weights: (G, S, D) -> (G, S, D), in x's dtype.

    Differentiable in x and the weights (`_BlockSwiGLU`: an explicit backward). Each expert's
    per-block weight gradients are summed in the weights' own dtype (fp32 params: fp32 sums,
    as torchtitan's grouped matmul accumulates).
    """
    return _BlockSwiGLU.apply(x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD)


def _bmm_k_major(aT_GKM: torch.Tensor, b_GKN: torch.Tensor) -> torch.Tensor:
    """(G, M, N) = a @ b with both operands stored contraction dimension first.

    Every matmul of the block SwiGLU goes through here, its operands laid out so (G, K, M) and
    (G, K, N) are contiguous -- the layout the NKI kernel also takes (contraction on the
    partitions). It is the fast one for CPU bf16 matmuls: torch 2.13's CPU bf16 bmm ran 12-22x
    faster on it than on row-major (G, M, K) @ (G, K, N) (one thread of a 2-core AMD EPYC
    without AVX-512 BF16, blocks of 128 rows, K and N in 128..1536); GPUs take any layout.
    """
    return torch.bmm(aT_GKM.transpose(1, 2), b_GKN)


def _k_major(t_GMK: torch.Tensor) -> torch.Tensor:
    """The same (G, M, K) values stored (G, K, M): one copy, cheap next to the matmuls."""
    return t_GMK.transpose(1, 2).contiguous()


class _BlockSwiGLU(torch.autograd.Function):
    """Per-block SwiGLU with a hand-written backward, so that the four backward matmuls also
    get contraction-first operands (autograd's bmm backward would hand them row-major ones).
    Differentiable once (no double backward), as torchtitan's grouped experts are trained.

    Layout: hidden activations are kept hidden-dim first, `(G, F, S)`, which is what both the
    down projection (contracting F) and the input gradient (contracting 2F) want.
    """

    @staticmethod
    def forward(ctx, x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD):
        dtype = x_GSD.dtype
        # Weights cast to the compute dtype once per expert (E copies), then gathered per block.
        w13_E2FD = torch.cat([w1_EFD, w3_EFD], dim=1).to(dtype)
        w2_EDF_c = w2_EDF.to(dtype)
        w13T_GD2F = _k_major(w13_E2FD).index_select(0, block_to_expert_G)
        w2T_GFD = _k_major(w2_EDF_c).index_select(0, block_to_expert_G)

        # gate_upT (G, 2F, S) = w13 @ x^T, contracting D.
        gate_upT_G2FS = _bmm_k_major(w13T_GD2F, _k_major(x_GSD))
        gateT_GFS, upT_GFS = gate_upT_G2FS.chunk(2, dim=1)
        silu_gateT_GFS = F.silu(gateT_GFS)
        hT_GFS = silu_gateT_GFS * upT_GFS
        # y (G, S, D) = h @ w2^T, contracting F.
        y_GSD = _bmm_k_major(hT_GFS, w2T_GFD)

        ctx.save_for_backward(
            x_GSD, block_to_expert_G, w13_E2FD, w2_EDF_c, gate_upT_G2FS, silu_gateT_GFS, hT_GFS
        )
        ctx.weight_dtypes = (w1_EFD.dtype, w2_EDF.dtype, w3_EFD.dtype)
        return y_GSD

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y_GSD):
        x_GSD, block_to_expert_G, w13_E2FD, w2_EDF, gate_upT_G2FS, silu_gateT_GFS, hT_GFS = (
            ctx.saved_tensors
        )
        dtype1, dtype2, dtype3 = ctx.weight_dtypes
        need_x, _, need_w1, need_w2, need_w3 = ctx.needs_input_grad
        grad_y_GSD = grad_y_GSD.to(x_GSD.dtype)
        gateT_GFS, upT_GFS = gate_upT_G2FS.chunk(2, dim=1)

        # grad_hT (G, F, S) = w2^T @ grad_y^T, contracting D.
        w2_GDF = w2_EDF.index_select(0, block_to_expert_G)
        grad_hT_GFS = _bmm_k_major(w2_GDF, _k_major(grad_y_GSD))
        # silu(gate) * up, backward: the same ops autograd runs for it.
        grad_gateT_GFS = torch.ops.aten.silu_backward(grad_hT_GFS * upT_GFS, gateT_GFS)
        grad_upT_GFS = grad_hT_GFS * silu_gateT_GFS
        grad_gate_upT_G2FS = torch.cat([grad_gateT_GFS, grad_upT_GFS], dim=1)

        grad_x_GSD = grad_w1 = grad_w2 = grad_w3 = None
        if need_x:
            # grad_x (G, S, D) = grad_gate_up @ w13, contracting 2F.
            w13_G2FD = w13_E2FD.index_select(0, block_to_expert_G)
            grad_x_GSD = _bmm_k_major(grad_gate_upT_G2FS, w13_G2FD)
        if need_w2:
            # grad_w2 per block (G, D, F) = grad_y^T @ h, contracting S.
            grad_w2_GDF = _bmm_k_major(grad_y_GSD, _k_major(hT_GFS))
            grad_w2 = _sum_per_expert(grad_w2_GDF, block_to_expert_G, w2_EDF.shape[0], dtype2)
        if need_w1 or need_w3:
            # grad_w13 per block (G, 2F, D) = grad_gate_up^T @ x, contracting S.
            grad_w13_G2FD = _bmm_k_major(_k_major(grad_gate_upT_G2FS), x_GSD)
            num_experts = w13_E2FD.shape[0]
            grad_w1_GFD, grad_w3_GFD = grad_w13_G2FD.chunk(2, dim=1)
            if need_w1:
                grad_w1 = _sum_per_expert(grad_w1_GFD, block_to_expert_G, num_experts, dtype1)
            if need_w3:
                grad_w3 = _sum_per_expert(grad_w3_GFD, block_to_expert_G, num_experts, dtype3)
        return grad_x_GSD, None, grad_w1, grad_w2, grad_w3


def _sum_per_expert(grad_G, block_to_expert_G, num_experts, dtype):
    """Per-block weight gradients (G, ...) summed into their experts' (E, ...), in `dtype`."""
    out_E = grad_G.new_zeros((num_experts, *grad_G.shape[1:]), dtype=dtype)
    return out_E.index_add_(0, block_to_expert_G, grad_G.to(dtype))


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

        compute_dtype: str = "bfloat16"
        """dtype of the matmuls, a torch dtype name: bfloat16 as torchtitan's experts and the NKI
        kernel; float32 to compare with a float32 reference to float32's rounding."""

        def __post_init__(self) -> None:
            if self.block_size < 1:
                raise ValueError(f"block_size must be >= 1, got {self.block_size}")
            if not isinstance(getattr(torch, self.compute_dtype, None), torch.dtype):
                raise ValueError(f"compute_dtype {self.compute_dtype!r} is not a torch dtype")

    def __init__(self, config: Config):
        super().__init__(config)
        self.block_size = config.block_size
        self.compute_dtype = getattr(torch, config.compute_dtype)

    def forward(
        self,
        x_RD: torch.Tensor,
        num_tokens_per_expert_E: torch.Tensor,
    ) -> torch.Tensor:
        w1_EFD, w2_EDF, w3_EFD = self._local_weights()
        # matmuls in compute_dtype (bf16 as GroupedExperts) whatever the input dtype, output in the input's
        return blockwise_swiglu(
            x_RD.to(self.compute_dtype),
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
    cfg: GroupedExperts.Config, *, block_size: int = DEFAULT_BLOCK_SIZE, compute_dtype: str = "bfloat16"
) -> BlockwiseGroupedExperts.Config:
    return derive(cfg, BlockwiseGroupedExperts.Config, block_size=block_size, compute_dtype=compute_dtype)
