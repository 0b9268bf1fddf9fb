"""FlexAttention replaced by `F.scaled_dot_product_attention` with a dense mask, for CPU training.

Why: `flex_attention` has no backward on CPU (torch raises "FlexAttention does not support
backward on CPU" as soon as an input requires grad), so neither torchtitan's native models nor
its Transformers backend can train there. Both keep building their flex `BlockMask`; this module
turns it into a dense boolean mask (eagerly once per mask object; in a compiled graph, in the
graph) and runs SDPA, which has a CPU backward.

- `sdpa_for_flex` is a torchtitan `@override` of `FlexAttention.Config` (native Qwen3 / MoE),
  activated by listing `qwen3_neuron.kernels.attention.sdpa.sdpa_for_flex` in
  `override.imports` (`devices.override_imports("cpu", "native")` returns it).
- `hf_sdpa_attention_forward` stands in for Transformers' `flex_attention_forward` in
  torchtitan's HF backend; `devices.install("cpu")` swaps it in.

Masks are assumed to be built from their `mask_mod` (`create_block_mask`), as every torchtitan
mask is: the dense mask is `mask_mod` evaluated everywhere. GQA works as in FlexAttention:
`enable_gqa` lets each group of query heads share one key/value head.

Shapes: B batch, L sequence, N heads, H head dim, Q/K query/key lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_mask
from torchtitan.config import derive, override
from torchtitan.models.common.attention import FlexAttention

# One entry: every layer of a step gets the same BlockMask object, so the dense mask is built
# once per step. Holding the mask itself (not its id) means a new mask can never match by accident.
_last_dense_mask: tuple[BlockMask, torch.Tensor] | None = None


def dense_mask(block_mask: BlockMask) -> torch.Tensor:
    """The boolean (B, 1 or N, Q, K) mask, True where a query may attend to a key.

    Inside a compiled graph (torchtitan compiles each block) the mask is computed in the graph
    and never cached: Dynamo would trace the cache hit once and keep returning that step's
    mask, a stale one for every later batch (compiled losses drifted from eager from step 2)."""
    global _last_dense_mask
    compiling = torch.compiler.is_compiling()
    if not compiling and _last_dense_mask is not None and _last_dense_mask[0] is block_mask:
        return _last_dense_mask[1]
    batch, heads = block_mask.shape[:2]
    q_len, kv_len = block_mask.seq_lengths
    device = block_mask.kv_num_blocks.device
    mask_BNQK = create_mask(block_mask.mask_mod, batch, heads, q_len, kv_len, device=device)
    if not compiling:
        _last_dense_mask = (block_mask, mask_BNQK)
    return mask_BNQK


class SDPAFlexAttention(FlexAttention):
    """FlexAttention's interface and config, computed by SDPA on the dense mask."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        # Subclasses FlexAttention.Config so torchtitan still builds the BlockMask for us
        # (isinstance checks in models/common/decoder.py and trainer.py).
        pass

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
                "sdpa_for_flex supports mask_mod only; score_mod and out_transform (attention "
                "sinks, LSE outputs) need flex_attention itself."
            )
        return sdpa_on_block_mask(q_BLNH, k_BLNH, v_BLNH, attention_masks, scale=scale, enable_gqa=enable_gqa)


def sdpa_on_block_mask(
    q_BLNH: torch.Tensor,
    k_BLNH: torch.Tensor,
    v_BLNH: torch.Tensor,
    attention_masks: BlockMask,
    *,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """What flex_attention computes for a mask_mod-only BlockMask, through SDPA."""
    out_BNLH = F.scaled_dot_product_attention(
        q_BLNH.transpose(1, 2),
        k_BLNH.transpose(1, 2),
        v_BLNH.transpose(1, 2),
        attn_mask=dense_mask(attention_masks),
        scale=scale,
        enable_gqa=enable_gqa,
    )
    return out_BNLH.transpose(1, 2)


@override(
    target=FlexAttention.Config,
    description="SDPA on a dense mask instead of flex_attention (no flex backward on CPU)",
)
def sdpa_for_flex(config: FlexAttention.Config) -> SDPAFlexAttention.Config:
    return derive(config, SDPAFlexAttention.Config)


def hf_sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """Drop-in for transformers' `flex_attention_forward`: (B, N, L, H) in, ((B, L, N, H), None) out.

    Delegates to Transformers' own SDPA path (GQA, scaling, dropout) with the mask made dense.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.pop("s_aux", None) is not None:
        raise NotImplementedError("attention sinks (s_aux) need flex_attention itself")
    if isinstance(attention_mask, BlockMask):
        attention_mask = dense_mask(attention_mask)
    elif attention_mask is not None:  # a dense additive mask (DeepSeek sparse attention models)
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
