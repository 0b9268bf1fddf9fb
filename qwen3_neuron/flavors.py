"""Qwen3 flavours beyond torchtitan's own, registered in torchtitan's flavour table.

`model_registry(flavor)` then builds their `ModelSpec` with torchtitan's own parallelize
function and state-dict adapter, exactly like a built-in flavour.
"""

from __future__ import annotations

from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3 import (
    _build_qwen3_layers,
    _EMBEDDING_INIT,
    _EMBEDDING_SKIP_INIT,
    _LINEAR_INIT,
    _qwen3_norm,
    model_registry,
    qwen3_configs,
)
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.protocols.model_spec import ModelSpec

from qwen3_neuron.fields import ConfigError
from qwen3_neuron.tiny import TINY_DENSE


def dense_qwen3(hf: dict, attn_backend: str) -> Qwen3Model.Config:
    """A dense Qwen3 built from Hugging Face config numbers (the names in config.json)."""
    dim, head_dim, vocab = hf["hidden_size"], hf["head_dim"], hf["vocab_size"]
    tied = hf["tie_word_embeddings"]
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
        layers=_build_qwen3_layers(
            n_layers=hf["num_hidden_layers"],
            dim=dim,
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf["num_key_value_heads"],
            head_dim=head_dim,
            hidden_dim=hf["intermediate_size"],
            attn_backend=attn_backend,
            rope=CosSinRoPE.Config(
                dim=head_dim, max_seq_len=hf["max_position_embeddings"], theta=hf["rope_theta"]
            ),
        ),
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
    "4B-Instruct-2507": _qwen3_4b_instruct_2507,
}
for _name, _builder in PROJECT_FLAVORS.items():
    qwen3_configs.setdefault(_name, _builder)

MOE_FLAVORS = {"debugmodel_moe", "30B-A3B", "235B-A22B"}


def native_model_spec(flavor: str) -> ModelSpec:
    dense = sorted(set(qwen3_configs) - MOE_FLAVORS)
    if flavor not in dense:
        raise ConfigError(
            f"Unknown flavour 'model.flavor={flavor}' for model=native. Valid: {', '.join(dense)}."
        )
    return model_registry(flavor)
