"""One trainer per objective, named by the `trainer` config group (`trainer=sft|dpo|orpo|simpo|kto|reward_model|grpo`).

Each is a subclass of torchtitan's `Trainer` (torchtitan's own extension pattern, as its Flux
trainer overrides `forward_backward_step` and `train_step`), built by the workers from the job
(`trainer_class`). What each data kind can feed, and which trainer it defaults to, is read here by
the launcher's checks without importing torchtitan.
"""

from __future__ import annotations

import importlib

# name -> (the module:class the workers build, the data kinds that feed it); the first trainer
# that a data kind feeds is its default
TRAINERS = {
    "sft": ("qwen3_neuron.trainers.base:SFTTrainer", ("tiny", "c4", "text", "chat", "mix")),
    "dpo": ("qwen3_neuron.trainers.dpo:DPOTrainer", ("preference",)),
    "orpo": ("qwen3_neuron.trainers.orpo:ORPOTrainer", ("preference",)),
    "simpo": ("qwen3_neuron.trainers.simpo:SimPOTrainer", ("preference",)),
    "kto": ("qwen3_neuron.trainers.kto:KTOTrainer", ("preference",)),
    "grpo": ("qwen3_neuron.trainers.grpo:GRPOTrainer", ("prompts",)),
    "reward_model": ("qwen3_neuron.trainers.reward_model:RewardModelTrainer", ("preference",)),
}

# The preference trainers that hold the starting model as their reference (finetune=full: a frozen
# copy of its weights; lora: its adapters off); ORPO and SimPO hold none. GRPO holds one when grpo.beta > 0.
KEEPS_REFERENCE = ("dpo", "kto")

# The trainers that score each packed sequence alone (a pair's chosen and rejected responses, KTO's
# completion and its mismatched one, a reward model's conversations): their model attends within a
# sequence only, on model=hf whatever model.flavor (`models.hf.spec.with_block_causal_mask`). SFT's
# flavour is the user's choice (`full`: causal over the packed sample); GRPO holds one completion a row.
SCORES_SEQUENCES_ALONE = ("dpo", "orpo", "simpo", "kto", "reward_model")


def default_trainer(data_kind: str) -> str:
    """The trainer a data kind means when `trainer` is not named."""
    return next(name for name, (_, kinds) in TRAINERS.items() if data_kind in kinds)


def trainer_class(name: str) -> type:
    module, _, cls = TRAINERS[name][0].partition(":")
    return getattr(importlib.import_module(module), cls)
