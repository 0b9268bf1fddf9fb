"""model=hf: the ModelSpec torchtitan's Transformers backend builds, from a read model dir.

`hf_model_spec` builds the `ModelSpec` torchtitan's Transformers backend needs;
`configure_hf_trainer` settles the trainer fields that follow from the model dir. Both only build
from the `HFModelDir` they are given (launcher and workers alike); the checks of the dir are the
plan's (`model_dir.open_model_dir`).

The architecture comes from `config.json` through `AutoConfig.from_pretrained`, never from
torchtitan defaults. torchtitan's `update_from_config`
(experiments/transformers_modeling_backend/model.py) keeps the HF value of every field a flavour
leaves at None (the `full` flavour leaves all of them), then overwrites a few:

- `max_position_embeddings` <- `training.seq_len` (the backend's position ids depend on it; the
  export writes the source dir's config.json, so the published value survives);
- `attention_bias`, `mlp_bias` <- False: restored here (`PinnedHFConfig`) to what config.json
  says: a model whose config.json says True would otherwise be built without biases and drop
  them on load (a config.json without them gets the Transformers class default, False for the
  Qwen/Llama families, as torchtitan sets);
- `initializer_range` <- 1.0, `use_cache` <- False: training-only, never exported.

Fixes to the backend as installed live in `runtime` (model init, pinned fields) and
`state_dict` (MoE keys).
"""

from __future__ import annotations

import copy

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.hf_backend import HF_BACKEND_NAME
from qwen3_neuron.models.hf.model_dir import CONFIG_FILE, HFModelDir
from qwen3_neuron.models.hf.runtime import pinned_config_class
from qwen3_neuron.models.hf.state_dict import adapter_class

# model.flavor for model=hf selects only the attention mask; the architecture is config.json's.
# (torchtitan's other HF flavours, debugmodel / full_moe, overwrite the architecture.)
HF_FLAVORS = {"full": "causal", "sft_full": "block_causal"}

# Fields torchtitan's update_from_config overwrites that change the architecture.
PINNED_FROM_HF = ("attention_bias", "mlp_bias")


def hf_model_spec(model_dir: HFModelDir, flavor: str):
    """torchtitan's ModelSpec for model=hf: the architecture of `model_dir`, the mask of `flavor`."""
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

    if flavor not in HF_FLAVORS:
        raise ConfigError(
            f"model.flavor={flavor} does not fit model=hf: the architecture comes from "
            f"model.hf_model's {CONFIG_FILE}. Valid: "
            + ", ".join(f"{name} ({mask} mask)" for name, mask in HF_FLAVORS.items())
            + "."
        )
    # Every HF-mapped field stays None: AutoConfig's value is kept (see module docstring).
    titan_cls = TitanMoeModelConfig if model_dir.is_moe else TitanModelConfig
    # vocab_size is set (to config.json's value, so nothing changes) so that the plan can size
    # the loss and the report knows ln(V) before a worker has loaded the config.
    titan = titan_cls(vocab_size=model_dir.vocab_size, attn_mask_type=HF_FLAVORS[flavor])
    if model_dir.is_moe:
        titan.experts_implementation = "native"  # the backend swaps in torchtitan's MoE anyway
    pinned = {k: model_dir.text_config[k] for k in PINNED_FROM_HF if k in model_dir.text_config}
    return ModelSpec(
        name=HF_BACKEND_NAME,
        flavor=flavor,
        model=pinned_config_class()(model_config=titan, pinned_from_hf=pinned, model_type=model_dir.config["model_type"]),
        parallelize_fn=parallelize_hf_transformers,
        pipelining_fn=pipeline_hf_transformers,
        post_optimizer_build_fn=register_moe_load_balancing_hook,
        state_dict_adapter=adapter_class(),
    )


def with_block_causal_mask(spec):
    """The spec whose model attends within each packed sequence alone: the Transformers backend's
    `full` flavour (causal over the whole sample) made block-causal, `sft_full`'s mask, before the
    model is built. Other models' masks are block-causal already and stay as they are.

    The model config is copied, as the backend copies its configs (`_replace`: their __init__
    cannot run again); `update_from_config` keeps the field (config.json has no such key)."""
    if getattr(spec.model, "attn_mask_type", None) != HF_FLAVORS["full"]:
        return spec
    spec, model = copy.copy(spec), copy.copy(spec.model)
    model.attn_mask_type = HF_FLAVORS["sft_full"]
    spec.model = model
    return spec


def configure_hf_trainer(config, model_dir: HFModelDir) -> None:
    """Settle the fields of a model=hf Trainer.Config that follow from the model dir.

    Call after the YAML sections are applied. `hf_model` and `hf_assets_path` become the model
    dir: the tokenizer must be the model's own (its ids index the embedding; the plan checks it),
    and torchtitan reads the safetensors index (the export's file layout) and, without
    `checkpoint.initial_load_path`, the initial HF weights from there.
    """
    config.hf_model = str(model_dir.path)
    config.hf_assets_path = str(model_dir.path)
