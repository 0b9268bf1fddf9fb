"""trainer=reward_model: a scalar score head on the model, put in by a torchtitan model converter.

`ScoreHeadConverter` is a `ModelConfigConverter`, as torchtitan's LoRAConverter is: it changes the
model config before anything is built, so the head is built with the model (on the meta device),
initialised with it, and parallelised with it; nothing is replaced on a built model. The
converted config builds a subclass of the model's own class (`scored_model_class`) which adds
`score`, a bias-free Linear(dim -> 1) as Transformers' `Qwen3ForSequenceClassification` has it,
and whose forward returns the score of every position, [batch, seq] (the final norm's hidden
states through `score`; `lm_head` is kept, unused, so that the HF weights load as they are).
A sequence's score is the one at its last token (`trainers.reward_model`), as Transformers reads
it at the last token that is not padding.

The same subclass serves both backends. model=native: torchtitan's Qwen3 (its children include
`score`, so FSDP shards it with the root module). model=hf: torchtitan's Transformers backend
lists the children FSDP walks by hand (`named_children`), so the subclass adds `score` to them,
and its weight init (Transformers' `_init_weights`) does not know the head, so the subclass
initialises it: normal(0, 0.02), Transformers' `initializer_range` for Qwen3, as
`AutoModelForSequenceClassification` starts a new head. Each packed sequence is scored alone:
the trainer is among `trainers.SCORES_SEQUENCES_ALONE`, whose model=hf mask is block-causal.

The head is no weight of the causal LM the run loads: the spec's state-dict adapter leaves
`score.*` out of the HF keys (`with_score_head`), so the HF load reads the base alone; the
trainer writes the trained head beside the last HF save for the export.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache, partial

from torch import nn
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.model import ModelConfigConverter
from torchtitan.protocols.model_spec import ModelSpec

from qwen3_neuron.models.hf.model_dir import SCORE_MODULE

INIT_STD = 0.02  # Qwen3's initializer_range (torchtitan's backend sets the config's to 1.0 for its own init)


def is_score_key(key: str) -> bool:
    return key == SCORE_MODULE or key.startswith(f"{SCORE_MODULE}.")


class ScoreHeadConverter(ModelConfigConverter):
    """The model config -> one whose model has a score head (`scored_model_class`)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        pass

    def __init__(self, config: Config, **kwargs):
        self.config = config

    def convert(self, model_config):
        scored = scored_model_class(type(model_config))
        # the config as it is, its class the scored model's: copied as torchtitan's Transformers
        # backend copies its configs (`_replace`: their __init__ cannot run again); the subclass
        # adds no field, so the object keeps its layout
        converted = copy.copy(model_config)
        converted.__class__ = scored.Config
        return converted


def with_score_head(spec: ModelSpec) -> ModelSpec:
    """The spec with the score head converted in, and an HF state-dict adapter without it."""
    spec = copy.copy(spec)
    spec.model = ScoreHeadConverter.Config().build().convert(spec.model)
    spec.state_dict_adapter = _without_score(spec.state_dict_adapter)
    return spec


@cache
def scored_model_class(config_cls: type) -> type:
    """The subclass of `config_cls`'s model class with a score head; its `Config` subclasses `config_cls`."""
    model_cls = config_cls._owner

    class ScoredModel(model_cls):
        Config = dataclass(kw_only=True, slots=True, init=False)(
            type(f"Scored{config_cls.__name__}", (config_cls,), {"__module__": __name__})
        )  # init=False: the config keeps its own __init__ (the Transformers backend's takes no fields)

        def __init__(self, config) -> None:
            super().__init__(config)
            init = {"weight": partial(nn.init.normal_, std=INIT_STD)}
            self.score = Linear.Config(in_features=config.dim, out_features=1, bias=False, param_init=init).build()

        def forward(self, *args, **kwargs):
            """[batch, seq] scores: the final hidden states (lm_head skipped) through `score`."""
            skipped, self._skip_lm_head = self._skip_lm_head, True
            try:
                hidden = super().forward(*args, **kwargs)
            finally:
                self._skip_lm_head = skipped
            return self.score(hidden).squeeze(-1)

        def named_children(self):
            names = set()
            for name, child in super().named_children():
                names.add(name)
                yield name, child
            score = self._modules.get(SCORE_MODULE)  # none yet while the model's own __init__ runs
            if score is not None and SCORE_MODULE not in names:  # the Transformers backend lists its children by hand
                yield SCORE_MODULE, score

        def init_states(self, *, buffer_device=None) -> None:
            super().init_states(buffer_device=buffer_device)
            self.score.init_states(buffer_device=buffer_device)  # the Transformers backend's init skips it

    ScoredModel.__name__ = ScoredModel.__qualname__ = f"Scored{model_cls.__name__}"
    return ScoredModel


@cache
def _without_score(state_dict_adapter: type) -> type:
    """The HF state-dict adapter without the score head: the HF load reads, and the HF save writes,
    the causal LM's weights alone (the trainer writes the head beside the save)."""

    class WithoutScore(state_dict_adapter):
        def to_hf(self, state_dict):
            return super().to_hf({k: v for k, v in state_dict.items() if not is_score_key(k)})

    return WithoutScore
