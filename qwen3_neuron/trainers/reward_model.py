"""trainer=reward_model (data=preference): torchtitan's trainer training a reward model, TRL's
RewardTrainer's objective (`trainers.reward_model_loss`).

The model carries a score head (`models.score_head`, converted into the model config before it is
built) and returns a score per position; each sequence of a packed pair is scored at its last
token (`data.packing.scored_document`, which keeps every token of it an input). The loss is the
mean over the pairs of the global batch, as DPO's (`trainers.preference_step`): `train_step` counts the
pairs of every microbatch on every data-parallel rank first (one all-reduce), each microbatch's
backward is its pairs' loss sum over that count, so torchtitan's logged loss (the microbatches'
sum, summed over the ranks) is that mean, and FSDP's summed gradients are its gradient.

Held-out pairs (`data.val_files` / `data.val_fraction`) give the same metrics (`accuracy`,
`margin`, ...); the last validation also writes every held-out pair's two scores with their
tokens (`held_out_scores/rank_N.jsonl`), so a reader sees which pairs the model gets wrong.

After the last step, with checkpointing=export_hf, the trained head is written beside the last HF
save (`models.hf.model_dir.score_head_path`): the HF save holds the causal LM's weights alone, and
the export (`hf_io.reward_model_export`) makes of both a Qwen3ForSequenceClassification dir.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import spmd_types as spmd
import torch
from torch.distributed.tensor import DTensor
from torchtitan.distributed import utils as dist_utils

from qwen3_neuron.data.packing import MARGINS, SEQUENCE_IDS
from qwen3_neuron.models.hf.model_dir import score_head_path
from qwen3_neuron.trainers.base import ObjectiveTrainer, held_out_loader
from qwen3_neuron.trainers.preference_step import METRIC_PREFIX, VALIDATION_PREFIX
from qwen3_neuron.trainers.reward_model_loss import (
    SUM_NAMES,
    mean_metrics,
    pair_losses,
    pair_metrics,
    pair_scores,
    step_loss,
)

HELD_OUT_SCORES = "held_out_scores"  # in the run dir: the last validation's pairs and scores, a file per rank


class RewardModelTrainer(ObjectiveTrainer):
    """trainer=reward_model: torchtitan's trainer with TRL's reward-model loss."""

    def __init__(self, config, *, settings, seed: int):
        super().__init__(config, settings=settings, seed=seed)
        self.center_rewards_coefficient = settings.reward_model.center_rewards_coefficient
        self._global_pairs = torch.ones((), device=self.device)
        self._sums, self._extremes = self._empty_metrics()
        if hasattr(getattr(self, "validator", None), "dl_config"):  # torchtitan's Validator, when enabled
            self.validator.validate = self.validate
        self.metrics_processor.step_metrics = self.step_metrics

    # ---- training --------------------------------------------------------------------------

    def train_step(self, data_iterator: Iterator) -> None:
        microbatches = [next(data_iterator) for _ in range(self.gradient_accumulation_steps)]
        pairs = sum(_pairs(input_dict[SEQUENCE_IDS]) for input_dict, _ in microbatches)
        self._global_pairs = self._dp_sum(torch.tensor(float(pairs), device=self.device))
        self._sums, self._extremes = self._empty_metrics()
        super().train_step(iter(microbatches))  # torchtitan's: the microbatch loop, optimizer, clipping

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        sequence_ids, margins = input_dict.pop(SEQUENCE_IDS), input_dict.pop(MARGINS)
        inputs, labels, extra_kwargs = self.post_dataloading_process(input_dict, labels)
        with self.train_context():
            scores = self.model_parts[0](inputs, **extra_kwargs).float()
            rewards, pair_margins, present = pair_scores(scores, sequence_ids, margins)
            losses = pair_losses(rewards, pair_margins, present, self.center_rewards_coefficient)
            loss = step_loss(losses, self._global_pairs)
            with spmd.no_typecheck():  # as torchtitan's own backward
                loss.backward()
        self._add_metrics(rewards, losses, present)
        return loss.detach()

    def step_metrics(self) -> dict[str, float]:
        """The step's metrics over the global batch (every rank calls this: two all-reduces)."""
        return {f"{METRIC_PREFIX}{name}": value for name, value in self._global_means().items()}

    def train(self):
        super().train()
        self._save_score_head()

    # ---- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, model_parts, step: int) -> None:
        """torchtitan's Validator's loop with the reward-model metrics: `validator.steps` batches of
        the held-out pairs, the loss their mean over pairs; the last step's pairs written out."""
        validator = self.validator
        model = model_parts[0]
        model.eval()
        loader = held_out_loader(validator)
        self._sums, self._extremes = self._empty_metrics()
        records = []
        for _, (input_dict, labels) in zip(range(validator.config.steps), loader):
            input_dict = {k: v.to(self.device) for k, v in input_dict.items()}
            sequence_ids, margins = input_dict.pop(SEQUENCE_IDS), input_dict.pop(MARGINS)
            tokens, positions = input_dict["input"], input_dict["positions"]
            inputs, labels, extra_kwargs = validator.post_dataloading_process(
                input_dict, labels.to(self.device), model_parts
            )  # the validator's own: the trainer's counts the tokens it trains on
            with validator.validation_context():
                scores = model(inputs, **extra_kwargs).float()
            rewards, pair_margins, present = pair_scores(scores, sequence_ids, margins)
            self._add_metrics(rewards, pair_losses(rewards, pair_margins, present, self.center_rewards_coefficient),
                              present)  # fmt: skip
            records += held_out_records(tokens, positions, sequence_ids, rewards, pair_margins)
        means = self._global_means()
        extra = {f"{VALIDATION_PREFIX}{METRIC_PREFIX}{name}": value for name, value in means.items()}
        validator.metrics_processor.log_validation(loss=means["loss"], step=step, extra_metrics=extra)
        if step == self.config.training.steps:
            self._write_held_out(records)
        self._sums, self._extremes = self._empty_metrics()
        model.train()

    # ---- shared ----------------------------------------------------------------------------

    def _empty_metrics(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(len(SUM_NAMES), device=self.device), torch.full((2,), -torch.inf, device=self.device)

    def _add_metrics(self, rewards, losses, present) -> None:
        sums, extremes = pair_metrics(rewards, losses, present)
        self._sums += sums
        self._extremes = torch.maximum(self._extremes, extremes)

    def _global_means(self) -> dict[str, float]:
        sums, extremes = self._dp_sum(self._sums), self._extremes.clone()
        if self.parallel_dims.dp_enabled:
            torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MAX,
                                         group=self.parallel_dims.get_mesh("batch").get_group())  # fmt: skip
        return mean_metrics(sums, extremes)

    def _dp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.parallel_dims.dp_enabled:
            return tensor
        return dist_utils.dist_sum_tensor(tensor, self.parallel_dims.get_mesh("batch"))

    def _write_held_out(self, records: list[dict]) -> None:
        folder = Path(self.config.dump_folder) / HELD_OUT_SCORES
        folder.mkdir(exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        (folder / f"rank_{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def _save_score_head(self) -> None:
        """checkpointing=export_hf: the trained head beside the last HF save, which leaves it out
        (every rank gathers its shard; rank 0 writes)."""
        from safetensors.torch import save_file

        checkpoint = self.config.checkpoint
        if not (checkpoint.enable and checkpoint.last_save_in_hf):
            return
        weight = self.model_parts[0].score.weight
        full = weight.full_tensor() if isinstance(weight, DTensor) else weight
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        path = score_head_path(Path(self.config.dump_folder) / checkpoint.folder / f"step-{self.step}")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"score.weight": full.detach().to("cpu", torch.float32).contiguous()}, str(path),
                  metadata={"format": "pt", "step": str(self.step)})  # fmt: skip


def _pairs(sequence_ids: torch.Tensor) -> int:
    """Pairs in a batch: sequence ids run 0..2P-1 in each sample (-1: no score)."""
    return int(((sequence_ids.max(dim=-1).values + 1) // 2).sum())


def held_out_records(tokens, positions, sequence_ids, rewards, margins) -> list[dict]:
    """Each pair of a batch: its chosen and rejected tokens (each sequence from its first token to
    its marked last one), their scores and the pair's margin."""
    slots = (sequence_ids.shape[1] + sequence_ids.shape[1] % 2) // 2  # pair slots a sample (`sequence_sums`)
    records = []
    for sample in range(tokens.shape[0]):
        marks = (sequence_ids[sample] >= 0).nonzero().flatten().tolist()  # one a sequence, in order
        for chosen_mark, rejected_mark in zip(marks[::2], marks[1::2]):
            pair = sample * slots + int(sequence_ids[sample, chosen_mark]) // 2
            ids = [tokens[sample, mark - int(positions[sample, mark]):mark + 1].tolist()
                   for mark in (chosen_mark, rejected_mark)]  # fmt: skip
            records.append({"chosen_ids": ids[0], "rejected_ids": ids[1], "chosen": float(rewards[pair, 0]),
                            "rejected": float(rewards[pair, 1]), "margin": float(margins[pair])})  # fmt: skip
    return records
