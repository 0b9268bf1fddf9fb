"""data=prompts: torchtitan's trainer takes GRPO steps (the objective: `trainers.grpo_loss`).

The seam is DPO's (`trainers.preference_step`): the built trainer's `train_step` and
`forward_backward_step` are replaced; the optimizer, clipping, LR schedule, checkpoints and
metrics stay torchtitan's. A step:

1. generation (every `grpo.num_iterations` steps): each rank takes its prompts (a rank's batch of
   local_batch_size x accumulation completions, `num_generations` per prompt) and samples the
   completions from the current policy (LoRA adapters on), a batch of `local_batch_size` at a
   time, in a buffer [local_batch_size, seq_len]: prompt, completion and padding. With a KV cache
   (`generation.kv_cache`): one forward of the prompts, then one of each sampled token alone; FSDP's
   parameters gathered once for the whole generation. Eager, the prompts' forward is as wide as
   the longest prompt; a compiled model (`compile.enable`, Neuron's one compile) keeps fixed-size
   cache buffers, forwards the buffer's first 128, 256, ... or seq_len columns for the prompts and
   [local_batch_size, 1] per token: a bounded set of graphs, each compiled once.
   Every rank runs the same number of forwards whatever its completions (FSDP gathers in step).
   Sampling is TRL's (temperature, then top-p, Transformers' own logits warpers), seeded by the
   step and the rank;
   a completion ends at the tokenizer's end-of-turn (<|im_end|>, kept in it) or at
   `max_completion_length` (then counted as clipped). With `grpo.tools` / `grpo.environment` a
   completion is several turns with tool calls between them (`generation.rollout`): only the
   policy's own tokens are labels, and the rewards get TRL's message lists;
2. rewards on each rank (`rewards.calls`), gathered over the data-parallel ranks: advantages
   over the global batch, as TRL's; each rank keeps its own completions' advantages;
3. torchtitan's `train_step` over the microbatches of completions: per-token log-probabilities
   through the chunked lm_head (`models.logprobs`) at `grpo.temperature`, the distribution the
   completions were sampled from (TRL's), the clipped surrogate, the loss normalised
   by the global batch's completions or tokens (FSDP sums the ranks' gradients).
With `num_iterations` > 1 the sampling policy's log-probabilities are kept for the ratio; with
`beta` > 0 the reference is the model with its LoRA adapters off (finetune=lora) or a frozen copy
of the starting weights (finetune=full, DPO's `FrozenReference`, a checkpoint state too). The
prompts in hand and the kept generation batch are a checkpoint state, so a resume goes on as
the uninterrupted run.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import spmd_types as spmd
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.distributed import utils as dist_utils

from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_field
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.trainers.grpo_loss import (
    TOKEN_METRICS,
    advantages,
    batch_loss,
    nanstd,
    token_metric_means,
    token_metric_sums,
    token_terms,
    total_rewards,
)
from qwen3_neuron.generation.kv_cache import StaticCache, gathered
from qwen3_neuron.generation.rollout import Rollout, Rollouts, tool_metrics
from qwen3_neuron.generation.sampling import Sampler, logits_warpers
from qwen3_neuron.generation.tools import FAILURES, environment_reward, load_tools
from qwen3_neuron.models.logprobs import model_token_logps
from qwen3_neuron.rewards.calls import Rewards, load_rewards
from qwen3_neuron.trainers.base import StepTrainer, held_out_loader
from qwen3_neuron.trainers.reference import FrozenReference, adapters_off
from qwen3_neuron.hf_backend import HF_BACKEND_NAME

METRIC_PREFIX = "grpo/"  # the step's GRPO metrics in torchtitan's metrics dict
VALIDATION_PREFIX = "validation_metrics/"  # torchtitan's, for a validation's
END_OF_TURN = "<|im_end|>"
ADVANTAGES, OLD_LOGPS, REFERENCE_LOGPS = "grpo_advantages", "grpo_old_logps", "grpo_reference_logps"
CHECKPOINT_KEY = "grpo_generation"  # each rank's prompts in hand and kept generation batch, in torchtitan's checkpoints
REFERENCE_KEY = "grpo_reference"  # finetune=full with beta > 0: the frozen starting weights, in the checkpoints


@dataclass
class Generation:
    """One generation batch of this rank: its training microbatches, and what the metrics report."""

    microbatches: list[tuple[dict, torch.Tensor]]
    completions: float  # of the global batch
    tokens: float  # completion tokens of the global batch
    metrics: dict[str, float]


class GRPOStep(Stateful):
    """GRPO in place of the trainer's language-model loss: `GRPOTrainer`'s step. `base_train_step`
    is torchtitan's own (the microbatch loop), which this step's `train_step` runs. A checkpoint
    state: the prompts pulled but not yet generated from and the generation batch still in use
    (`num_iterations` > 1) are this rank's, and a resume goes on with them as the run would have."""


    def __init__(self, trainer, grpo, seed: int, lora: bool, base_train_step: Callable[[Iterator], None]):
        self.trainer, self.grpo, self.seed = trainer, grpo, seed
        # the KL's reference: finetune=lora's model with its adapters off; finetune=full's a frozen copy
        self.frozen = FrozenReference(trainer.model_parts[0]) if grpo.beta and not lora else None
        self.tools = load_tools(grpo.tools, grpo.environment, grpo.tool_timeout_s)
        self.rewards = rewards_of(grpo, self.tools, trainer.device)
        tokenizer = trainer.tokenizer
        self.tokenizer = tokenizer
        self.end_id = tokenizer.tokenizer.token_to_id(END_OF_TURN)
        source = trainer.dataloader.packed_datasets[0].source
        self.prompt_field = prompt_field(source)
        hf_backend = trainer.config.model_spec.name == HF_BACKEND_NAME
        # a compiled model (Neuron's one compile) generates on fixed-size buffers, two graphs
        compile_ = trainer.config.compile
        self.sampler = Sampler(
            end_id=self.end_id, pad_id=tokenizer.eos_id or 0, max_completion_length=grpo.max_completion_length,
            warpers=logits_warpers(grpo.temperature, grpo.top_p), hf_backend=hf_backend,
            static_cache=StaticCache(compile_.backend) if compile_.enable else None,
            model_inputs=lambda ids: self._model_inputs(ids, self._positions(ids))[1],
        )  # fmt: skip
        # grpo.tools / grpo.environment: turns with tool calls between them, on the same kind of cache
        self.rollout = None if self.tools is None else Rollout(
            tools=self.tools, tokenizer=tokenizer, source=source, end_id=self.end_id, pad_id=self.sampler.pad_id,
            end_of_turn=END_OF_TURN, max_completion_length=grpo.max_completion_length,
            max_iterations=grpo.max_tool_calling_iterations, warpers=self.sampler.warpers, hf_backend=hf_backend,
            static_cache=self.sampler.static_cache,
        )  # fmt: skip
        self._train_step = base_train_step
        self._generation: Generation | None = None
        self._steps_on_generation = 0
        self._waiting: list[tuple[torch.Tensor, int, dict]] = []  # prompts pulled, not yet generated from
        self._sums = torch.zeros(len(TOKEN_METRICS))
        self._tool_totals = {"calls": 0.0, "failures": 0.0, "timeouts": 0.0}  # the run's, over its generations
        self._started = 0.0

    def register(self) -> None:
        """The step's metrics, held-out measure and checkpoint states, in the trainer's components."""
        self.trainer.metrics_processor.step_metrics = self.step_metrics
        self.trainer.checkpointer.states[CHECKPOINT_KEY] = self
        if self.frozen is not None:
            self.trainer.checkpointer.states[REFERENCE_KEY] = self.frozen
        if hasattr(getattr(self.trainer, "validator", None), "dl_config"):  # torchtitan's Validator, when enabled
            self.trainer.validator.validate = self.validate

    def state_dict(self) -> dict:
        # bytes under a key of this data-parallel rank, as torchtitan keeps its dataloaders' states
        kept = io.BytesIO()
        torch.save({"waiting": self._waiting, "generation": self._generation, "steps": self._steps_on_generation,
                    "tool_totals": self._tool_totals}, kept)  # fmt: skip
        return {f"dp_rank_{self._dp_rank()}": kept.getvalue(), "world_size": self._dp_world_size()}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict["world_size"] != self._dp_world_size():
            raise ConfigError(f"run.resume: this GRPO run's checkpoint was saved by {state_dict['world_size']} "
                              f"data-parallel ranks and is resumed on {self._dp_world_size()}; its prompts in hand "
                              "belong to those ranks: resume it with the parallelism it was saved with")  # fmt: skip
        # on the CPU: generation and torchtitan's train_step move what they take to the device
        kept = torch.load(io.BytesIO(state_dict[f"dp_rank_{self._dp_rank()}"]), map_location="cpu", weights_only=False)
        self._waiting, self._generation, self._steps_on_generation = kept["waiting"], kept["generation"], kept["steps"]
        self._tool_totals = kept.get("tool_totals", self._tool_totals)

    # ---- the step --------------------------------------------------------------------------

    def train_step(self, data_iterator: Iterator) -> None:
        self._started = time.perf_counter()
        if self.frozen is not None and not int(self.frozen.taken):
            self.frozen.take()  # the starting weights: torchtitan loaded them before the first step
        processor = self.trainer.metrics_processor
        tokens, loads = processor.ntokens_since_last_log, len(processor.data_loading_times)
        if self._generation is None or self._steps_on_generation == self.grpo.num_iterations:
            self._generation = self._generate(data_iterator)
            self._steps_on_generation = 0
        # torchtitan's throughput counts the tokens trained (prompt, completion and padding), not the prompts read
        trained = sum(labels.numel() for _, labels in self._generation.microbatches)
        processor.ntokens_since_last_log = tokens + trained
        if len(processor.data_loading_times) == loads:
            processor.data_loading_times.append(0.0)  # a step on the kept generation batch reads no data
        self._steps_on_generation += 1
        self._sums = torch.zeros(len(TOKEN_METRICS), device=self.trainer.device)
        self._train_start = time.perf_counter()
        self._train_step(iter(self._generation.microbatches))

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        trainer, generation = self.trainer, self._generation
        input_dict = dict(input_dict)  # the kept generation batch's own stays whole for its next step
        advantages_, old = input_dict.pop(ADVANTAGES), input_dict.pop(OLD_LOGPS)
        reference = input_dict.pop(REFERENCE_LOGPS)
        inputs, labels, extra_kwargs = trainer.post_dataloading_process(input_dict, labels)
        model = trainer.model_parts[0]
        with trainer.train_context():
            logps = model_token_logps(model, inputs, labels, extra_kwargs, temperature=self.grpo.temperature)
            terms = token_terms(logps, old, advantages_, labels != IGNORE_INDEX, epsilon=self.grpo.epsilon,
                                epsilon_high=self.grpo.epsilon_high, beta=self.grpo.beta, reference_logps=reference)  # fmt: skip
            loss = batch_loss(terms, self.grpo.loss_type, completions=generation.completions, tokens=generation.tokens,
                              max_completion_length=self.grpo.max_completion_length)  # fmt: skip
            with spmd.no_typecheck():  # as torchtitan's own backward
                loss.backward()
        self._sums += token_metric_sums(terms)
        return loss.detach()

    def step_metrics(self) -> dict[str, float]:
        """The step's GRPO metrics over the global batch (every rank calls this: one all-reduce)."""
        metrics = {**self._generation.metrics, **token_metric_means(self._dp_sum(self._sums), self.grpo.beta)}
        metrics["training_seconds"] = time.perf_counter() - self._train_start
        return {f"{METRIC_PREFIX}{name}": value for name, value in metrics.items()}

    # ---- generation ------------------------------------------------------------------------

    @torch.no_grad()
    def _generate(self, data_iterator: Iterator) -> Generation:
        trainer, grpo = self.trainer, self.grpo
        started = time.perf_counter()
        batch = trainer.config.training.local_batch_size
        prompts = batch * trainer.gradient_accumulation_steps // grpo.num_generations
        while len(self._waiting) < prompts:
            input_dict, _ = next(data_iterator)
            for ids, length, row in zip(input_dict["input"], input_dict[PROMPT].tolist(), input_dict[ROW]):
                self._waiting.append((ids, length, json.loads(row)))
        taken, self._waiting = self._waiting[:prompts], self._waiting[prompts:]
        repeated = [p for p in taken for _ in range(grpo.num_generations)]
        model = trainer.model_parts[0]
        model.eval()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + trainer.step * 1009 + self._dp_rank())
        sequences = []
        with gathered(model):  # FSDP's all-gathers once for the whole generation, not per token
            for start in range(0, len(repeated), batch):
                chunk = repeated[start:start + batch]
                ids = torch.stack([ids for ids, _, _ in chunk]).to(trainer.device)
                prompt_lengths = torch.tensor([length for _, length, _ in chunk], device=trainer.device)
                sequences.append(self._rolled_out(model, ids, prompt_lengths, [row for _, _, row in chunk], generator))
        # the policy's own tokens (TRL's completion lengths: a tool's answer is not the completion's)
        completion_lengths = torch.cat([r.trained.sum(1) for r in sequences])
        generation_seconds = time.perf_counter() - started

        scoring = time.perf_counter()
        local_scores = self._score(sequences, [row for _, _, row in repeated])
        scores = self._dp_gather(local_scores)
        rewards = total_rewards(scores, torch.tensor(self.rewards.weights, device=scores.device))
        all_advantages, zero_std = advantages(rewards, grpo.num_generations, grpo.scale_rewards)
        rank, count = self._dp_rank(), local_scores.shape[0]
        local_advantages = all_advantages[rank * count:(rank + 1) * count]
        scoring_seconds = time.perf_counter() - scoring

        all_lengths = self._dp_gather(completion_lengths.float().unsqueeze(1)).squeeze(1)
        metrics = {**self._reward_metrics(scores, rewards), "frac_reward_zero_std": float(zero_std.float().mean()),
                   **self._length_metrics(sequences, all_lengths), **self._tool_metrics(sequences, totals=True),
                   "generation_seconds": generation_seconds, "scoring_seconds": scoring_seconds}  # fmt: skip
        microbatches = self._microbatches(model, sequences, local_advantages)
        model.train()
        return Generation(microbatches, float(all_lengths.numel()), float(all_lengths.sum()), metrics)

    def _rolled_out(self, model, ids, prompt_lengths, rows: list[dict], generator) -> Rollouts:
        if self.rollout is not None:
            return self.rollout.sample(model, ids, prompt_lengths, rows, generator)
        return Rollouts.one_turn(ids, prompt_lengths, self.sampler.sample(model, ids, prompt_lengths, generator),
                                 self.end_id)  # fmt: skip

    def _score(self, sequences: list[Rollouts], rows: list[dict]) -> torch.Tensor:
        """[completions, reward functions] of this rank's completions (TRL's call of each function):
        with tools, each completion is its message list and the prompt as sampled from."""
        completion_ids = [ids[p:p + n].tolist() for r in sequences
                          for ids, p, n in zip(r.ids, r.prompt_lengths.tolist(), r.lengths.tolist())]  # fmt: skip
        columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != self.prompt_field}
        if self.rollout is not None:
            prompt_values = [prompt for r in sequences for prompt in r.prompts]
            completions = [messages for r in sequences for messages in r.completions]
            if self.tools.environment is not None:
                columns["environments"] = [environment for r in sequences for environment in r.environments]
        else:
            texts = [self.tokenizer.decode([t for t in ids if t != self.end_id]) for ids in completion_ids]
            prompt_values = [row[self.prompt_field] for row in rows]
            completions = [[{"role": "assistant", "content": text}] if not isinstance(p, str) else text
                           for p, text in zip(prompt_values, texts)]  # fmt: skip
        return self.rewards.score(prompt_values, completions, completion_ids, columns).to(self.trainer.device)

    def _reward_metrics(self, scores: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        metrics = {"reward": float(torch.nanmean(rewards)), "reward_std": float(nanstd(rewards))}
        for index, name in enumerate(self.rewards.names):
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(scores[:, index]))
            metrics[f"rewards/{name}/std"] = float(nanstd(scores[:, index]))
        return metrics

    def _length_metrics(self, sequences: list[Rollouts], all_lengths: torch.Tensor) -> dict[str, float]:
        clipped = self._dp_gather(torch.cat([r.clipped for r in sequences]).float().unsqueeze(1)).squeeze(1)
        return {"completions/mean_length": float(all_lengths.mean()), "completions/max_length": float(all_lengths.max()),
                "completions/clipped_ratio": float(clipped.mean())}  # fmt: skip

    def _tool_metrics(self, sequences: list[Rollouts], totals: bool = False) -> dict[str, float]:
        """With tools: TRL's tools/call_frequency and tools/failure_frequency, and the counts, of the
        global batch; `totals`: the run's calls, failures and timeouts so far too (tools/run_*)."""
        if self.rollout is None:
            return {}
        counts = self._dp_gather(torch.cat([r.tool_counts for r in sequences]).to(self.trainer.device))
        metrics = tool_metrics(counts.sum(0), counts.shape[0], self.tools)
        if totals:
            failures = sum(metrics[f"tools/failures/{kind}"] for kind in FAILURES)
            batch = {"calls": metrics["tools/calls"], "failures": failures, "timeouts": metrics["tools/failures/timeout"]}
            self._tool_totals = {name: total + batch[name] for name, total in self._tool_totals.items()}
            metrics |= {f"tools/run_{name}": total for name, total in self._tool_totals.items()}
        return metrics

    # ---- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, model_parts, step: int) -> None:
        """torchtitan's Validator's loop with GRPO's measure: `validator.steps` batches of the
        held-out prompts, one completion each, sampled as in training from a generator seeded
        the same at every validation (so two validations differ by the policy only), scored by
        the rewards. Logged as `val_reward` (and per function, and the completions' lengths)."""
        validator, trainer = self.trainer.validator, self.trainer
        model = model_parts[0]
        model.eval()
        loader = held_out_loader(validator)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 + self._dp_rank())
        batches = list(itertools.islice(loader, validator.config.steps))
        # every rank samples as many batches (FSDP gathers each forward's weights on all of them)
        count = int(self._dp_min(torch.tensor(len(batches), device=trainer.device)))
        if count == 0:  # a rank without held-out prompts (the plan checks the first rows give each one)
            model.train()
            return
        sequences, rows = [], []
        with gathered(model):
            for input_dict, _ in batches[:count]:
                ids = input_dict["input"].to(trainer.device)
                prompt_lengths = input_dict[PROMPT].to(trainer.device)
                batch_rows = [json.loads(row) for row in input_dict[ROW]]
                sequences.append(self._rolled_out(model, ids, prompt_lengths, batch_rows, generator))
                rows += batch_rows
        scores = self._dp_gather(self._score(sequences, rows))
        rewards = total_rewards(scores, torch.tensor(self.rewards.weights, device=scores.device))
        lengths = self._dp_gather(torch.cat([r.trained.sum(1) for r in sequences]).float().unsqueeze(1)).squeeze(1)
        means = {**self._reward_metrics(scores, rewards), **self._length_metrics(sequences, lengths),
                 **self._tool_metrics(sequences)}  # fmt: skip
        extra = {f"{VALIDATION_PREFIX}{METRIC_PREFIX}{name}": value for name, value in means.items()}
        # torchtitan's validation record needs a loss: GRPO's held-out measure is the reward, not a loss
        validator.metrics_processor.log_validation(loss=math.nan, step=step, extra_metrics=extra)
        model.train()

    def _positions(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"positions": 0..S-1 per row}: each row one document. torchtitan's own models build their
        attention masks from them; the Transformers backend would take 0..training.seq_len - 1
        without them, wider than a batch trained at its longest completion."""
        return {"positions": torch.arange(ids.shape[1], device=ids.device).repeat(ids.shape[0], 1)}

    def _model_inputs(self, ids: torch.Tensor, positions: dict) -> tuple[torch.Tensor, dict]:
        """A forward's inputs as the trainer prepares a batch's: `positions` (`_positions`) and the
        attention masks built from them. The inputs are `ids` themselves (GRPO runs without CP)."""
        if not positions:
            return ids, {}
        inputs, _, extra_kwargs = self.trainer.post_dataloading_process({"input": ids, **positions}, ids)
        return inputs, extra_kwargs

    def _microbatches(self, model, sequences: list[Rollouts], local_advantages) -> list[tuple[dict, torch.Tensor]]:
        microbatches, offset, temperature = [], 0, self.grpo.temperature
        for rollouts in sequences:
            width = self._trained_width(rollouts.ids, rollouts.trained)
            ids = rollouts.ids[:, :width]
            labels = trained_labels(ids, rollouts.trained[:, :width])
            positions = self._positions(ids)
            input_dict = {"input": ids, ADVANTAGES: local_advantages[offset:offset + ids.shape[0]],
                          OLD_LOGPS: None, REFERENCE_LOGPS: None, **positions}  # fmt: skip
            offset += ids.shape[0]
            inputs, extra_kwargs = self._model_inputs(ids, positions)
            if self.grpo.num_iterations > 1:
                input_dict[OLD_LOGPS] = model_token_logps(model, inputs, labels, extra_kwargs, temperature=temperature)
            if self.grpo.beta:
                with adapters_off(model) if self.frozen is None else self.frozen.swapped_in():
                    input_dict[REFERENCE_LOGPS] = model_token_logps(model, inputs, labels, extra_kwargs,
                                                                         temperature=temperature)  # fmt: skip
            microbatches.append((input_dict, labels))
        return microbatches

    def _trained_width(self, ids: torch.Tensor, trained: torch.Tensor) -> int:
        """The columns a batch of completions trains on: eager, up to its last sampled token (a
        multiple of 8 x the tensor-parallel degree, whose sequence parallelism splits them), as TRL
        trains each batch at its longest; compiled (static shapes), the whole buffer."""
        if self.sampler.static_cache is not None:
            return ids.shape[1]
        columns = torch.arange(1, ids.shape[1] + 1, device=ids.device)
        end = int((columns * trained).max())  # one past the last trained column of any row
        granule = 8 * self.trainer.parallel_dims.tp
        return min(ids.shape[1], -(-end // granule) * granule)

    # ---- data parallel ---------------------------------------------------------------------

    def _dp_rank(self) -> int:
        parallel_dims = self.trainer.parallel_dims
        return parallel_dims.get_mesh("batch").get_local_rank() if parallel_dims.dp_enabled else 0

    def _dp_world_size(self) -> int:
        parallel_dims = self.trainer.parallel_dims
        return parallel_dims.get_mesh("batch").size() if parallel_dims.dp_enabled else 1

    def _dp_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[n, ...] on each rank -> [ranks x n, ...] in rank order."""
        parallel_dims = self.trainer.parallel_dims
        if not parallel_dims.dp_enabled:
            return tensor
        group = parallel_dims.get_mesh("batch").get_group()
        parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts)

    def _dp_min(self, tensor: torch.Tensor) -> torch.Tensor:
        parallel_dims = self.trainer.parallel_dims
        if not parallel_dims.dp_enabled:
            return tensor
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN,
                                     group=parallel_dims.get_mesh("batch").get_group())  # fmt: skip
        return tensor

    def _dp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parallel_dims = self.trainer.parallel_dims
        if not parallel_dims.dp_enabled:
            return tensor
        return dist_utils.dist_sum_tensor(tensor, parallel_dims.get_mesh("batch"))


def completion_labels(ids: torch.Tensor, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor) -> torch.Tensor:
    """[B, S] labels of prompt + completion rows: the next token where it is a completion token
    (the label of position j is token j + 1), IGNORE_INDEX elsewhere."""
    return trained_labels(ids, Rollouts.one_turn(ids, prompt_lengths, completion_lengths, -1).trained)


def trained_labels(ids: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """[B, S] labels: the next token where the policy sampled it (`trained`; the label of position j
    is token j + 1), IGNORE_INDEX elsewhere -- on the prompt, a tool's answer and the template's
    tokens around it, the padding. The loss, the ratios, the KL and the token counts read this mask."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, :-1] = ids[:, 1:].masked_fill(~trained[:, 1:], IGNORE_INDEX)
    return labels


def rewards_of(grpo, tools, device=None) -> Rewards:
    """The grpo.rewards functions (a reward model dir's on `device`), and an environment's own reward
    (TRL's: its get_reward(), weight 1)."""
    owned = environment_reward(tools.environment) if tools is not None else None
    rewards = load_rewards(grpo.rewards, grpo.reward_weights, device=device) if grpo.rewards or owned is None else Rewards([], [], [])
    if owned is not None:
        rewards = Rewards([*rewards.names, owned[0]], [*rewards.functions, owned[1]], [*rewards.weights, 1.0])
    return rewards


class GRPOTrainer(StepTrainer):
    """trainer=grpo (data=prompts): torchtitan's trainer taking GRPO steps (`GRPOStep`)."""

    def make_step(self, base_train_step) -> GRPOStep:
        return GRPOStep(self, self.settings.grpo, self.seed, self.lora, base_train_step)
