"""GRPO's generation with a KV cache: after the prompts' one forward, each sampled token is one
forward of that token alone, its keys and values kept for the next.

A batch's layout: its prompts, right-padded to the longest (`prompt_width` columns), then one
column per generated token, the same column for every row. A row's query attends to its own
prompt and to the generated columns up to its own; its RoPE position is its prompt length plus
the tokens sampled so far, so a row sees exactly the sequence it would see alone.

- torchtitan's own models (model=native, model=moe): each `GQAttention` of the model runs
  `_cached_attention` in place of its forward for the duration (its projections, q/k norms and
  RoPE are its own, so LoRA adapters and FSDP's gathers work as in training); keys and values go
  to a [batch, columns, kv heads, head dim] buffer per layer.
- torchtitan's Transformers backend (model=hf): Transformers' own `DynamicCache`, its attention
  switched to SDPA for the duration (torchtitan routes it to flex attention, which takes a block
  mask built for whole sequences).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import GQAttention

from qwen3_neuron.finetune.logprobs import hidden_states_out

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention_mask(prompt_lengths: torch.Tensor, prompt_width: int, first_column: int, queries: int) -> torch.Tensor:
    """[B, queries, first_column + queries] bool: whether a query may attend to a cached column.
    Query q sits at column `first_column + q`; it sees the columns up to its own, except the
    padding between its row's prompt and `prompt_width`."""
    columns = torch.arange(first_column + queries, device=prompt_lengths.device)
    own = first_column + torch.arange(queries, device=prompt_lengths.device)
    causal = columns.unsqueeze(0) <= own.unsqueeze(1)  # [queries, columns]
    content = (columns.unsqueeze(0) < prompt_lengths.unsqueeze(1)) | (columns >= prompt_width)  # [B, columns]
    return causal.unsqueeze(0) & content.unsqueeze(1)


@contextmanager
def kv_cache(model: torch.nn.Module, hf_backend: bool, columns: int) -> Iterator[Forward]:
    """A forward `(tokens [B, L], positions [B, L], mask [B, L, K]) -> hidden states [B, L, D]`
    over `model`, which caches each call's keys and values for the next; `mask` is
    `attention_mask`'s, the L tokens taking the columns K - L .. K - 1. At most `columns` columns."""
    with hidden_states_out(model):
        if hf_backend:
            with _hf_cache(model) as forward:
                yield forward
        else:
            with _native_cache(model, columns) as forward:
                yield forward


@contextmanager
def _native_cache(model: torch.nn.Module, columns: int) -> Iterator[Forward]:
    attentions = [module for module in model.modules() if isinstance(module, GQAttention)]
    for attention in attentions:
        attention.forward = partial(_cached_attention, attention, {"columns": columns})
    try:
        # the mask rides in the model's `attention_masks`, which torchtitan hands each block's attention
        yield lambda tokens, positions, mask: model(tokens, positions=positions, attention_masks=mask)
    finally:
        for attention in attentions:
            del attention.forward  # the class's forward again


def _cached_attention(attention: GQAttention, cache: dict, x: torch.Tensor, mask: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """`GQAttention.forward` for the tokens of columns K - L .. K - 1 (mask [B, L, K]), its keys
    and values written to `cache` and attending to all of the cache's first K columns."""
    q, k, v = attention.qkv_linear(x)  # [B, L, heads, head dim]
    if attention.q_norm is not None:
        q, k = attention.q_norm(q), attention.k_norm(k)
    q, k = attention.rope(q, k, positions)
    end = mask.shape[-1]
    start = end - x.shape[1]
    if "keys" not in cache:
        cache["keys"] = k.new_zeros(k.shape[0], cache["columns"], *k.shape[2:])
        cache["values"] = v.new_zeros(v.shape[0], cache["columns"], *v.shape[2:])
    cache["keys"][:, start:end] = k
    cache["values"][:, start:end] = v
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), cache["keys"][:, :end].transpose(1, 2), cache["values"][:, :end].transpose(1, 2),
        attn_mask=mask.unsqueeze(1), scale=attention.scaling, enable_gqa=attention.enable_gqa,
    )  # fmt: skip
    return attention.wo(out.transpose(1, 2).flatten(2))


@contextmanager
def _hf_cache(model: torch.nn.Module) -> Iterator[Forward]:
    from transformers import DynamicCache

    config = model.model.config
    implementation = config._attn_implementation
    config._attn_implementation = "sdpa"
    cache = DynamicCache()
    try:
        # torchtitan's backend passes `positions` as Transformers' position_ids, `attention_masks`
        # as its attention_mask (a 4-D mask is used as it is) and the rest to the HF model
        yield lambda tokens, positions, mask: model(
            tokens, positions=positions, attention_masks=mask.unsqueeze(1), past_key_values=cache, use_cache=True
        )
    finally:
        config._attn_implementation = implementation
