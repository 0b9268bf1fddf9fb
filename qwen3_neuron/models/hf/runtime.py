"""Fixes to torchtitan's Transformers backend as installed (torchtitan 0.3.0, transformers 5.23),
part of the model model=hf builds; made lazily (importing them pulls in transformers).

- `PinnedHFConfig`: keeps config.json's `attention_bias` / `mlp_bias`, which torchtitan's
  `update_from_config` would set to False (a model with biases would drop them on load);
- `HFModel.init_states`: also initialises the rotary `inv_freq` buffers (torchtitan rebuilds
  them only from a `rope_init_fn` Transformers 5.x no longer keeps: loss NaN at step 1 with
  trained weights) and the torchtitan MoE modules the backend swaps in (Transformers'
  `_init_weights` does not know them: uninitialised router weights, the bf16 loss NaN on CPU);
- finetune=lora: `PinnedHFConfig.with_lora` keeps what the fine-tuning gives it (an object with
  `add_to(model)` and `init_states(model, buffer_device)`: `finetune.lora.HFAdapters`), and
  `HFModel` has it change the Transformers model it builds, before torchtitan parallelises it,
  and initialise what it put in with the rest. The model knows no fine-tuning.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def pinned_config_class():
    global _PinnedHFConfig
    if _PinnedHFConfig is None:
        _PinnedHFConfig = _make_pinned_config_class()
    return _PinnedHFConfig


_PinnedHFConfig = None


def _make_pinned_config_class():
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
    from torchtitan.protocols.module import Module

    class HFModel(HFTransformerModel):
        """HFTransformerModel whose init also covers the torchtitan modules put into the
        Transformers model: the MoE the backend swaps in, finetune=lora's adapters."""

        def __init__(self, config) -> None:
            super().__init__(config)
            if config.lora is not None:
                config.lora.add_to(self)

        def init_states(self, *, buffer_device=None) -> None:
            super().init_states(buffer_device=buffer_device)
            _init_rotary_buffers(self.model)
            for layer in self.layers.values():
                moe = getattr(layer, "moe", None)
                if isinstance(moe, Module):
                    moe.init_states(buffer_device=buffer_device)
            if self.model.config.lora is not None:
                self.model.config.lora.init_states(self.model, buffer_device=buffer_device)

    class PinnedHFConfig(HFTransformerModel.Config):
        """HFTransformerModel.Config that keeps config.json's `PINNED_FROM_HF` fields."""

        _owner = HFModel

        def __init__(self, model_config, pinned_from_hf: dict[str, Any] | None = None, model_type: str = "", **kwargs):
            super().__init__(model_config, **kwargs)
            self._pinned_from_hf = dict(pinned_from_hf or {})
            self.model_type = model_type  # config.json's: which Transformers module builds it
            self._lora = None

        @property
        def lora(self):
            """finetune=lora: what the built model applies (`finetune.lora.HFAdapters`), else None.
            (Underscored underneath: `update_from_config` copies every public HF config key.)"""
            return self._lora

        def with_lora(self, lora) -> PinnedHFConfig:
            config = copy.copy(self)  # as the backend's own `_replace`: __init__ must not re-run
            config._lora = lora
            return config

        def update_from_config(self, *, config=None, **kwargs):
            super().update_from_config(config=config, **kwargs)
            for name, value in self._pinned_from_hf.items():
                setattr(self, name, value)
            return self

    return PinnedHFConfig


@contextmanager
def transformers_init_kept(model_type: str) -> Iterator[None]:
    """Put back what building a model through torchtitan's backend patches process-wide.

    The backend rewrites Transformers' weight init when it builds a model (`PreTrainedModel`'s
    `_init_weights` / `_initialize_weights`, the decoder layer's `__init__`): right for a worker
    that trains it, wrong for the launcher, which builds one on the meta device only to count
    it and later loads Transformers models of its own (the export check).
    """
    from transformers import PreTrainedModel

    owners: list[type] = [PreTrainedModel]
    try:
        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        owners += [c for c in vars(modeling).values() if isinstance(c, type) and c.__module__ == modeling.__name__]
    except ImportError:  # a model of remote code: only PreTrainedModel's own methods are known
        pass
    names = ("__init__", "_init_weights", "_initialize_weights")
    saved = {(owner, name): owner.__dict__[name] for owner in owners for name in names if name in owner.__dict__}
    try:
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


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


