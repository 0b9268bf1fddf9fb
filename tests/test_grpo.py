"""GRPO (data=prompts): the objective equals TRL 1.16's GRPOTrainer for the same completions,
rewards and per-token log-probabilities."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from conftest import launch, read_jsonl, trained
import torch

from qwen3_neuron.trainers.grpo_loss import (
    advantages,
    batch_loss,
    token_metric_means,
    token_metric_sums,
    token_terms,
    total_rewards,
)

GENERATIONS = 4
PROMPTS = ("What is 2 + 2?", "Name a colour.", "Say hi.")
# per completion (3 groups of 4): two reward functions; None: the function does not apply. The
# third group's totals are all equal (a zero standard deviation); one completion has no reward.
REWARDS_A = [1.0, 0.0, 0.5, 1.0, 0.2, 0.9, None, 0.1, 1.0, 1.0, 1.0, None]
REWARDS_B = [0.5, None, 0.0, 1.0, 0.0, 1.0, 0.3, None, 0.0, 0.0, 0.0, None]
WEIGHTS = [1.0, 0.5]


def _completions(count: int, length: int) -> list[list[int]]:
    """Distinct completions of 1..length tokens (the reward functions look them up)."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(10, 500, (1 + (i * 5) % length,), generator=generator).tolist() for i in range(count)]


def _trl_run(model_dir, tmp_path, *, loss_type, beta, scale_rewards, epsilon_high, logps, old_logps, reference_logps,
             max_completion_length):
    """TRL's own advantages (`_generate_and_score_completions`, the completions handed in by a
    rollout function) and loss (`_compute_loss`, the per-token log-probabilities handed in)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    completions = _completions(len(REWARDS_A), max_completion_length)
    lookup = {tuple(ids): i for i, ids in enumerate(completions)}

    def reward_a(prompts, completions, completion_ids, **kwargs):
        return [REWARDS_A[lookup[tuple(ids)]] for ids in completion_ids]

    def reward_b(prompts, completions, completion_ids, **kwargs):
        return [REWARDS_B[lookup[tuple(ids)]] for ids in completion_ids]

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def rollout(prompts, trainer):
        ids = [tokenizer(p)["input_ids"] for p in prompts]
        return {"prompt_ids": ids, "completion_ids": completions, "logprobs": [[0.0] * len(c) for c in completions]}

    args = GRPOConfig(
        output_dir=str(tmp_path), loss_type=loss_type, beta=beta, scale_rewards=scale_rewards, epsilon=0.2,
        epsilon_high=epsilon_high, num_generations=GENERATIONS, per_device_train_batch_size=len(REWARDS_A),
        max_completion_length=max_completion_length, reward_weights=WEIGHTS, report_to=[], use_cpu=True, bf16=False,
    )  # fmt: skip
    rows = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward_a, reward_b], args=args, train_dataset=rows,
                          processing_class=tokenizer, rollout_func=rollout)  # fmt: skip
    trainer.model.train()
    inputs = [{"prompt": p} for p in PROMPTS for _ in range(GENERATIONS)]
    batch = trainer._generate_and_score_completions(inputs)
    mask = batch["completion_mask"]
    assert mask.shape == logps.shape, "the completions' padded width is the longest completion's"
    if old_logps is not None:
        batch["old_per_token_logps"] = old_logps
    if beta:
        batch["ref_per_token_logps"] = reference_logps
    trainer.current_gradient_accumulation_steps = 1
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    loss = trainer._compute_loss(trainer.model, batch)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return float(loss), batch["advantages"], mask, metrics


@pytest.mark.parametrize("loss_type, beta, scale_rewards, epsilon_high, reused", [
    ("dapo", 0.0, "group", None, False), ("grpo", 0.0, "group", None, True), ("dr_grpo", 0.0, "batch", 0.28, True),
    ("dapo", 0.04, "none", 0.28, True), ("grpo", 0.1, "batch", None, True), ("dr_grpo", 0.04, "group", None, False),
])  # fmt: skip
@pytest.mark.numerics
def test_advantages_loss_clip_ratio_and_kl_are_trls(assets, tmp_path, loss_type, beta, scale_rewards, epsilon_high,
                                                     reused):
    torch.manual_seed(0)
    length = 7
    completions = _completions(len(REWARDS_A), length)
    width = max(len(c) for c in completions)
    mask = torch.tensor([[1.0] * len(c) + [0.0] * (width - len(c)) for c in completions])
    logps = (-torch.rand(len(completions), width) * 3).requires_grad_()
    # a sampling policy some steps back (num_iterations > 1): ratios on both sides of the clip range
    old_logps = (logps.detach() + 0.4 * torch.randn_like(logps)) if reused else None
    reference_logps = logps.detach() + 0.3 * torch.randn_like(logps)

    trl_loss, trl_advantages, trl_mask, trl = _trl_run(
        assets.tiny_qwen3_dir, tmp_path, loss_type=loss_type, beta=beta, scale_rewards=scale_rewards,
        epsilon_high=epsilon_high, logps=logps, old_logps=old_logps, reference_logps=reference_logps,
        max_completion_length=length,
    )  # fmt: skip
    assert torch.equal(trl_mask.float(), mask)

    per_function = torch.tensor([[math.nan if v is None else v for v in pair] for pair in zip(REWARDS_A, REWARDS_B)])
    rewards = total_rewards(per_function, torch.tensor(WEIGHTS))
    ours, zero_std = advantages(rewards, GENERATIONS, scale_rewards)
    # float32 on both sides, a few elementwise operations and means of <= 16 values a value: rel 1e-5
    # (168 x 2^-24) bounds their rounding, here and below
    torch.testing.assert_close(ours, trl_advantages, rtol=1e-5, atol=1e-6)
    assert float(zero_std.float().mean()) == pytest.approx(trl["frac_reward_zero_std"])
    assert float(torch.nanmean(rewards)) == pytest.approx(trl["reward"], rel=1e-6)

    terms = token_terms(logps, old_logps, ours, mask, epsilon=0.2, epsilon_high=epsilon_high, beta=beta,
                        reference_logps=reference_logps)  # fmt: skip
    # one batch is the global batch here
    loss = batch_loss(terms, loss_type, completions=float(len(completions)), tokens=float(mask.sum()),
                      max_completion_length=length)  # fmt: skip
    assert float(loss) == pytest.approx(trl_loss, rel=1e-5, abs=1e-7)
    metrics = token_metric_means(token_metric_sums(terms), beta)
    for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert metrics[name] == pytest.approx(trl[name], rel=1e-6, abs=1e-9), name
    if beta:
        assert metrics["kl"] == pytest.approx(trl["kl"], rel=1e-5)
    else:
        assert "kl" not in metrics and "kl" not in trl
    if reused:  # the data tests rely on: some tokens clipped on each side
        assert metrics["clip_ratio/low_mean"] > 0 and metrics["clip_ratio/high_mean"] > 0


def _held_out_reward(model_dir, prompts_file) -> float:
    """The digit_share reward of `model_dir`'s replies to held-out prompts: the chat template with
    add_generation_prompt, Transformers' generate() sampling 4 replies each, the same seed for every model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.my_rewards import digit_share

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rewards = []
    for row in read_jsonl(prompts_file)[:12]:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]  # fmt: skip
        torch.manual_seed(0)
        out = model.generate(ids, do_sample=True, max_new_tokens=12, num_return_sequences=4,
                             pad_token_id=tokenizer.eos_token_id)  # fmt: skip
        replies = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        rewards += digit_share(replies)
    return sum(rewards) / len(rewards)


@pytest.mark.integration
def test_grpo_raises_a_programs_reward_and_the_export_answers_better(tmp_path_factory, assets):
    """experiment=cpu_qwen3_tiny_grpo: the digit-share reward of the sampled completions rises from
    its first steps' mean to well above it, and the exported policy's replies to held-out prompts
    score higher than the starting model's."""
    run_dir = trained(tmp_path_factory.mktemp("grpo") / "run", "experiment=cpu_qwen3_tiny_grpo")
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in records] == list(range(1, 13))
    first = sum(r["reward"] for r in records[:3]) / 3
    last = sum(r["reward"] for r in records[-3:]) / 3
    assert last > first + 0.2 and last > 5 * first, (first, last)
    assert {"rewards/examples.my_rewards.digit_share/mean", "completions/mean_length", "completions/clipped_ratio",
            "clip_ratio/region_mean", "generation_seconds", "training_seconds"} <= set(records[0])  # fmt: skip
    assert "kl" not in records[0]  # beta 0: no reference, no KL
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["first_reward"], summary["reward"]) == (records[0]["reward"], records[-1]["reward"])
    held_out = assets.preference_validation_file
    start, tuned = _held_out_reward(assets.tiny_qwen3_dir, held_out), _held_out_reward(run_dir / "hf_export", held_out)
    print(f"held-out digit_share: starting model {start:.4f}, exported policy {tuned:.4f}")
    assert tuned > start + 0.1, (start, tuned)


# each generation batch trains two steps; the step-5 checkpoint is taken between the two steps of
# the third, with two prompts of the dataloader's first batch still in hand on each rank; the KL
# to the starting weights (finetune=full: a frozen copy); the held-out prompts are sampled and
# scored at steps 3 and 6. On torchtitan's own Qwen3 (the learning test above runs model=hf):
# generation forwards a prefix of the buffer, with positions and the masks built from them.
REUSED = ("experiment=cpu_qwen3_tiny_grpo", "model=native", "model.flavor=tiny", "model.hf_model=null",
          "grpo.num_iterations=2", "grpo.beta=0.04", "training.steps=7", "checkpointing=[from_hf,periodic]",
          "checkpoint.interval=5", "validator.freq=3", "validator.steps=1")  # fmt: skip
RESUMED_FROM = 5


@pytest.mark.integration
def test_a_resumed_grpo_run_ends_on_the_uninterrupted_runs_rewards_and_losses(tmp_path, assets):
    """The run's dir as it stood after its step-5 checkpoint, resumed: the prompts each rank had
    pulled but not yet generated from, the generation batch still in use and the frozen starting
    weights come back with the weights and the data position, and steps 6-7 are the
    uninterrupted run's, bit for bit, the KL and the held-out prompts' reward too."""
    from test_resume import as_of_checkpoint

    run = trained(tmp_path / "uninterrupted", *REUSED, f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}",
                  f"data.val_files={assets.preference_validation_file}")  # fmt: skip
    copy = as_of_checkpoint(run, tmp_path / "run", step=RESUMED_FROM)
    result = launch(None, f"run.resume={copy}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    fields = ("loss", "grad_norm", "reward", "reward_std", "completions/mean_length", "clip_ratio/region_mean", "kl")
    resumed, uninterrupted = ({r["step"]: [r[f] for f in fields] for r in read_jsonl(d / "metrics.jsonl")
                               if "reward" in r} for d in (copy, run))  # fmt: skip
    assert sorted(resumed) == sorted(uninterrupted) == list(range(1, 8))
    assert [resumed[s] for s in (6, 7)] == [uninterrupted[s] for s in (6, 7)]
    # the step after the checkpoint trained on the kept batch: its completions are step 5's
    assert resumed[6][4] == resumed[5][4]
    # the KL: 0 while the policy is the reference (step 1, before its update), then positive
    assert resumed[1][6] == 0.0 and all(resumed[s][6] > 0 for s in range(2, 8))
    validations = [{r["step"]: r["val_reward"] for r in read_jsonl(d / "metrics.jsonl") if "val_reward" in r}
                   for d in (copy, run)]  # fmt: skip
    assert validations[0] == validations[1] and {3, 6} <= set(validations[1])
    summaries = [json.loads((d / "summary.json").read_text()) for d in (copy, run)]
    assert summaries[0]["val_reward"] == summaries[1]["val_reward"] == validations[1][6]


def test_a_prompt_row_becomes_a_padded_sample_with_its_columns(assets):
    import json

    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from qwen3_neuron.data.dataset import PackedDataset
    from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_tokens
    from qwen3_neuron.data.source import DataSource

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tiny_qwen3_dir))
    source = DataSource(format="prompts", files=str(assets.preference_train_file), prompt_field="prompt")
    messages = [{"role": "user", "content": "What is a deque?"}]
    ids = prompt_tokens(tokenizer, {"prompt": messages}, source)
    assert tokenizer.tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nWhat is a deque?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_tokens(tokenizer, {"prompt": "Say hi"}, source) == tokenizer.encode("Say hi", add_bos=True, add_eos=False)

    first_row = read_jsonl(assets.preference_train_file)[0]
    input_dict, labels = next(iter(PackedDataset(source, tokenizer, seq_len=64)))
    length = int(input_dict[PROMPT])
    assert input_dict["input"].tolist()[:length] == prompt_tokens(tokenizer, first_row, source)
    assert input_dict["input"].shape == labels.shape == (64,) and (labels == -100).all()
    assert json.loads(input_dict[ROW]) == first_row  # every column reaches the rewards


def test_a_prompt_of_exactly_seq_len_tokens_leaves_no_room_and_is_refused_or_dropped(assets, tmp_path):
    """The plan refuses a first row that leaves no room for grpo.max_completion_length (>= 1); a
    later one that fills training.seq_len is dropped and counted, one token shorter is kept."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from qwen3_neuron.data.data_checks import _check_prompts
    from qwen3_neuron.data.dataset import PackedDataset
    from qwen3_neuron.data.prompts import prompt_tokens
    from qwen3_neuron.data.source import DataSource
    from qwen3_neuron.errors import ConfigError

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tiny_qwen3_dir))
    files = tmp_path / "prompts.jsonl"
    files.write_text(json.dumps({"prompt": "Count the digits in 12345."}) + "\n")
    source = DataSource(format="prompts", files=str(files), max_dropped=None)
    length = len(prompt_tokens(tokenizer, {"prompt": "Count the digits in 12345."}, source))
    with pytest.raises(ConfigError, match=f"the prompt is {length} tokens, and grpo.max_completion_length=1 more"):
        _check_prompts(source, tokenizer, seq_len=length, completion_tokens=1)
    _check_prompts(source, tokenizer, seq_len=length + 1, completion_tokens=1)
    full = PackedDataset(source, tokenizer, seq_len=length, infinite=False)
    assert list(full) == [] and (full.stats["dropped"], full.stats["documents"]) == (1, 0)
    roomy = PackedDataset(source, tokenizer, seq_len=length + 1, infinite=False)
    assert len(list(roomy)) == 1 and (roomy.stats["dropped"], roomy.stats["documents"]) == (0, 1)


def test_only_completion_tokens_are_trained():
    from qwen3_neuron.trainers.grpo import completion_labels

    ids = torch.tensor([[1, 2, 3, 40, 41, 9, 0, 0], [1, 2, 40, 41, 42, 43, 44, 0]])
    labels = completion_labels(ids, torch.tensor([3, 2]), torch.tensor([3, 5]))
    assert labels.tolist() == [[-100, -100, 40, 41, 9, -100, -100, -100], [-100, 40, 41, 42, 43, 44, -100, -100]]


class _Counting(torch.nn.Module):
    """A stand-in policy: hidden states out (as `hidden_states_out` asks), an lm_head that always
    makes token 7 the likeliest by far."""

    _skip_lm_head = False

    def __init__(self, vocab: int = 10):
        super().__init__()
        self.lm_head = torch.nn.Linear(1, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.zero_()
            self.lm_head.weight[7] = 100.0

    def forward(self, ids):
        hidden = torch.ones(*ids.shape, 1)
        return hidden if self._skip_lm_head else self.lm_head(hidden)


def test_a_prompt_longer_than_the_plan_read_gets_the_room_seq_len_leaves_it():
    """The plan checks that its first rows leave grpo.max_completion_length in training.seq_len; a
    later prompt that does not is completed up to the end of its sample, not past it."""
    step = _sampler(max_completion_length=4, one_shape=True)
    ids = torch.tensor([[1, 2, 0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 0, 0]])  # seq_len 8: room 6 and 2
    lengths = step.sample(_Counting(), ids, torch.tensor([2, 6]), torch.Generator().manual_seed(0))
    assert lengths.tolist() == [4, 2]
    assert ids.tolist() == [[1, 2, 7, 7, 7, 7, 0, 0], [1, 2, 3, 4, 5, 6, 7, 7]]


def _sampler(max_completion_length: int, one_shape: bool, end_id: int = 9, model=None, hf_backend: bool = False):
    """The GRPO trainer's sampler. With torchtitan's own `model`, a whole-buffer forward gets
    positions and the BlockMask the trainer would build from them; else none (the model's own
    causal mask)."""
    from qwen3_neuron.generation.sampling import Sampler

    def model_inputs(ids):
        if model is None or hf_backend:
            return {}
        positions = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
        return {"positions": positions, "attention_masks": model.get_attention_masks(positions)}

    return Sampler(end_id=end_id, pad_id=0, max_completion_length=max_completion_length, warpers=[],
                   hf_backend=hf_backend, one_shape=one_shape, model_inputs=model_inputs)  # fmt: skip


def _tiny_policy(assets, model_kind: str):
    """The tiny Qwen3 as a CPU worker builds it: torchtitan's Transformers backend (its attention
    on Transformers' SDPA), or torchtitan's own dense or MoE model with flex attention's masks
    computed by SDPA (`sdpa_for_flex`), its BlockMasks built without compiling (as in every test
    process: conftest.py)."""
    from types import SimpleNamespace

    from test_hf import build_hf_model, build_native_model, hf_trainer_config

    from examples.my_moe import my_experts
    from qwen3_neuron.kernels.attention.sdpa import sdpa_for_flex
    from qwen3_neuron.models.flavors import dense_qwen3, moe_qwen3
    from qwen3_neuron.models.tiny import TINY_DENSE, TINY_MOE

    torch.manual_seed(0)
    if model_kind == "hf":
        model = build_hf_model(hf_trainer_config(assets.tiny_qwen3_dir, seq_len=SEQ_LEN))
        model.model.config._attn_implementation = "sdpa"
        return model.eval()
    config = dense_qwen3(TINY_DENSE, "flex") if model_kind == "native" else moe_qwen3(TINY_MOE, "flex")
    for layer in config.layers:
        layer.attention.inner_attention = sdpa_for_flex(layer.attention.inner_attention)
        if model_kind == "moe":  # torchtitan's experts multiply in bfloat16: these, the same in float32
            experts = layer.moe.routed_experts
            experts.inner_experts = my_experts(experts.inner_experts, compute_dtype="float32")
    return build_native_model(SimpleNamespace(model=config)).eval()


SEQ_LEN, COMPLETION = 256, 8
PROMPT_LENGTHS = [5, 14, 9, SEQ_LEN - 4]  # the last leaves 4 columns: its completion is cut there
# Float32 throughout (the MoE's experts too), so the paths differ only in the order of their sums:
# float32's unit roundoff 2^-24 times the longest sum (the MLP's 768 terms), relative to the logits'
# magnitude, bounds each sum's rounding (in bfloat16 an input an ulp apart could round a bf16 ulp apart)
SUM_ROUNDING = 2**-24 * 768  # the dense MLP's intermediate_size: its down projection sums the most terms


def prompts_and_completions() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PROMPT_LENGTHS's prompts of random tokens in [B, SEQ_LEN] buffers, COMPLETION tokens to
    feed after each, and the row indices."""
    prompt_lengths = torch.tensor(PROMPT_LENGTHS)
    generator = torch.Generator().manual_seed(5)
    prompts = torch.randint(1, 2000, (len(PROMPT_LENGTHS), SEQ_LEN), generator=generator)
    prompts = prompts.masked_fill(torch.arange(SEQ_LEN) >= prompt_lengths.unsqueeze(1), 0)
    completions = torch.randint(1, 2000, (len(PROMPT_LENGTHS), COMPLETION), generator=generator)
    return prompt_lengths, prompts, completions, torch.arange(len(PROMPT_LENGTHS))


@pytest.mark.numerics
@pytest.mark.parametrize("model_kind", ["native", "moe", "hf"])
def test_cached_generation_has_the_whole_buffers_logits_at_one_token_a_forward(assets, model_kind):
    """Eager generation runs the prompts once, then each sampled token alone on the KV cache; at
    every step its next-token logits are those of a forward of the whole buffer (a compiled model's
    way), so it samples the same completions."""
    model, hf_backend = _tiny_policy(assets, model_kind), model_kind == "hf"
    prompt_lengths, prompts, completions, rows = prompts_and_completions()
    widths = []
    model.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    logits = {}
    for one_shape in (True, False):
        step, ids, tokens, logits[one_shape] = _sampler(COMPLETION, one_shape, model=model, hf_backend=hf_backend), prompts.clone(), None, []
        widths.clear()
        with torch.no_grad(), step.next_token_logits(model, ids, prompt_lengths) as next_token_logits:
            for t in range(COMPLETION):
                logits[one_shape].append(next_token_logits(t, tokens))
                tokens = completions[:, t]
                inside = prompt_lengths + t < SEQ_LEN
                ids[rows[inside], (prompt_lengths + t)[inside]] = tokens[inside]
        assert widths == ([SEQ_LEN] * COMPLETION if one_shape else [max(PROMPT_LENGTHS)] + [1] * (COMPLETION - 1))
    whole, cached = torch.stack(logits[True], 1), torch.stack(logits[False], 1)  # [B, t, vocab]
    for row, length in enumerate(PROMPT_LENGTHS):
        steps = min(COMPLETION, SEQ_LEN - length + 1)  # the cut row: its logits after seq_len are not used
        atol = SUM_ROUNDING * whole.abs().max()
        torch.testing.assert_close(cached[row, :steps], whole[row, :steps], atol=atol, rtol=0)
    assert whole.std() > 0.1  # logits that differ between tokens: the model is not degenerate

    sampled = {}
    for one_shape in (True, False):
        ids = prompts.clone()
        lengths = _sampler(COMPLETION, one_shape, end_id=3, model=model, hf_backend=hf_backend).sample(
            model, ids, prompt_lengths, torch.Generator().manual_seed(3))  # fmt: skip
        sampled[one_shape] = (ids, lengths)
    assert torch.equal(sampled[False][0], sampled[True][0]) and torch.equal(sampled[False][1], sampled[True][1])
    assert sampled[False][1].tolist()[-1] == 4 and not torch.equal(sampled[False][0], prompts)


def test_sampling_follows_grpo_temperature_and_top_p():
    """grpo.temperature divides the scores and grpo.top_p keeps the smallest set of tokens holding
    that much probability; at 1.0 and 1.0 the scores are sampled as they are."""
    from qwen3_neuron.generation.sampling import logits_warpers

    ids, scores = torch.zeros(1, 3, dtype=torch.long), torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert logits_warpers(1.0, 1.0) == []

    def warped(temperature, top_p):
        out = scores
        for warper in logits_warpers(temperature, top_p):
            out = warper(ids, out)
        return out

    assert torch.equal(warped(0.5, 1.0), scores / 0.5)
    # probabilities at temperature 1: 0.644, 0.237, 0.087, 0.032; top_p 0.8 keeps the first two
    kept = torch.isfinite(warped(1.0, 0.8))
    assert kept.tolist() == [[True, True, False, False]]
    # at temperature 0.5 the first alone holds 0.87 of the probability
    assert torch.isfinite(warped(0.5, 0.8)).tolist() == [[True, False, False, False]]


def test_the_no_signal_line_comes_as_a_streak_doubles_and_the_live_line_keeps_80_columns(tmp_path):
    """Ten steps without a learning signal are said at steps 1, 2, 4 and 8 of the streak and
    nowhere between; a step with a signal ends it, and the next streak is said from its own first
    step. The live line of a GRPO run with a held-out reward keeps tok/s and the ETA within the 79
    columns an 80-column terminal shows (the line is cut there)."""
    from test_sweeps import write_records

    from qwen3_neuron.launch.progress import Progress

    zero_std = [1.0] * 10 + [0.5] + [1.0] * 2
    write_records(tmp_path, [{"step": s, "loss": 0.0, "reward": 0.5, "frac_reward_zero_std": z,
                              "tokens_per_second": 12345.0, "mfu": 0.1, "elapsed_seconds": float(s)}
                             for s, z in enumerate(zero_std, start=1)])  # fmt: skip
    out = io.StringIO()
    progress = Progress(tmp_path / "metrics.jsonl", total_steps=100, stream=out)
    progress._poll()
    said = [line.split(": every")[0].split("no learning signal at ")[1] for line in out.getvalue().splitlines()
            if "no learning signal" in line]  # fmt: skip
    assert said == ["step 1", "steps 1-2, 2 in a row", "steps 1-4, 4 in a row", "steps 1-8, 8 in a row",
                    "step 12", "steps 12-13, 2 in a row"]  # fmt: skip
    progress._validation = (10, "val reward", 0.25)
    line = progress.line()
    assert line == "[qwen3-neuron]  step 13/100  reward 0.500 val 0.250  tok/s 12,345  ETA 0:01:27"
    assert len(line) <= 79
    progress.stop()


def test_grpo_rewards_reach_the_summary_the_end_of_run_lines_and_the_objective(tmp_path, assets):
    from conftest import compose_job
    from test_sweeps import csv_rows, write_records

    from qwen3_neuron.errors import ConfigError
    from qwen3_neuron.job.settings import check_settings
    from qwen3_neuron.report.summary import summarize, summary_lines, sweep_job_value
    from qwen3_neuron.report.sweep_table import write_report

    from qwen3_neuron.launch.progress import Progress
    from qwen3_neuron.worker.metrics import validation_record

    # steps 1 and 2 without a learning signal: every group's completions scored alike
    steps = [{"step": s, "loss": 0.1 / s, "reward": reward, "completions/mean_length": 30.0 + s,
              "completions/clipped_ratio": 0.25, "frac_reward_zero_std": zero_std}
             for s, reward, zero_std in ((1, 0.016, 1.0), (2, 0.2, 1.0), (3, 0.42, 0.5))]  # fmt: skip
    # the held-out prompts' validation at step 2, as the worker logs it: rewards, no loss
    held_out = validation_record({"validation_metrics/loss": math.nan, "validation_metrics/grpo/reward": 0.3,
                                  "validation_metrics/grpo/completions/mean_length": 20.0}, step=2)  # fmt: skip
    assert held_out == {"step": 2, "val_reward": 0.3, "val_completions/mean_length": 20.0}
    tmp_path = tmp_path / "0"  # a sweep's job dir
    write_records(tmp_path, [*steps[:2], held_out, steps[2]])
    summary = summarize(tmp_path, "completed", 1.0)
    assert {k: summary[k] for k in ("first_reward", "reward", "completion_mean_length", "completion_clipped_ratio",
                                    "val_reward", "val_step", "val_loss", "no_signal_steps")} == {
        "first_reward": 0.016, "reward": 0.42, "completion_mean_length": 33.0, "completion_clipped_ratio": 0.25,
        "val_reward": 0.3, "val_step": 2, "val_loss": None, "no_signal_steps": 2}  # fmt: skip
    lines = summary_lines(json.loads(json.dumps(summary)))
    assert ("grpo: reward 0.0160 -> 0.4200; completions 33.0 tokens on average, 25% cut at "
            "grpo.max_completion_length; held-out prompts: reward 0.3000 at step 2") in lines
    assert ("grpo: 2 of 3 steps without a learning signal: every group's completions scored alike, so every "
            "advantage was 0 and the reward taught the policy nothing; more completions per prompt "
            "(grpo.num_generations), a higher grpo.temperature or a reward that gives partial credit spreads the "
            "scores") in lines  # fmt: skip
    assert sweep_job_value(summary, "reward", stop_on_failure=True) == 0.42
    assert sweep_job_value(summary, "val_reward", stop_on_failure=True) == 0.3
    out = io.StringIO()
    progress = Progress(tmp_path / "metrics.jsonl", total_steps=3, stream=out)
    progress._poll()
    progress.stop()
    shown = out.getvalue().splitlines()
    assert shown[-1] == "[qwen3-neuron]  step 3/3  reward 0.420 val 0.300  ETA 0:00:00"
    said = [line for line in shown if "no learning signal" in line]
    assert [line.split(": every")[0] for line in said] == [
        "[qwen3-neuron]  no learning signal at step 1", "[qwen3-neuron]  no learning signal at steps 1-2, 2 in a row"]
    assert said[0].endswith("spreads the scores.")
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- grpo.beta=0.0\n")
    report = write_report(tmp_path.parent)  # the sweep table of a sweep of this one job
    row = csv_rows(tmp_path.parent / "summary.csv")[0]
    assert (row["first_reward"], row["reward"], row["val_reward"]) == ("0.016", "0.42", "0.3")
    table = (tmp_path.parent / "summary.md").read_text()
    assert "| 0.0160 | 0.4200 | 0.3000 |" in table  # rounded as the losses are
    assert (report.jobs[0].curve, report.jobs[0].points) == ("reward", [(1, 0.016), (2, 0.2), (3, 0.42)])
    job = compose_job("experiment=cpu_qwen3_tiny_grpo", "run.objective=reward")
    check_settings(job.settings, "cpu")  # data=prompts reports it
    with pytest.raises(ConfigError) as refused:
        check_settings(compose_job("run.objective=reward").settings, "cpu")
    assert str(refused.value) == (
        "run.objective=reward is reported by data=prompts runs only (this one is data=tiny): every job would "
        "return no value. final_loss, val_loss, tokens_per_second or eval.<task>.<metric> are reported by every run."
    )


def test_the_memory_plan_counts_the_frozen_reference_of_a_full_grpo_run_with_a_kl(tmp_path, assets):
    from conftest import compose_job, plan_of
    from qwen3_neuron.job.checks.memory import GIB

    def memory(*overrides):
        return plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo", *overrides), tmp_path / f"run{len(overrides)}").memory

    without, with_kl = memory(), memory("grpo.beta=0.04")
    assert without.reference_gib == 0 and with_kl.reference_gib == with_kl.parameters_gib > 0
    kept_reference_logprobs = with_kl.completions_gib - without.completions_gib  # [seq_len] float32 per completion
    assert kept_reference_logprobs * GIB == 8 * 64 * 4
    assert with_kl.per_rank_gib == pytest.approx(without.per_rank_gib + with_kl.parameters_gib + kept_reference_logprobs)
    assert "frozen reference" in with_kl.line()


def test_the_memory_plan_counts_the_kv_cache_and_the_generation_batch(tmp_path, assets):
    from conftest import compose_job, plan_of
    from qwen3_neuron.job.checks.memory import DTYPE_BYTES, GIB

    def memory(*overrides):
        return plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo", *overrides), tmp_path / f"run{len(overrides)}")

    plan, compiled = memory(), memory("compile.enable=true")
    kept = memory("grpo.num_iterations=2", "grpo.beta=0.04", "finetune=lora")
    text = json.loads((Path(assets.tiny_qwen3_dir) / "config.json").read_text())
    training = plan.trainer_config.training
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    # keys and values of every layer for the rank's batch of [seq_len] buffers, in the compute dtype
    cache = (text["num_hidden_layers"] * 2 * training.local_batch_size * training.seq_len
             * text["num_key_value_heads"] * head_dim * DTYPE_BYTES[training.mixed_precision_param])  # fmt: skip
    assert (plan.memory.generation_gib - compiled.memory.generation_gib) * GIB == pytest.approx(cache)
    # each rank's 8 completions of 64 tokens: int64 ids, and float32 old and reference log-probabilities
    assert plan.memory.completions_gib * GIB == 8 * 64 * 8
    assert kept.memory.completions_gib * GIB == 8 * 64 * (8 + 2 * 4)
    assert "generation" in plan.memory.line() and "completions" in plan.memory.line()
