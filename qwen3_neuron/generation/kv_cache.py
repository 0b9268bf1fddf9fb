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

A compiled model (`compile.enable`, Neuron's one compile) takes static shapes: `StaticCache`
keeps fixed [local_batch_size, seq_len] buffers per layer for the whole run, and a batch's
columns are its buffer's, each row's tokens at their own positions. The prompts are one forward
of the buffer's first columns, as many as the narrowest of `prefill_widths` that holds the
longest prompt (128, 256, ... seq_len; a row's padding columns are overwritten by its completion
before they are attended), then each sampled token one forward [B, 1], written at its row's
position by `scatter_` and attending to the columns up to it (a mask built from the positions,
tensors all: nothing a graph specializes on changes from token to token). The blocks torchtitan
compiled run graphs of their own for it, one per prefill width and one of the decode
(`StaticCache.graph`): each compiled once, beside the training graph, never recompiled.

Under FSDP the parameters are gathered (and cast to the compute dtype) once for a whole generation
(`gathered`), not around each token's forward, and FSDP's hooks are left out of the forwards.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import GQAttention

from qwen3_neuron.models.logprobs import hidden_states_out

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
HF_STATIC_ATTENTION = "qwen3_neuron_static_cache"  # `_hf_static_attention`'s name in Transformers' AttentionInterface


def attention_mask(prompt_lengths: torch.Tensor, prompt_width: int, first_column: int, queries: int) -> torch.Tensor:
    """[B, queries, first_column + queries] bool: whether a query may attend to a cached column.
    Query q sits at column `first_column + q`; it sees the columns up to its own, except the
    padding between its row's prompt and `prompt_width`."""
    columns = torch.arange(first_column + queries, device=prompt_lengths.device)
    own = first_column + torch.arange(queries, device=prompt_lengths.device)
    causal = columns.unsqueeze(0) <= own.unsqueeze(1)  # [queries, columns]
    content = (columns.unsqueeze(0) < prompt_lengths.unsqueeze(1)) | (columns >= prompt_width)  # [B, columns]
    return causal.unsqueeze(0) & content.unsqueeze(1)


def position_mask(positions: torch.Tensor, columns: int) -> torch.Tensor:
    """[B, L, columns] bool: each token (at `positions` [B, L]) sees the columns up to its own."""
    return torch.arange(columns, device=positions.device) <= positions.unsqueeze(-1)


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Every FSDP module of `model` unsharded for the duration (one all-gather each, in FSDP's
    mixed-precision dtype) and kept so by its forwards; resharded after, with its own
    reshard-after-forward setting back. Without FSDP, nothing to do."""
    from torch.distributed.fsdp import FSDPModule

    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    # torchtitan's setting per module (True for blocks, False for the root; always a bool), to put back
    settings = [any(group.post_forward_mesh_info is not None for group in module._get_fsdp_state()._fsdp_param_groups)
                for module in modules]  # fmt: skip
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    # the blocks' forwards run without their module hooks (FSDP's, which have nothing left to do);
    # the root's stay (FSDP's cast of the inputs to the compute dtype); a compiled block keeps its graph
    hooked = [module for module in modules if module is not model and module._compiled_call_impl is None]
    for module in hooked:
        module._compiled_call_impl = module.forward
    try:
        yield
    finally:
        for module in hooked:
            module._compiled_call_impl = None
        for module, setting in zip(modules, settings):
            module.reshard()
            module.set_reshard_after_forward(setting, recurse=False)


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


def _projected(attention: GQAttention, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`GQAttention.forward`'s queries, keys and values [B, L, heads, head dim]: its projections,
    q/k norms and RoPE at `positions` (LoRA adapters and FSDP's gathers as in training)."""
    q, k, v = attention.qkv_linear(x)
    if attention.q_norm is not None:
        q, k = attention.q_norm(q), attention.k_norm(k)
    q, k = attention.rope(q, k, positions)
    return q, k, v


def _cached_attention(attention: GQAttention, cache: dict, x: torch.Tensor, mask: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """`GQAttention.forward` for the tokens of columns K - L .. K - 1 (mask [B, L, K]), its keys
    and values written to `cache` and attending to all of the cache's first K columns."""
    q, k, v = _projected(attention, x, positions)
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


# ---- the static cache of compiled generation ----------------------------------------------------


# the prompts' forward is a power of two from 128 columns wide, or seq_len (vLLM Neuron's buckets)
FIRST_PREFILL_WIDTH = 128
# a multi-turn rollout's tool turn (`generation.rollout`) is fed this many columns a forward
APPEND_WIDTH = 32


def prefill_widths(seq_len: int) -> list[int]:
    """The widths of the prompts' forward a run may compile: powers of two from 128, and seq_len."""
    widths, width = [], FIRST_PREFILL_WIDTH
    while width < seq_len:
        widths.append(width)
        width *= 2
    return widths + [seq_len]


def prefill_width(longest_prompt: int, seq_len: int) -> int:
    return next(width for width in prefill_widths(seq_len) if width >= longest_prompt)


def _block_call(block: torch.nn.Module, *args, **kwargs):
    # a block's forward without its module hooks: FSDP's, the only ones torchtitan's blocks carry,
    # have nothing to do while `gathered` holds every parameter (and Dynamo cannot trace them)
    return block.forward(*args, **kwargs)


class StaticCache:
    """The fixed keys and values buffers [B, kv heads, seq_len, head dim] of every attention layer
    (allocated at the first generation, in the dtype its weights are gathered in, and kept: a
    compiled graph's inputs stay the same tensors), and, for blocks torchtitan compiled with
    `backend`, the generation's graphs: one per width of the prompts' forward, one of the [B, 1]
    decode. Each is `_block_call` under a code object of its own, so Dynamo compiles each once
    (its cache is per code object) and none is a recompile of another. A tool turn's forward
    (`APPEND_WIDTH` wide) is a graph of its own too, or the prompts' of that width."""

    def __init__(self, backend: str | None):
        self.backend = backend
        self.buffers: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[int, Callable] = {}  # by the forward's width: 1 the decode

    def graph(self, width: int) -> Callable:
        if width not in self.graphs:
            name = "_decode" if width == 1 else f"_append_{width}" if width == APPEND_WIDTH else f"_prefill_{width}"
            code = _block_call.__code__.replace(co_name=name, co_qualname=name)
            function = types.FunctionType(code, _block_call.__globals__, name)
            self.graphs[width] = torch.compile(function, backend=self.backend, fullgraph=True, dynamic=False)
        return self.graphs[width]

    def allocate(self, attentions: list[torch.nn.Module], batch: int, columns: int, hf_backend: bool) -> None:
        for attention in attentions:
            if attention in self.buffers and self.buffers[attention][0].shape[::2] == (batch, columns):
                continue
            if hf_backend:  # Transformers' attention
                heads, head_dim = attention.config.num_key_value_heads, attention.head_dim
            else:
                heads, head_dim = attention.n_kv_heads, attention.head_dim
            weight = next(attention.parameters())
            shape = (batch, heads, columns, head_dim)
            self.buffers[attention] = (torch.zeros(shape, dtype=weight.dtype, device=weight.device),
                                       torch.zeros(shape, dtype=weight.dtype, device=weight.device))  # fmt: skip


@contextmanager
def static_kv_cache(
    model: torch.nn.Module, hf_backend: bool, cache: StaticCache, batch: int, columns: int
) -> Iterator[Forward]:
    """A forward `(tokens [B, L], positions [B, L], mask [B, L, columns]) -> hidden states [B, L, D]`
    over `model` on `cache`'s fixed buffers: each call writes its keys and values at the columns
    `positions` and attends to the columns `mask` (`position_mask`'s) lets it."""
    if hf_backend:
        attentions = [module.self_attn for module in model.modules() if hasattr(module, "self_attn")]
    else:
        attentions = [module for module in model.modules() if isinstance(module, GQAttention)]
    cache.allocate(attentions, batch, columns, hf_backend)
    for attention in attentions:
        keys, values = cache.buffers[attention]
        # as the module's own (non-persistent) buffers: a compiled block takes them as inputs
        attention.register_buffer("static_keys", keys, persistent=False)
        attention.register_buffer("static_values", values, persistent=False)
        if not hf_backend:  # a class, not a bound forward: compiled graphs check a module's type, not its identity
            attention.__class__ = _static_class(type(attention))
    # the modules torchtitan compiled (a torch.compile'd call; `gathered`'s hook-free forwards are not)
    compiled = [m for m in model.modules() if hasattr(m._compiled_call_impl, "_torchdynamo_orig_callable")]
    training_graphs = [module._compiled_call_impl for module in compiled]
    if hf_backend:
        from transformers import AttentionInterface

        AttentionInterface.register(HF_STATIC_ATTENTION, _hf_static_attention)
        config = model.model.config
        implementation, config._attn_implementation = config._attn_implementation, HF_STATIC_ATTENTION

    def forward(tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if compiled:  # this shape's graph, for the blocks torchtitan compiled
            graph = cache.graph(tokens.shape[1])
            for module in compiled:
                module._compiled_call_impl = partial(graph, module)
        if hf_backend:  # a 4-D mask goes to the attention as it is
            return model(tokens, positions=positions, attention_masks=mask.unsqueeze(1))
        return model(tokens, positions=positions, attention_masks=mask)

    try:
        with hidden_states_out(model):
            yield forward
    finally:
        for module, training_graph in zip(compiled, training_graphs):
            module._compiled_call_impl = training_graph
        for attention in attentions:
            del attention.static_keys, attention.static_values
            if not hf_backend:
                attention.__class__ = attention.__class__.__bases__[0]
        if hf_backend:
            config._attn_implementation = implementation


_STATIC_CLASSES: dict[type, type] = {}


def _static_class(cls: type) -> type:
    """`cls` with `_static_attention` as its forward (one class per class, for the whole run)."""
    if cls not in _STATIC_CLASSES:
        _STATIC_CLASSES[cls] = type(f"Static{cls.__name__}", (cls,), {"forward": _static_attention})
    return _STATIC_CLASSES[cls]


def _static_attention(
    attention: GQAttention, x: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """`GQAttention.forward` on the static cache: `x`'s keys and values written at `positions`."""
    q, k, v = _projected(attention, x, positions)
    keys, values = _written(attention, k.transpose(1, 2), v.transpose(1, 2), positions)
    out = _attend(q, keys, values, mask, attention.scaling)
    return attention.wo(out.flatten(2))


def _hf_static_attention(module, query, key, value, attention_mask, scaling=None, position_ids=None, **kwargs):
    """Transformers' attention function (`AttentionInterface`) on the static cache: query [B, heads,
    L, head dim], key and value [B, kv heads, L, head dim] after RoPE, written at `position_ids`."""
    keys, values = _written(module, key, value, position_ids)
    return _attend(query.transpose(1, 2), keys, values, attention_mask.squeeze(1), scaling), None


def _written(attention, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's static buffers [B, kv heads, S, head dim] with k and v [B, kv heads, L, head dim]
    written at the columns `positions` [B, L]."""
    index = positions[:, None, :, None].expand(k.shape)
    attention.static_keys.scatter_(2, index, k.to(attention.static_keys.dtype))
    attention.static_values.scatter_(2, index, v.to(attention.static_values.dtype))
    return attention.static_keys, attention.static_values


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Attention [B, L, heads, head dim] of q [B, L, heads, head dim] over the whole buffer's keys
    and values [B, kv heads, S, head dim] where `mask` [B, L, S] lets it, each kv head shared by
    its group of query heads (folded into the query length: one batched matmul, no copy of the
    buffer). Written out rather than SDPA: CPU's SDPA kernel takes a one-token query over a masked
    256-column buffer about 20x slower than over the 50 columns it holds (measured, bfloat16)."""
    batch, length, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    grouped = q.view(batch, length, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    grouped = grouped.reshape(batch, kv_heads, group * length, head_dim)
    scores = (grouped @ keys.to(q.dtype).transpose(-1, -2)).float() * scale  # [B, KV, group x L, S]
    scores = scores.view(batch, kv_heads, group, length, -1).masked_fill(~mask[:, None, None], float("-inf"))
    probabilities = torch.softmax(scores, dim=-1).to(q.dtype).view(batch, kv_heads, group * length, -1)
    out = probabilities @ values.to(q.dtype)  # [B, KV, group x L, head dim]
    out = out.view(batch, kv_heads, group, length, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, length, heads, head_dim)
