"""model=hf: a Transformers v5 model trained through torchtitan's modeling backend.

The plan-time part (launcher and workers alike, no torch.distributed) reads the model dir, refuses
what cannot work with a `ConfigError` naming the file or key, and builds the `ModelSpec`
torchtitan's `TransformersBackendConfig` needs (`hf_model_spec`, `configure_hf_trainer`,
`check_initial_hf_load`, the last also for model=native loading HF weights).

The architecture comes from `config.json` through `AutoConfig.from_pretrained`, never from
torchtitan defaults. torchtitan's `update_from_config`
(experiments/transformers_modeling_backend/model.py) keeps the HF value of every field a flavour
leaves at None (the `full` flavour leaves all of them), then overwrites a few:

- `max_position_embeddings` <- `training.seq_len` (the backend's position ids depend on it; the
  export writes the source dir's config.json, so the published value survives);
- `attention_bias`, `mlp_bias` <- False: restored here (`PinnedHFConfig`): a model whose
  config.json says True would otherwise be built without biases and drop them on load;
- `initializer_range` <- 1.0, `use_cache` <- False: training-only, never exported.

Three fixes to the backend as installed (torchtitan 0.3.0, transformers 5.23) live here because
they are part of the model model=hf builds; each was measured on the tiny dirs:

- rotary `inv_freq` buffers: torchtitan rebuilds them after its meta-device init only from a
  `rope_init_fn` attribute that Transformers 5.x rotary classes no longer have, so they hold
  uninitialised memory: loss NaN at step 1 when trained weights are loaded (`_init_rotary_buffers`);
- MoE: `HFTransformerModel.init_states` runs only Transformers' `_init_weights`, which does not
  know the torchtitan MoE modules the backend swaps in, so their experts, router and
  load-balancing buffers keep uninitialised memory (router weights up to 3e14, grad norm 3.5e10:
  the bf16 loss NaN on CPU). `HFModel.init_states` initialises them; bf16 then trains;
- MoE weights in and out: the stock adapter only strips the `model.` prefix, so the swapped-in
  MoE weights neither load from nor save to HF names (`HFStateDictAdapter`).

Shapes: E experts, F expert hidden size, D model dim.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3_neuron.fields import ConfigError

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
HF_BACKEND_NAME = "transformers_modeling_backend"

# model.flavor for model=hf selects only the attention mask; the architecture is config.json's.
# (torchtitan's other HF flavours, debugmodel / full_moe, overwrite the architecture.)
HF_FLAVORS = {"full": "causal", "sft_full": "block_causal"}

# config.json keys that make a model a mixture of experts (Qwen3-MoE, Mixtral, DeepSeek, ...).
MOE_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")

# Fields torchtitan's update_from_config overwrites that change the architecture.
PINNED_FROM_HF = ("attention_bias", "mlp_bias")


@dataclass(frozen=True)
class HFModelDir:
    """A checked local Transformers model dir."""

    path: Path
    config: dict[str, Any]  # config.json as written

    @property
    def is_moe(self) -> bool:
        return any(_text_config(self.config).get(key) for key in MOE_KEYS)

    @property
    def vocab_size(self) -> int:
        return int(_text_config(self.config)["vocab_size"])


# ---- plan-time checks ------------------------------------------------------------------------


def resolve_model_dir(hf_model: str | None, key: str = "model.hf_model") -> Path:
    """A local dir for `hf_model`: the dir itself, or the cached snapshot of a Hub id.

    Nothing is downloaded (runs are offline): a Hub id must already be in the HF cache.
    """
    if not hf_model:
        raise ConfigError(
            f"{key} is not set: model=hf needs a Transformers model dir (or a cached Hub id), "
            f"e.g. {key}=/path/to/Qwen3-0.6B."
        )
    path = Path(hf_model).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or _looks_like_path(hf_model):
        raise ConfigError(f"{key}={hf_model}: no such directory.")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hf_model, local_files_only=True))
    except Exception as e:  # not cached, bad id: the Hub client's own errors vary
        raise ConfigError(
            f"{key}={hf_model}: not a local dir and not in the Hugging Face cache "
            f"({type(e).__name__}). Runs are offline (HF_HUB_OFFLINE=1): download it first "
            f"(`huggingface-cli download {hf_model}`) or give a local dir."
        ) from e


def read_model_dir(path: Path, key: str = "model.hf_model") -> HFModelDir:
    """Check `path/config.json` exists and is a JSON object describing a model."""
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(
            f"{key}={path}: no {CONFIG_FILE} in it; a Transformers model dir needs one "
            f"(save_pretrained writes it)."
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{config_path} is not valid JSON ({e}); set by {key}.") from e
    if not isinstance(config, dict):
        raise ConfigError(
            f"{config_path} must hold a JSON object, got {type(config).__name__}; set by {key}."
        )
    if "model_type" not in config:
        raise ConfigError(f"{config_path}: key 'model_type' is missing; set by {key}.")
    text = _text_config(config)
    for field in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if not isinstance(text.get(field), int):
            raise ConfigError(
                f"{config_path}: key '{field}' is missing or not an integer "
                f"(got {text.get(field)!r}); set by {key}."
            )
    return HFModelDir(path=path, config=config)


def check_safetensors(path: Path, key: str) -> list[Path]:
    """The weight files of an HF dir; ConfigError when there are none or the index is broken."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        raise ConfigError(
            f"{key}={path}: no *.safetensors weights to load (found: {found}). "
            f"Point it at a dir with model*.safetensors, or drop checkpointing=from_hf."
        )
    index_path = path / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(f"{index_path}: not a safetensors index ({e}).") from e
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise ConfigError(f"{index_path}: names files that are not there: {', '.join(missing)}.")
    return files


def load_auto_config(model_dir: HFModelDir, trust_remote_code: bool, key: str = "model.hf_model"):
    """`AutoConfig.from_pretrained` with the user's `model.trust_remote_code`, checked now.

    torchtitan's worker calls it again with trust_remote_code=True (False for DeepSeek V2/V3).
    That runs remote code only when config.json has an `auto_map`, which is refused here unless
    model.trust_remote_code=true: so the user's setting decides either way.
    """
    from transformers import AutoConfig

    config_path = model_dir.path / CONFIG_FILE
    if model_dir.config.get("auto_map") and not trust_remote_code:
        raise ConfigError(
            f"{config_path} has 'auto_map': the model ships its own Python code. Set "
            f"model.trust_remote_code=true to run it (only for code you trust)."
        )
    try:
        return AutoConfig.from_pretrained(model_dir.path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError, TypeError) as e:
        raise ConfigError(f"{config_path}: Transformers cannot read it ({e}); set by {key}.") from e


def check_backend_builds(auto_config, model_dir: HFModelDir) -> None:
    """torchtitan builds `architectures[0]` from the installed transformers package only."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    text = getattr(auto_config, "text_config", None) or auto_config
    names = list(getattr(auto_config, "architectures", None) or [])
    fallback = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(text, "model_type", ""))
    if not any(hasattr(transformers, name) for name in [*names[:1], fallback] if name):
        raise ConfigError(
            f"{model_dir.path / CONFIG_FILE}: architectures={names} (model_type "
            f"'{text.model_type}') is not a causal-LM class of the installed transformers "
            f"{transformers.__version__}; torchtitan's Transformers backend can only build those."
        )


# ---- the model spec ---------------------------------------------------------------------------


def hf_model_spec(model):
    """torchtitan's ModelSpec for model=hf from `ModelSettings` (flavor, hf_model, trust_remote_code)."""
    from torchtitan.components.optimizer import register_moe_load_balancing_hook
    from torchtitan.experiments.transformers_modeling_backend import (
        TitanModelConfig,
        TitanMoeModelConfig,
    )
    from torchtitan.experiments.transformers_modeling_backend.parallelize import (
        parallelize_hf_transformers,
    )
    from torchtitan.experiments.transformers_modeling_backend.pipeline import (
        pipeline_hf_transformers,
    )
    from torchtitan.protocols.model_spec import ModelSpec

    if model.flavor not in HF_FLAVORS:
        raise ConfigError(
            f"model.flavor={model.flavor} does not fit model=hf: the architecture comes from "
            f"model.hf_model's {CONFIG_FILE}. Valid: "
            + ", ".join(f"{name} ({mask} mask)" for name, mask in HF_FLAVORS.items())
            + "."
        )
    model_dir = read_model_dir(resolve_model_dir(model.hf_model))
    auto_config = load_auto_config(model_dir, model.trust_remote_code)
    check_backend_builds(auto_config, model_dir)
    # Every HF-mapped field stays None: AutoConfig's value is kept (see module docstring).
    titan_cls = TitanMoeModelConfig if model_dir.is_moe else TitanModelConfig
    # vocab_size is set (to config.json's value, so nothing changes) so that the plan can size
    # the loss and the report knows ln(V) before a worker has loaded the config.
    titan = titan_cls(vocab_size=model_dir.vocab_size, attn_mask_type=HF_FLAVORS[model.flavor])
    if model_dir.is_moe:
        titan.experts_implementation = "native"  # the backend swaps in torchtitan's MoE anyway
    pinned = {k: getattr(auto_config, k) for k in PINNED_FROM_HF if hasattr(auto_config, k)}
    return ModelSpec(
        name=HF_BACKEND_NAME,
        flavor=model.flavor,
        model=_pinned_config_class()(model_config=titan, pinned_from_hf=pinned),
        parallelize_fn=parallelize_hf_transformers,
        pipelining_fn=pipeline_hf_transformers,
        post_optimizer_build_fn=register_moe_load_balancing_hook,
        state_dict_adapter=_adapter_class(),
    )


def configure_hf_trainer(config, model) -> None:
    """Settle the fields of a model=hf Trainer.Config that follow from the model dir.

    Call after the YAML sections are applied. `hf_model` and `hf_assets_path` become the model dir: the tokenizer must be the model's own
    (its ids index the embedding), and torchtitan reads the safetensors index (the export's file
    layout) and, without `checkpoint.initial_load_path`, the initial HF weights from there.
    """
    model_dir = read_model_dir(resolve_model_dir(model.hf_model))
    config.hf_model = str(model_dir.path)
    config.hf_assets_path = str(model_dir.path)
    check_tokenizer_fits(config.hf_assets_path, model_dir.vocab_size)


def check_tokenizer_fits(tokenizer_dir: str, vocab_size: int, key: str = "hf_assets_path") -> None:
    """Every token id the tokenizer can produce must have a row in the embedding."""
    tokenizer_file = Path(tokenizer_dir) / "tokenizer.json"
    if not tokenizer_file.is_file():
        return  # other tokenizer formats: torchtitan reports them when it builds the tokenizer
    try:
        tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
        ids = list(tokenizer["model"]["vocab"].values())
        ids += [token["id"] for token in tokenizer.get("added_tokens", [])]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{tokenizer_file}: not a tokenizers JSON file ({e}); set by {key}.") from e
    largest = max(ids, default=-1)
    if largest >= vocab_size:
        raise ConfigError(
            f"{tokenizer_file} has token id {largest}, but the model's vocab_size is {vocab_size}: "
            f"{key} must hold the model's own tokenizer."
        )


def check_initial_hf_load(config, kind: str) -> None:
    """checkpointing=from_hf: the dir to load holds safetensors that fit the model.

    torchtitan loads from `checkpoint.initial_load_path`, else from `hf_assets_path` (for
    model=hf the model dir). For model=native the dir's config.json, when it has one, must
    describe the native flavour's architecture: shapes that differ fail inside DCP with a
    less helpful message, and a different rope theta or tying would not fail at all.
    """
    checkpoint = config.checkpoint
    if not (checkpoint.enable and checkpoint.initial_load_in_hf):
        return
    if checkpoint.initial_load_path:
        key, load_dir = "checkpoint.initial_load_path", Path(checkpoint.initial_load_path)
    elif kind == "hf":
        key, load_dir = "model.hf_model", Path(config.hf_assets_path)
    else:
        raise ConfigError(
            f"checkpointing=from_hf with model={kind}: set checkpoint.initial_load_path to the "
            f"absolute path of a Hugging Face model dir (hf_assets_path={config.hf_assets_path} "
            f"is the tokenizer)."
        )
    if not load_dir.is_dir():
        raise ConfigError(f"{key}={load_dir}: no such directory.")
    check_safetensors(load_dir, key)
    if kind == "native" and (load_dir / CONFIG_FILE).is_file():
        _check_native_matches(config.model_spec, read_model_dir(load_dir, key), key)


def native_architecture(model_config) -> dict[str, Any]:
    """A dense native torchtitan Qwen3 config in Transformers' config.json names."""
    layers = model_config.layers
    if any(getattr(layer, "moe", None) is not None for layer in layers):
        raise UnsupportedModel("native MoE models have no config.json mapping here yet")
    attention = layers[0].attention
    rope = attention.rope
    if getattr(rope, "scaling", "none") != "none":
        raise UnsupportedModel(f"rope scaling '{rope.scaling}' has no config.json mapping here yet")
    return dict(
        vocab_size=model_config.vocab_size,
        hidden_size=model_config.dim,
        num_hidden_layers=len(layers),
        num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads or attention.n_heads,
        head_dim=attention.head_dim,
        intermediate_size=layers[0].feed_forward.w1.out_features,
        rms_norm_eps=model_config.norm.eps,
        rope_theta=rope.theta,
        max_position_embeddings=rope.max_seq_len,
        tie_word_embeddings=model_config.enable_weight_tying,
    )


class UnsupportedModel(ValueError):
    """A model this module cannot describe in Transformers' terms."""


# Keys whose values must agree for HF weights to load into a native flavour as the same model.
_NATIVE_MATCH_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "tie_word_embeddings", "rope_theta",
)  # fmt: skip


def _check_native_matches(model_spec, hf_dir: HFModelDir, key: str) -> None:
    try:
        native = native_architecture(model_spec.model)
    except UnsupportedModel:
        return  # MoE flavours: DCP still checks every shape
    hf = dict(_text_config(hf_dir.config))
    hf.setdefault("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta"))
    hf.setdefault("head_dim", hf["hidden_size"] // hf.get("num_attention_heads", 1))
    hf.setdefault("tie_word_embeddings", False)
    differ = [
        f"{name}: {hf.get(name)!r} in {CONFIG_FILE}, {native[name]!r} in model.flavor={model_spec.flavor}"
        for name in _NATIVE_MATCH_KEYS
        if hf.get(name) != native[name]
    ]
    if differ:
        raise ConfigError(
            f"{key}={hf_dir.path}: {hf_dir.path / CONFIG_FILE} does not describe the native "
            f"flavour's architecture, so its weights would not load as that model: "
            + "; ".join(differ)
            + "."
        )


# ---- the classes torchtitan builds (made lazily: importing them pulls in transformers) --------


def _pinned_config_class():
    global _PinnedHFConfig
    if _PinnedHFConfig is None:
        _PinnedHFConfig = _make_pinned_config_class()
    return _PinnedHFConfig


def _adapter_class():
    global _HFStateDictAdapter
    if _HFStateDictAdapter is None:
        _HFStateDictAdapter = _make_adapter_class()
    return _HFStateDictAdapter


_PinnedHFConfig = None
_HFStateDictAdapter = None


def _make_pinned_config_class():
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
    from torchtitan.protocols.module import Module

    class HFModel(HFTransformerModel):
        """HFTransformerModel whose init also covers the torchtitan MoE modules it swaps in."""

        def init_states(self, *, buffer_device=None) -> None:
            super().init_states(buffer_device=buffer_device)
            _init_rotary_buffers(self.model)
            for layer in self.layers.values():
                moe = getattr(layer, "moe", None)
                if isinstance(moe, Module):
                    moe.init_states(buffer_device=buffer_device)

    class PinnedHFConfig(HFTransformerModel.Config):
        """HFTransformerModel.Config that keeps config.json's `PINNED_FROM_HF` fields."""

        _owner = HFModel

        def __init__(self, model_config, pinned_from_hf: dict[str, Any] | None = None, **kwargs):
            super().__init__(model_config, **kwargs)
            self._pinned_from_hf = dict(pinned_from_hf or {})

        def update_from_config(self, *, config=None, **kwargs):
            super().update_from_config(config=config, **kwargs)
            for name, value in self._pinned_from_hf.items():
                setattr(self, name, value)
            return self

    return PinnedHFConfig


def _init_rotary_buffers(hf_model) -> None:
    """Recompute every rotary embedding's `inv_freq` (and `original_inv_freq`) buffer.

    They are non-persistent buffers computed in `__init__`, so after torchtitan's meta-device
    build and `to_empty()` they hold uninitialised memory, and no checkpoint restores them.
    torchtitan recomputes them only from a `rope_init_fn` attribute, which Transformers 5.x
    rotary classes no longer keep (it is a local in `__init__`): positions then rotate by
    garbage frequencies (first loss ~14 instead of ~ln V on the tiny model). Same choice as
    their `__init__`: `compute_default_rope_parameters` for "default", else the registry entry.
    """
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for module in hf_model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "rope_type"):
            continue
        if module.rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
            rope_init = module.compute_default_rope_parameters
        else:
            rope_init = ROPE_INIT_FUNCTIONS[module.rope_type]
        inv_freq, attention_scaling = rope_init(module.config, device=torch.device("cpu"))
        with torch.no_grad():
            for name in ("inv_freq", "original_inv_freq"):
                buffer = getattr(module, name, None)
                if isinstance(buffer, torch.Tensor):
                    _local(buffer).copy_(inv_freq.to(dtype=buffer.dtype))
        module.attention_scaling = attention_scaling


def _local(tensor):
    """The local shard of a DTensor (rotary buffers are replicated), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _make_adapter_class():
    from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import (
        HFTransformerStateDictAdapter,
        hf_to_titan_moe_state_dict,
        titan_to_hf_moe_state_dict,
    )

    class HFStateDictAdapter(HFTransformerStateDictAdapter):
        """HF names for the backend's torchtitan MoE modules, in the on-disk per-expert layout.

        The backend swaps each HF MoE block for torchtitan's MoE (routed experts as one
        (E, F, D) tensor per projection, router under `router.gate`). Its stock adapter only
        strips the `model.` prefix, so MoE weights neither load from nor save to HF names.
        Here: torchtitan's own `titan_to_hf_moe_state_dict` gives Transformers' in-memory
        names (fused `experts.gate_up_proj`), then `_split_experts` the per-expert keys
        Transformers writes and reads on disk (`experts.{e}.gate_proj.weight`, ...).
        Dense models pass through unchanged. The MoE load-balancing bias (`expert_bias_E`)
        is training state with no Qwen3-MoE counterpart: neither loaded nor exported.
        """

        def to_hf(self, state_dict):
            hf_state_dict = super().to_hf(state_dict)
            if not any(".routed_experts." in key for key in hf_state_dict):
                return hf_state_dict
            # The load-balancing bias of torchtitan's MoE (auxiliary-loss-free balancing)
            # has no Qwen3-MoE counterpart: it starts at zero and is not exported.
            hf_state_dict = {
                k: v for k, v in hf_state_dict.items() if not k.endswith(_EXPERT_BIAS)
            }
            return _split_experts(titan_to_hf_moe_state_dict(hf_state_dict))

        def from_hf(self, hf_state_dict):
            if any(_PER_EXPERT.match(key) for key in hf_state_dict):
                hf_state_dict = hf_to_titan_moe_state_dict(_fuse_experts(hf_state_dict))
            return super().from_hf(hf_state_dict)

    return HFStateDictAdapter


_EXPERT_BIAS = ".expert_bias_E"

# model.layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.weight
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def _split_experts(hf_state_dict: dict[str, Any]) -> dict[str, Any]:
    """Fused in-memory experts -> Transformers' on-disk per-expert Linear weights.

    `experts.gate_up_proj` (E, 2F, D) -> `experts.{e}.gate_proj.weight` (F, D) and
    `experts.{e}.up_proj.weight` (F, D); `experts.down_proj` (E, D, F) ->
    `experts.{e}.down_proj.weight` (D, F). Slices of (possibly sharded) tensors: DCP reads
    into them and writes them out like any other entry.
    """
    out = {}
    for key, value in hf_state_dict.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix = key.removesuffix(".gate_up_proj")
            hidden_F = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = value[e, :hidden_F, :]
                out[f"{prefix}.{e}.up_proj.weight"] = value[e, hidden_F:, :]
        elif key.endswith(".experts.down_proj"):
            prefix = key.removesuffix(".down_proj")
            for e in range(value.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = value[e]
        else:
            out[key] = value
    return out


def _fuse_experts(hf_state_dict: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `_split_experts`."""
    import torch

    groups: dict[str, dict[str, dict[int, Any]]] = {}
    out = {}
    for key, value in hf_state_dict.items():
        match = _PER_EXPERT.match(key)
        if match is None:
            out[key] = value
            continue
        by_proj = groups.setdefault(match["prefix"], {})
        by_proj.setdefault(match["proj"], {})[int(match["e"])] = value
    for prefix, by_proj in groups.items():
        experts = sorted(by_proj["gate"])
        gate_EFD = torch.stack([by_proj["gate"][e] for e in experts])
        up_EFD = torch.stack([by_proj["up"][e] for e in experts])
        out[f"{prefix}.gate_up_proj"] = torch.cat([gate_EFD, up_EFD], dim=1)
        out[f"{prefix}.down_proj"] = torch.stack([by_proj["down"][e] for e in experts])
    return out


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config.json (composite VL configs nest it)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _looks_like_path(value: str) -> bool:
    """A Hub id is `name` or `org/name`; anything else names a local path."""
    return value.startswith(("/", "./", "../", "~")) or value.count("/") > 1
