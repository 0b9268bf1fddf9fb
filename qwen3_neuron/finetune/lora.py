"""finetune=lora: torchtitan's LoRAConverter on every backend, so that one adapter class
(`LoRALinear`: frozen base `weight`, trainable `lora_a` / `lora_b`) trains, checkpoints and exports
the same way whatever the model.

- model=native, model=moe (torchtitan's own Qwen3): Hugging Face projection names -> the model's
  `Linear` configs -> `LoRAConverter.Config`, applied to the model spec the way torchtitan's
  `model_registry(flavor, converters=[...])` applies it. The converter matches a module by the
  last segment of its config's FQN, so the unit it can target is one `Linear.Config`. Qwen3 fuses
  q/k/v into one `wqkv` (every flavour but `debugmodel_non_fused_qkv`, whose `wk` and `wv` still
  share one `wkv` config): HF names that land on one config must be named together.
- model=hf (the Transformers backend): Transformers builds plain `nn.Linear` layers, so the model
  config holds no `Linear.Config` to convert. The spec's model config keeps the converter's
  settings (`with_lora`: `HFAdapters`), and the model, once Transformers has built it (`add_hf_adapters`,
  called by `models.hf.runtime.HFModel`), freezes every weight and puts in place of each targeted
  `nn.Linear` the `LoRALinear` the converter makes of that layer's `Linear.Config`: q/k/v are
  separate there, the HF names are the module names, and a weight keeps its key (`q_proj.weight`),
  so HF loads and saves see the base as they would without LoRA.

finetune.dropout (PEFT's lora_dropout): torchtitan 0.3.0's LoRALinear has none. `LoRADropoutConverter`
is its converter making a subclass of its layer that drops the adapter's input only (y = W x +
alpha/r * B A dropout(x)); with dropout 0 it makes torchtitan's layer itself. No parameter is
added, so keys, checkpoints and exports are the same.

MoE layers have no dense MLP and their routed experts are grouped 3-D weights, not `Linear`s:
they get no adapters, and the plan says so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from functools import cache

from torch.nn import functional as F
from torchtitan.components.lora import LoRAConverter
from torchtitan.models.common.linear import Linear
from torchtitan.models.utils import validate_converter_order
from torchtitan.protocols.model_spec import ModelSpec

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.finetune.adapter_save import is_adapter_key
from qwen3_neuron.finetune.names import ADAPTER_MODULES, HF_PROJECTIONS
from qwen3_neuron.hf_backend import HF_BACKEND_NAME

# `finetune` below is the plan's `finetune` section (job.settings.FinetuneSettings): read by
# attribute, never imported, so that finetune stays below the config stage that builds with it.

# HF projection -> torchtitan module name (last FQN segment), per q/k/v layout.
_FUSED_QKV = {"q_proj": "wqkv", "k_proj": "wqkv", "v_proj": "wqkv"}
_SEPARATE_QKV = {"q_proj": "wq", "k_proj": "wkv", "v_proj": "wkv"}
_OTHERS = {"o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# model=hf: the projections the backend shards rowwise under TP (the rest colwise); LoRALinear
# derives its adapters' sharding from its base's.
_HF_ROWWISE = ("o_proj", "down_proj")


class LoRADropoutConverter(LoRAConverter):
    """torchtitan's LoRAConverter, with `dropout` on the adapters' input."""

    @dataclass(kw_only=True, slots=True)
    class Config(LoRAConverter.Config):
        dropout: float = 0.0
        """Probability of zeroing an element of the adapter's input while training (0 <= p < 1)."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        self.dropout = config.dropout

    def _make_lora_config(self, cfg: Linear.Config):
        lora_config = super()._make_lora_config(cfg)
        if not self.dropout:
            return lora_config
        with_dropout = _lora_with_dropout(lora_config._owner)
        values = {f.name: getattr(lora_config, f.name) for f in fields(lora_config) if f.init}
        return with_dropout.Config(**values, dropout=self.dropout)


_with_dropout_classes: dict[type, type] = {}


def _lora_with_dropout(lora_cls: type) -> type:
    """The subclass of torchtitan's LoRALinear class `lora_cls` that drops the adapter's input."""
    if lora_cls in _with_dropout_classes:
        return _with_dropout_classes[lora_cls]

    class LoRALinearWithDropout(lora_cls):
        @dataclass(kw_only=True, slots=True)
        class Config(lora_cls.Config):
            dropout: float

        def __init__(self, config: Config) -> None:
            super().__init__(config)
            self._lora_dropout = config.dropout

        def forward(self, input):
            base_out = super(lora_cls, self).forward(input)  # the base Linear's own forward
            adapter_input = F.dropout(input, self._lora_dropout, self.training)
            return base_out + self._lora_scaling * self.lora_b(self.lora_a(adapter_input))

    LoRALinearWithDropout.__name__ = LoRALinearWithDropout.__qualname__ = f"{lora_cls.__name__}WithDropout"
    _with_dropout_classes[lora_cls] = LoRALinearWithDropout
    return LoRALinearWithDropout


def hf_to_titan_names(model_config) -> dict[str, str]:
    """{HF projection: the torchtitan module name it is in this model}, for the names present."""
    present = {fqn.rsplit(".", 1)[-1] for fqn, *_ in model_config.traverse(Linear.Config, recurse=True)}
    qkv = _FUSED_QKV if "wqkv" in present else _SEPARATE_QKV
    return {hf: titan for hf, titan in {**qkv, **_OTHERS}.items() if titan in present}


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


def uncovered_note(finetune, model_config, model=None) -> str | None:
    """The plan's note for a model whose routed experts (or any named projection) get no adapters.
    `model`: model=hf's model as built (meta device), whose nn.Linear layers its config does not list."""
    if model is None:
        _, absent = titan_targets(finetune, model_config)
        has_experts = any(getattr(layer, "moe", None) is not None for layer in getattr(model_config, "layers", []))
    else:
        absent = hf_absent_targets(finetune, model)
        has_experts = bool(getattr(model_config, "is_moe", False))
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


def hf_absent_targets(finetune, model) -> list[str]:
    """model=hf: the named projections that got no adapter in the built model; ConfigError when
    none got one (a model whose Transformers layers are named otherwise)."""
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _has_adapters(module)}
    if not adapted:
        from torch import nn

        linears = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
        raise ConfigError(
            f"finetune.target_modules={finetune.target_modules} matches no Linear layer of this model "
            f"(its Linear layers: {', '.join(sorted(linears)) or 'none'})."
        )
    return [hf for hf in finetune.target_modules if hf not in adapted]


def lora_converter(finetune, model_config) -> LoRADropoutConverter.Config:
    targets, _ = titan_targets(finetune, model_config)
    return _converter_config(finetune, targets)


def _converter_config(finetune, target_modules: list[str]) -> LoRADropoutConverter.Config:
    return LoRADropoutConverter.Config(
        rank=finetune.rank, alpha=finetune.alpha, dropout=finetune.dropout, target_modules=target_modules
    )


def with_lora(spec: ModelSpec, finetune) -> ModelSpec:
    """The spec with LoRA applied to its model config, as `model_registry(..., converters=[...])`
    does (the converter order check, then `convert`): base configs frozen, targets LoRALinear.
    model=hf: the config keeps the converter for the model to apply (`HFAdapters`), and the
    spec's HF state-dict adapter leaves the adapters out."""
    spec = copy.copy(spec)
    if spec.name == HF_BACKEND_NAME:
        spec.model = spec.model.with_lora(HFAdapters(_converter_config(finetune, list(finetune.target_modules))))
        spec.state_dict_adapter = _without_adapters(spec.state_dict_adapter)
        return spec
    converters = [lora_converter(finetune, spec.model)]
    validate_converter_order(converters)
    for converter in converters:
        spec.model = converter.build().convert(spec.model)
    return spec


# ---- model=hf: on the model Transformers built ---------------------------------------------------


@dataclass(frozen=True)
class HFAdapters:
    """What the model=hf config keeps (`models.hf.runtime.PinnedHFConfig.with_lora`) and its model
    calls once Transformers has built it: LoRA wraps the model, the model knows no fine-tuning."""

    lora: LoRADropoutConverter.Config

    def add_to(self, model) -> None:
        add_hf_adapters(model, self.lora)

    def init_states(self, model, buffer_device=None) -> None:
        init_hf_adapters(model, buffer_device=buffer_device)


@cache
def _without_adapters(state_dict_adapter: type) -> type:
    """The HF state-dict adapter without the LoRA adapters: they are no HF weights, so the HF load
    reads, and the HF save writes, the base alone (the adapters go their own way: adapter_save)."""

    class WithoutAdapters(state_dict_adapter):
        def to_hf(self, state_dict):
            return super().to_hf({k: v for k, v in state_dict.items() if not is_adapter_key(k)})

    return WithoutAdapters


def add_hf_adapters(model, lora: LoRADropoutConverter.Config) -> None:
    """Freeze `model` (an HFTransformerModel as built, before parallelisation) and put a LoRALinear
    in place of each nn.Linear named in `lora.target_modules`, keeping its weight (and bias)
    parameter; the MoE blocks the backend swaps in later (`_native_moe_config`) are built frozen."""
    from torch import nn
    from torchtitan.models.common.decoder_sharding import colwise_config, rowwise_config
    from torchtitan.tools.logging import logger

    model.requires_grad_(False)
    moe_layers = [layer for layer in model.layers.values() if getattr(layer, "_native_moe_config", None) is not None]
    swapped_out = {id(module) for layer in moe_layers for module in layer.mlp.modules()}
    # target_modules=None: the converter turns the one Linear.Config it is given into LoRALinear's
    to_lora = LoRADropoutConverter.Config(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout).build()
    adapted = []
    for parent_name, parent in list(model.named_modules()):
        for name, linear in list(parent.named_children()):
            if name not in lora.target_modules or type(linear) is not nn.Linear or id(linear) in swapped_out:
                continue
            base = Linear.Config(
                in_features=linear.in_features,
                out_features=linear.out_features,
                bias=linear.bias is not None,
                sharding_config=rowwise_config() if name in _HF_ROWWISE else colwise_config(),
            )
            lora_linear = to_lora.convert(base).build().to(device=linear.weight.device, dtype=linear.weight.dtype)
            lora_linear.weight, lora_linear.bias = linear.weight, linear.bias  # frozen above
            setattr(parent, name, lora_linear)
            adapted.append(name)
    if moe_layers:  # non-target configs become frozen ones (target_modules=[]: none is a target)
        frozen = LoRAConverter.Config(rank=lora.rank, alpha=lora.alpha, target_modules=[]).build()
        for layer in moe_layers:
            layer._native_moe_config = frozen.convert(layer._native_moe_config)
    names = ", ".join(sorted(set(adapted), key=HF_PROJECTIONS.index))
    logger.info(f"finetune=lora: LoRALinear in place of {len(adapted)} Transformers Linear layers ({names})")


def init_hf_adapters(model, buffer_device=None) -> None:
    """Initialise the adapters `add_hf_adapters` put in (torchtitan's init: A Kaiming-uniform,
    B zero): Transformers' `_init_weights`, which inits the rest, does not know them."""
    for module in model.modules():
        if _has_adapters(module):
            for name in ADAPTER_MODULES:
                getattr(module, name).init_states(buffer_device=buffer_device)


def _has_adapters(module) -> bool:
    return all(hasattr(module, name) for name in ADAPTER_MODULES)
