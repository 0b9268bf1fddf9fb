"""A Transformers model dir: its `config.json` read once into an `HFModelDir` that the plan, the
layout checks and the ModelSpec share.

Plan time only: the launcher finds the dir (a local dir or a cached Hub id) and reads it
(`find_model_dir`) before torchrun starts; the plan (`open_model_dir`) checks that Transformers
can read and build it; the other checks refuse what cannot work with a `ConfigError` naming the
file or key (weights present, the tokenizer fits, HF weights loaded into a native flavour describe
that flavour). Workers only `read_model_dir` the local path the plan recorded: no Hub lookup, no
AutoConfig, no tokenizer or safetensors index read. (Local rank 0 reads config.json once, from the
dir job.yaml names, and the plan's AutoConfig is made from what it read.)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError, UnsupportedModel

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SCORE_MODULE = "score"  # Transformers' name: Qwen3ForSequenceClassification.score

# config.json keys that make a model a mixture of experts (Qwen3-MoE, Mixtral, DeepSeek, ...).
MOE_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


@dataclass(frozen=True)
class HFModelDir:
    """A checked local Transformers model dir."""

    path: Path
    config: dict[str, Any]  # config.json as written

    @property
    def text_config(self) -> dict[str, Any]:
        """The language-model part of config.json (composite VL configs nest it)."""
        return _text_config(self.config)

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def num_experts(self) -> int | None:
        return next((self.text_config[k] for k in MOE_KEYS if self.text_config.get(k)), None)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config["vocab_size"])


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


# ---- plan-time checks ------------------------------------------------------------------------


def find_model_dir(hf_model: str | None) -> HFModelDir:
    """model.hf_model found (a local dir or a cached Hub id) and its config.json read: no
    Transformers or torchtitan import, so a wrong dir stops a launch before torchrun starts."""
    return read_model_dir(resolve_model_dir(hf_model))


def open_model_dir(hf_model: str | None, trust_remote_code: bool, found: HFModelDir | None = None) -> HFModelDir:
    """model.hf_model (`found` already, or found now), read and checked: Transformers can read it
    and torchtitan's backend can build it. The plan records `HFModelDir.path` for the workers."""
    model_dir = found or find_model_dir(hf_model)
    check_backend_builds(load_auto_config(model_dir, trust_remote_code), model_dir)
    return model_dir


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
            f"(`{_download_command(hf_model)}`) or give a local dir."
        ) from e


def _download_command(hf_model: str) -> str:
    """The command that downloads `hf_model`: a Hub id is org/name; a bare name (Qwen3-0.6B) is
    taken for the dir to download into, from Qwen's org where the name is Qwen's. The Hub's CLI
    beside this Python (the venv's `.venv/bin/hf`) where there is one."""
    beside = Path(sys.executable).parent / "hf"
    cli = os.path.relpath(beside) if beside.exists() and not os.path.relpath(beside).startswith("..") else "hf"
    if "/" in hf_model:
        return f"{cli} download {hf_model}"
    org = "Qwen" if hf_model.lower().startswith("qwen") else "<org>"
    return f"{cli} download {org}/{hf_model} --local-dir {hf_model}"


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
        if model_dir.config.get("auto_map"):  # the model's own config class, loaded from its dir
            return AutoConfig.from_pretrained(model_dir.path, trust_remote_code=True)
        return AutoConfig.for_model(**model_dir.config)  # config.json as read once, not read again
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


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config.json (composite VL configs nest it)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _looks_like_path(value: str) -> bool:
    """A Hub id is `name` or `org/name`; anything else names a local path."""
    return value.startswith(("/", "./", "../", "~")) or value.count("/") > 1


def score_head_path(step_dir: Path) -> Path:
    """Where trainer=reward_model writes the trained head (`score.weight`, float32) beside an HF save."""
    return Path(step_dir) / SCORE_MODULE / "score.safetensors"
