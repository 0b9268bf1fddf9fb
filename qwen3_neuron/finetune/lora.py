"""finetune=lora on torchtitan's own Qwen3 (model=native, model=moe): Hugging Face projection
names -> the model's `Linear` modules -> `LoRAConverter.Config`, applied to the model spec the way
torchtitan's `model_registry(flavor, converters=[...])` applies it.

torchtitan's LoRAConverter matches a module by the last segment of its config's FQN, so the
unit it can target is one `Linear.Config`. Qwen3 fuses q/k/v into one `wqkv` (every flavour but
`debugmodel_non_fused_qkv`, whose `wk` and `wv` still share one `wkv` config): HF names that land
on one config must be named together. MoE layers have no dense MLP and their routed experts are
grouped 3-D weights, not `Linear`s: they get no adapters, and the plan says so.
"""

from __future__ import annotations

import copy

from torchtitan.components.lora import LoRAConverter
from torchtitan.models.common.linear import Linear
from torchtitan.models.utils import validate_converter_order
from torchtitan.protocols.model_spec import ModelSpec

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.finetune.names import HF_PROJECTIONS

# `finetune` below is the plan's `finetune` section (config.settings.FinetuneSettings): read by
# attribute, never imported, so that finetune stays below the config stage that builds with it.

# HF projection -> torchtitan module name (last FQN segment), per q/k/v layout.
_FUSED_QKV = {"q_proj": "wqkv", "k_proj": "wqkv", "v_proj": "wqkv"}
_SEPARATE_QKV = {"q_proj": "wq", "k_proj": "wkv", "v_proj": "wkv"}
_OTHERS = {"o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def hf_to_titan_names(model_config) -> dict[str, str]:
    """{HF projection: the torchtitan module name it is in this model}, for the names present."""
    present = {fqn.rsplit(".", 1)[-1] for fqn, *_ in model_config.traverse(Linear.Config, recurse=True)}
    qkv = _FUSED_QKV if "wqkv" in present else _SEPARATE_QKV
    return {hf: titan for hf, titan in {**qkv, **_OTHERS}.items() if titan in present}


def check_settings(finetune) -> None:
    """What the plan refuses whatever the model: unknown names, rank <= 0, dropout."""
    unknown = [name for name in finetune.target_modules if name not in HF_PROJECTIONS]
    if unknown:
        raise ConfigError(
            f"finetune.target_modules: unknown module {', '.join(map(repr, unknown))}. "
            f"Valid (Hugging Face names): {', '.join(HF_PROJECTIONS)}."
        )
    if not finetune.target_modules:
        raise ConfigError(f"finetune.target_modules is empty: name at least one of {', '.join(HF_PROJECTIONS)}.")
    if finetune.rank <= 0:
        raise ConfigError(f"finetune.rank must be a positive integer, got {finetune.rank}.")
    if not finetune.alpha > 0:
        raise ConfigError(f"finetune.alpha must be > 0, got {finetune.alpha}.")
    if finetune.dropout != 0.0:
        raise ConfigError(
            f"finetune.dropout={finetune.dropout}: torchtitan 0.3.0's LoRALinear applies no dropout, "
            "so only 0.0 is supported (valid: 0.0)."
        )


def titan_targets(finetune, model_config) -> tuple[list[str], list[str]]:
    """(torchtitan module names to convert, HF names that match nothing in this model)."""
    names = hf_to_titan_names(model_config)
    wanted = set(finetune.target_modules)
    for titan in set(names.values()):
        sharing = sorted((hf for hf, t in names.items() if t == titan), key=HF_PROJECTIONS.index)
        if len(sharing) > 1 and 0 < len(wanted & set(sharing)) < len(sharing):
            raise ConfigError(
                f"finetune.target_modules={finetune.target_modules}: this model computes "
                f"{', '.join(sharing)} with one projection ({titan}); name all of them or none."
            )
    absent = [hf for hf in finetune.target_modules if hf not in names]
    targets = sorted({names[hf] for hf in finetune.target_modules if hf in names})
    if not targets:
        raise ConfigError(
            f"finetune.target_modules={finetune.target_modules} matches no Linear layer of this model "
            f"(it has: {', '.join(names) or 'none'})."
        )
    return targets, absent


def uncovered_note(finetune, model_config) -> str | None:
    """The plan's note for a model whose routed experts (or any named projection) get no adapters."""
    _, absent = titan_targets(finetune, model_config)
    has_experts = any(getattr(layer, "moe", None) is not None for layer in getattr(model_config, "layers", []))
    if not (absent or has_experts):
        return None
    parts = []
    if has_experts:
        parts.append(
            "routed experts (mlp.experts.*) get no LoRA adapters: torchtitan's LoRAConverter wraps "
            "Linear layers only and the experts are grouped 3-D weights; they stay frozen"
        )
    if absent:
        parts.append(f"{', '.join(absent)} match no Linear layer of this model (no dense MLP) and are skipped")
    return "finetune=lora: " + "; ".join(parts) + "."


def lora_converter(finetune, model_config) -> LoRAConverter.Config:
    targets, _ = titan_targets(finetune, model_config)
    return LoRAConverter.Config(rank=finetune.rank, alpha=finetune.alpha, target_modules=targets)


def with_lora(spec: ModelSpec, finetune) -> ModelSpec:
    """The spec with LoRA applied to its model config, as `model_registry(..., converters=[...])`
    does (the converter order check, then `convert`): base configs frozen, targets LoRALinear."""
    check_settings(finetune)
    converters = [lora_converter(finetune, spec.model)]
    validate_converter_order(converters)
    spec = copy.copy(spec)
    for converter in converters:
        spec.model = converter.build().convert(spec.model)
    return spec
