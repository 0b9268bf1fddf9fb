"""Qwen3 flavours beyond torchtitan's own, registered in torchtitan's flavour table.

`model_registry(flavor)` then builds their `ModelSpec` with torchtitan's own parallelize
function and state-dict adapter, exactly like a built-in flavour.
"""

from __future__ import annotations

from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3 import (
    _EMBEDDING_INIT,
    _EMBEDDING_SKIP_INIT,
    _LINEAR_INIT,
    _build_qwen3_layers,
    _build_qwen3_moe_layers,
    _qwen3_norm,
    model_registry,
    qwen3_configs,
)
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.protocols.model_spec import ModelSpec

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.models.tiny import TINY_DENSE, TINY_DENSE_UNTIED, TINY_MOE


def dense_qwen3(hf: dict, attn_backend: str) -> Qwen3Model.Config:
    """A dense Qwen3 built from Hugging Face config numbers (the names in config.json)."""
    head_dim = hf["head_dim"]
    return _qwen3_model(
        hf,
        layers=_build_qwen3_layers(
            n_layers=hf["num_hidden_layers"],
            dim=hf["hidden_size"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf["num_key_value_heads"],
            head_dim=head_dim,
            hidden_dim=hf["intermediate_size"],
            attn_backend=attn_backend,
            rope=_rope(hf),
        ),
    )


def moe_qwen3(hf: dict, attn_backend: str) -> Qwen3Model.Config:
    """A Qwen3 mixture-of-experts built from Hugging Face config numbers."""
    return _qwen3_model(
        hf,
        layers=_build_qwen3_moe_layers(
            n_layers=hf["num_hidden_layers"],
            dim=hf["hidden_size"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf["num_key_value_heads"],
            head_dim=hf["head_dim"],
            moe_hidden_dim=hf["moe_intermediate_size"],
            num_experts=hf["num_experts"],
            top_k=hf["num_experts_per_tok"],
            attn_backend=attn_backend,
            moe_comm_backend="standard",
            rope=_rope(hf),
        ),
    )


def _rope(hf: dict) -> CosSinRoPE.Config:
    return CosSinRoPE.Config(
        dim=hf["head_dim"], max_seq_len=hf["max_position_embeddings"], theta=hf["rope_theta"]
    )


def _qwen3_model(hf: dict, layers: list) -> Qwen3Model.Config:
    dim, vocab, tied = hf["hidden_size"], hf["vocab_size"], hf["tie_word_embeddings"]
    return Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=_qwen3_norm(dim),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            # tied: the lm_head init writes the shared weight, as in torchtitan's tied flavours
            param_init=_EMBEDDING_SKIP_INIT if tied else _EMBEDDING_INIT,
        ),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),
        layers=layers,
    )


def _qwen3_4b_instruct_2507(attn_backend: str) -> Qwen3Model.Config:
    # Same architecture as torchtitan's "4B" (the published Qwen3-4B); the 2507 release
    # raised rope theta from 1e6 to 5e6.
    config = qwen3_configs["4B"](attn_backend)
    for layer in config.layers:
        layer.attention.rope.theta = 5_000_000.0
    return config


PROJECT_FLAVORS = {
    "tiny": lambda attn_backend: dense_qwen3(TINY_DENSE, attn_backend),
    "tiny_untied": lambda attn_backend: dense_qwen3(TINY_DENSE_UNTIED, attn_backend),  # for parallelism=pp
    "tiny_moe": lambda attn_backend, moe_comm_backend="standard": moe_qwen3(TINY_MOE, attn_backend),
    "4B-Instruct-2507": _qwen3_4b_instruct_2507,
}
for _name, _builder in PROJECT_FLAVORS.items():
    qwen3_configs.setdefault(_name, _builder)

MOE_FLAVORS = {"tiny_moe", "debugmodel_moe", "30B-A3B", "235B-A22B"}


def native_model_spec(flavor: str) -> ModelSpec:
    dense = sorted(set(qwen3_configs) - MOE_FLAVORS)
    if flavor not in dense:
        raise ConfigError(
            f"Unknown flavour 'model.flavor={flavor}' for model=native. Valid: {', '.join(dense)}."
        )
    return model_registry(flavor)


def moe_model_spec(flavor: str, **changes: int | None) -> ModelSpec:
    """A Qwen3 MoE flavour; `changes` (num_experts, top_k, moe_hidden_dim) rebuild its layers."""
    if flavor not in MOE_FLAVORS:
        raise ConfigError(
            f"Unknown flavour 'model.flavor={flavor}' for model=moe. Valid: {', '.join(sorted(MOE_FLAVORS))}."
        )
    spec = model_registry(flavor)
    names = {"num_experts": "num_experts", "top_k": "num_experts_per_tok", "moe_hidden_dim": "moe_intermediate_size"}
    wanted = {names[key]: value for key, value in changes.items() if value is not None}
    for key, value in changes.items():
        if value is not None and value < 1:
            raise ConfigError(f"model.{key} must be >= 1, got {value}.")
    if wanted:
        hf = {**moe_dims(spec.model), **wanted}
        if hf["num_experts_per_tok"] > hf["num_experts"]:
            raise ConfigError(
                f"model.top_k={hf['num_experts_per_tok']} is more than the model's "
                f"{hf['num_experts']} experts (model.num_experts)."
            )
        spec.model = moe_qwen3(hf, attn_backend=_attn_backend(spec.model))
    return spec


def moe_dims(model: Qwen3Model.Config) -> dict:
    """The Hugging Face config numbers of a built MoE model config (inverse of `moe_qwen3`)."""
    layer = model.layers[0]
    attention, moe = layer.attention, layer.moe
    return dict(
        vocab_size=model.vocab_size,
        hidden_size=model.dim,
        num_hidden_layers=len(model.layers),
        num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads,
        head_dim=attention.head_dim,
        moe_intermediate_size=moe.routed_experts.inner_experts.hidden_dim,
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.router.top_k,
        tie_word_embeddings=model.enable_weight_tying,
        rope_theta=attention.rope.theta,
        max_position_embeddings=attention.rope.max_seq_len,
    )


def _attn_backend(model: Qwen3Model.Config) -> str:
    inner = type(model.layers[0].attention.inner_attention).__qualname__
    return {"FlexAttention.Config": "flex", "ScaledDotProductAttention.Config": "sdpa"}.get(inner, "flex")
