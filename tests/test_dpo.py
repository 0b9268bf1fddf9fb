"""Preference tuning (data=preference): the DPO objective equals TRL's for the same per-token
log-probabilities; preference rows become packed pairs with their masks."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random

import pytest
import torch
from conftest import compose_job, launch, read_jsonl, trained
from test_data import spans_of
from test_resume import as_of_checkpoint
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.assets.build import PREFERENCE_CHOSEN
from qwen3_neuron.data.chat_rows import ChatFormatError, ChatRenderer
from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.packing import SEQUENCE_IDS
from qwen3_neuron.data.preference import pair_tokens, row_pair
from qwen3_neuron.data.preview import format_sample
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.trainers.dpo import (
    mean_metrics,
    pair_metrics,
    pair_terms,
    step_loss,
)
from qwen3_neuron.trainers.preference_step import sequence_sums
from qwen3_neuron.models.logprobs import token_logps


TRL_ROWS = [
    {"prompt": [{"role": "user", "content": "What does getcontext() do?"}],
     "chosen": [{"role": "assistant", "content": "Returns this thread's context."}],
     "rejected": [{"role": "assistant", "content": "Nothing at all, ever."}]},
    {"prompt": [{"role": "user", "content": "How is it declared?"}],
     "chosen": [{"role": "assistant", "content": "def getcontext():"}],
     "rejected": [{"role": "assistant", "content": "class Context: pass, with more words"}]},
    {"prompt": [{"role": "user", "content": "What is a deque?"}],
     "chosen": [{"role": "assistant", "content": "A double-ended queue."}],
     "rejected": [{"role": "assistant", "content": "A dictionary."}]},
]  # fmt: skip


def _trl_trainer(model_dir, ref_model, model, loss_type: str, beta: float, label_smoothing: float, sft_weight: float,
                 tmp_path):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = Dataset.from_list(TRL_ROWS)
    args = DPOConfig(
        output_dir=str(tmp_path), beta=beta, label_smoothing=label_smoothing,
        loss_type=[loss_type, "sft"] if sft_weight else [loss_type], loss_weights=[1.0, sft_weight] if sft_weight else None,
        per_device_train_batch_size=3, report_to=[], use_cpu=True, bf16=False, max_length=None,
    )  # fmt: skip
    return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=rows, processing_class=tokenizer)


@pytest.mark.parametrize("loss_type, label_smoothing, sft_weight",
                         [("sigmoid", 0.0, 0.0), ("ipo", 0.0, 0.0), ("robust", 0.2, 0.0), ("sigmoid", 0.0, 0.7),
                          ("ipo", 0.0, 0.3)])  # fmt: skip
@pytest.mark.numerics
def test_the_dpo_loss_rewards_and_accuracy_are_trls(assets, tmp_path, loss_type, label_smoothing, sft_weight):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_pretrained(assets.tiny_qwen3_dir, dtype=torch.float32).eval()
    policy = AutoModelForCausalLM.from_pretrained(assets.tiny_qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # a policy that has moved away from its reference
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    beta = 0.5
    trainer = _trl_trainer(assets.tiny_qwen3_dir, reference, policy, loss_type, beta, label_smoothing, sft_weight,
                           tmp_path)  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    trl_loss = float(trainer._compute_loss(policy, batch, return_outputs=False).detach())
    trl = {name: values[-1] for name, values in trainer._metrics["eval"].items()}  # the models are in eval mode

    # The same rows as this project packs them: each pair's chosen and rejected sequences side by
    # side in one sample, their response tokens marked with the pair's sequence ids.
    ids, mask = batch["input_ids"], batch["completion_mask"]
    n = ids.shape[0] // 2
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    sequence_ids = torch.where(mask[:, 1:] == 1, 0, -1)
    sequence_ids[n:] = torch.where(sequence_ids[n:] == 0, 1, -1)
    with torch.no_grad():
        policy_tokens = token_logps(policy(ids).logits[:, :-1], labels)
        reference_tokens = token_logps(reference(ids).logits[:, :-1], labels)
    side_by_side = lambda t: torch.cat([t[:n], t[n:]], dim=1)  # noqa: E731  [2n, L] -> [n, 2L]
    packed_ids = side_by_side(sequence_ids)
    policy_sums, counts = sequence_sums(side_by_side(policy_tokens), packed_ids)
    reference_sums, _ = sequence_sums(side_by_side(reference_tokens), packed_ids)
    terms = pair_terms(policy_sums, reference_sums, counts, beta=beta, loss_type=loss_type,
                       label_smoothing=label_smoothing)  # fmt: skip
    ours = mean_metrics(pair_metrics(terms), sft_weight)
    # the loss a step backpropagates: this batch alone is the global batch
    pairs, tokens = torch.tensor(float(n)), counts[:, 0].sum()
    assert float(step_loss(terms, pairs, tokens, sft_weight)) == pytest.approx(ours["loss"], rel=1e-6)

    assert ours["pairs"] == n == 3
    # float32 on both sides: the same model's log-probabilities (sums of ~30 tokens' each, batched
    # differently) through a few elementwise operations: rel 1e-5 = 168 x 2^-24, 1e-4 for the rewards
    # (beta x a difference of two such sums, which cancel)
    assert ours["loss"] == pytest.approx(trl_loss, rel=1e-5, abs=1e-6)
    assert ours["rewards_chosen"] == pytest.approx(trl["rewards/chosen"], rel=1e-4, abs=1e-6)
    assert ours["rewards_rejected"] == pytest.approx(trl["rewards/rejected"], rel=1e-4, abs=1e-6)
    assert ours["reward_margin"] == pytest.approx(trl["rewards/margins"], rel=1e-4, abs=1e-6)
    assert ours["reward_accuracy"] == pytest.approx(trl["rewards/accuracies"], rel=1e-6)  # TRL's is a float32 mean


def test_policy_equal_to_reference_gives_ln2():
    sums = torch.tensor([[-3.0, -5.0], [-1.0, -2.0], [0.0, 0.0]])
    counts = torch.tensor([[2.0, 3.0], [1.0, 4.0], [0.0, 0.0]])  # the last slot holds no pair
    metrics = mean_metrics(pair_metrics(pair_terms(sums, sums, counts, beta=0.1)))
    assert metrics == {"pairs": 2.0, "loss": pytest.approx(0.6931471805599453), "rewards_chosen": 0.0,
                       "rewards_rejected": 0.0, "reward_accuracy": 0.0, "reward_margin": 0.0,
                       "chosen_nll": pytest.approx((3.0 + 1.0) / (2.0 + 1.0))}  # fmt: skip
    # the SFT term: the chosen responses' NLL per token (4 nats over 3 tokens), weighted
    weighted = mean_metrics(pair_metrics(pair_terms(sums, sums, counts, beta=0.1)), sft_weight=0.5)
    assert weighted["loss"] == pytest.approx(math.log(2) + 0.5 * 4.0 / 3.0)


# ---- preference rows -> packed pairs ----------------------------------------------------------

PREFERENCE = DataSource(format="preference", prompt_field="prompt")
USER, GOOD, BAD = "What is a deque?", "A double-ended queue.", "A dictionary."
EARLIER = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


@pytest.fixture(scope="module")
def tokenizer(assets):
    return HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))


def _trained_spans(tokenizer, row, source=PREFERENCE) -> list[list[str]]:
    renderer = ChatRenderer(tokenizer)
    return [spans_of(tokenizer, ids, trained) for ids, trained in pair_tokens(renderer, row_pair(row, source))]


def test_the_three_shapes_of_a_pair_train_the_responses_only(tokenizer):
    turn = lambda role, text: [{"role": role, "content": text}]  # noqa: E731
    explicit = {"prompt": turn("user", USER), "chosen": turn("assistant", GOOD), "rejected": turn("assistant", BAD)}
    implicit = {"chosen": turn("user", USER) + turn("assistant", GOOD), "rejected": turn("user", USER) + turn("assistant", BAD)}
    strings = {"prompt": USER, "chosen": GOOD, "rejected": BAD}
    expected = [[f"<think>\n\n</think>\n\n{GOOD}<|im_end|>"], [f"<think>\n\n</think>\n\n{BAD}<|im_end|>"]]
    assert _trained_spans(tokenizer, explicit) == _trained_spans(tokenizer, implicit) == expected
    assert _trained_spans(tokenizer, strings) == expected
    # a multi-turn prompt: its own assistant turn is context, not trained
    multi = {"chosen": EARLIER + turn("user", USER) + turn("assistant", GOOD),
             "rejected": EARLIER + turn("user", USER) + turn("assistant", BAD)}  # fmt: skip
    assert _trained_spans(tokenizer, multi) == expected
    renamed = DataSource(format="preference", prompt_field="question", chosen_field="good", rejected_field="bad")
    assert _trained_spans(tokenizer, {"question": USER, "good": GOOD, "bad": BAD}, renamed) == expected


@pytest.mark.parametrize("row, error", [
    ({"prompt": USER, "chosen": GOOD}, "data.rejected_field=rejected: the row has no rejected response"),
    ({"prompt": USER, "chosen": GOOD, "rejected": GOOD}, "the chosen and the rejected response are the same"),
    ({"chosen": GOOD, "rejected": BAD}, "string responses need a prompt column"),
    ({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": GOOD}],
      "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": BAD}]}, "share no prompt"),
])  # fmt: skip
def test_a_row_that_is_not_a_pair_says_why(row, error):
    with pytest.raises(ChatFormatError, match=error):
        row_pair(row, PREFERENCE)


def test_pairs_are_packed_whole_with_their_sequence_ids(tmp_path, tokenizer):
    rows = [{"prompt": f"{USER} {'x ' * i}", "chosen": GOOD, "rejected": BAD * (1 + i % 3)} for i in range(12)]
    files = tmp_path / "pairs.jsonl"
    files.write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = DataSource(format="preference", prompt_field="prompt", files=str(files))
    dataset = PackedDataset(source, tokenizer, seq_len=160, infinite=False)
    samples = list(dataset)
    pairs = 0
    for input_dict, labels in samples:
        positions, ids = input_dict["positions"].tolist(), input_dict[SEQUENCE_IDS].tolist()
        starts = [i for i, p in enumerate(positions) if p == 0]
        documents = [(a, b) for a, b in zip(starts, [*starts[1:], len(positions)])]
        trained = [{ids[i] for i in range(a, b) if ids[i] >= 0} for a, b in documents]
        numbered = [t.pop() for t in trained if t]  # one sequence id per trained document, in order
        assert numbered == list(range(len(numbered))) and len(numbered) % 2 == 0  # whole pairs: chosen, rejected
        assert all((ids[i] >= 0) == (labels[i] != -100) for i in range(len(ids)))
        pairs += len(numbered) // 2
    assert pairs == len(rows) and dataset.stats["documents"] == 2 * len(rows)
    # run.show_data names each response and masks its prompt
    input_dict, labels = samples[0]
    shown = format_sample(0, input_dict["input"].tolist(), labels.tolist(), input_dict["positions"].tolist(),
                          tokenizer, input_dict[SEQUENCE_IDS].tolist())  # fmt: skip
    assert ", pair 1 chosen (tokens 0-" in shown and ", pair 1 rejected (tokens " in shown
    assert f"</think>\n\n{GOOD}<|im_end|>\n──── document 2, pair 1 rejected" in shown
    assert f"⟦<|im_start|>user\n{USER}" in shown
    # too long for one sample: truncated to fit together (overlong=truncate), or dropped
    source = dataclasses.replace(source, max_dropped=None)  # dropping them all is the point here
    short = PackedDataset(source, tokenizer, seq_len=48, infinite=False)
    assert sum(1 for _ in short) > 0 and short.stats["truncated"] > 0
    dropping = PackedDataset(dataclasses.replace(source, overlong="drop"), tokenizer, seq_len=48, infinite=False)
    list(dropping)
    assert dropping.stats["dropped"] == short.stats["truncated"] + short.stats["dropped"]


# ---- a tiny preference set: one constant chosen reply, random text rejected ----------------------

CHOSEN = PREFERENCE_CHOSEN  # the bundled pairs' chosen reply to every question


def held_out_questions(assets) -> list[str]:
    lines = assets.preference_validation_file.read_text().splitlines()
    return [json.loads(line)["prompt"][0]["content"] for line in lines][:5]


# The experiment as shipped: the tiny HF Qwen3 with LoRA on the bundled pairs, 2 ranks, 2 samples
# per rank and step, 32 steps, DPO plus TRL's SFT term (from an untrained model pure DPO mostly
# pushes the rejected replies down and the chosen one stays unlikely; the NLL term makes it the
# reply the model generates); held-out pairs validated once, at the last step; the policy exported.
# A checkpoint every 8 steps (saving changes no loss): the resume test starts from one.
SFT_WEIGHT = 1.0
DPO_LORA = ("experiment=cpu_qwen3_tiny_dpo", f"preference.sft_weight={SFT_WEIGHT}",
            "checkpointing=[from_hf,export_hf,periodic]", "checkpoint.interval=8", "validator.freq=32",
            "validator.steps=1")  # fmt: skip


# finetune=full: the reference is a frozen copy of the starting weights; one rank, 24 steps.
DPO_FULL = (*DPO_LORA[:-2], "finetune=full", "optimizer.lr=1e-3", "training.steps=24", "run.nproc_per_node=1",
            "validator.freq=24", "validator.steps=1")  # fmt: skip
RESUMED_FROM = {"lora": 24, "full": 16}  # the newest checkpoint before the last step


@pytest.fixture(scope="module")
def dpo_lora_run(tmp_path_factory, assets):
    return trained(tmp_path_factory.mktemp("dpo-lora") / "run", *DPO_LORA), held_out_questions(assets)


@pytest.fixture(scope="module")
def dpo_full_run(tmp_path_factory, assets):
    return trained(tmp_path_factory.mktemp("dpo-full") / "run", *DPO_FULL), held_out_questions(assets)


def _response_logps(model, tokenizer, question: str, reply: str) -> float:
    """log p(reply's assistant turn | question) under `model`, as the run's data marks the turn."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)  # fmt: skip
    full = tokenizer.apply_chat_template([{"role": "user", "content": question}, {"role": "assistant", "content": reply}],
                                         tokenize=False).rstrip("\n")  # the marker's newline is not trained  # fmt: skip
    assert full.startswith(prompt)
    ids = tokenizer(full, return_tensors="pt")["input_ids"]
    start = len(tokenizer(prompt)["input_ids"])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    return float(logps[start - 1:].sum())


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_dpo_run_starts_at_ln2_learns_the_preference_and_exports_the_tuned_policy(request, kind, assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, held_out = request.getfixturevalue(f"dpo_{kind}_run")
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    first = steps[0]
    # the policy is the reference at step 1: DPO's ln 2, plus the weighted NLL of the chosen replies
    assert first["loss"] == pytest.approx(math.log(2) + SFT_WEIGHT * first["chosen_nll"], rel=1e-5)
    assert steps[-1]["chosen_nll"] < 0.5 * first["chosen_nll"]
    assert (first["rewards_chosen"], first["rewards_rejected"], first["reward_margin"]) == (0.0, 0.0, 0.0)
    assert first["pairs"] >= 2 * (2 if kind == "lora" else 1)  # ranks x 2 samples, each with a whole pair or more
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["first_loss"] == first["loss"]
    assert summary["reward_accuracy"] > 0.9 and summary["val_reward_accuracy"] > 0.9
    assert summary["reward_margin"] > 0 and summary["rewards_chosen"] > summary["rewards_rejected"]
    assert summary["final_loss"] < 0.5 * first["loss"]
    estimate = json.loads((run / "memory_estimate.json").read_text())  # full: a copy of the weights, lora: none
    assert estimate["reference_gib"] == (estimate["parameters_gib"] if kind == "full" else 0.0)
    stats = summary["data_stats"]  # two documents per pair, none split or skipped
    assert stats["documents"] == 2 * (stats["rows"] - stats["dropped"]) and stats["skipped"] == 0

    # The export is the tuned policy: asked held-out questions through transformers, it prefers the
    # chosen reply to random words by more than the starting model does, on every question.
    tokenizer = AutoTokenizer.from_pretrained(summary["export_dir"])
    tuned = AutoModelForCausalLM.from_pretrained(summary["export_dir"]).eval()
    base = AutoModelForCausalLM.from_pretrained(assets.tiny_qwen3_dir).eval()
    rng = random.Random(1)
    words = " ".join(held_out).split()
    for question in held_out:
        rejected = " ".join(rng.choices(words, k=8))
        margin = {name: _response_logps(model, tokenizer, question, CHOSEN) - _response_logps(model, tokenizer, question, rejected)
                  for name, model in (("tuned", tuned), ("base", base))}  # fmt: skip
        assert margin["tuned"] > margin["base"], question
    # and greedy generate() answers every held-out question with exactly the chosen reply
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for question in held_out:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)  # fmt: skip
        inputs = tokenizer(prompt, return_tensors="pt")
        output = tuned.generate(**inputs, max_new_tokens=24, do_sample=False, eos_token_id=im_end)
        reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=False)
        assert reply == f"<think>\n\n</think>\n\n{CHOSEN}<|im_end|>", question


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_resumed_dpo_run_ends_on_the_uninterrupted_runs_losses_rewards_and_export(request, kind, tmp_path):
    """The run's dir as it stood after a checkpoint, resumed (kill -9 itself: tests/test_resume.py):
    the adapters or weights, the optimizer, the data position and, for finetune=full, the frozen
    reference come back (the reference is a checkpoint state of its own: taken again at the
    resume, it would be the resumed policy, and every reward would start again from 0), and the
    remaining steps are the uninterrupted run's, bit for bit."""
    from safetensors.torch import load_file

    run, _ = request.getfixturevalue(f"dpo_{kind}_run")
    step = RESUMED_FROM[kind]
    copy = as_of_checkpoint(run, tmp_path / "run", step=step)
    result = launch(None, f"run.resume={copy}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"continuing from checkpoint step-{step}" in result.stdout + result.stderr
    fields = ("loss", "chosen_nll", "rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy", "pairs")
    resumed, uninterrupted = ({r["step"]: [r[f] for f in fields] for r in read_jsonl(d / "metrics.jsonl") if "loss" in r}
                              for d in (copy, run))  # fmt: skip
    assert sorted(resumed) == sorted(uninterrupted)
    assert [resumed[s] for s in sorted(resumed) if s > step] == [uninterrupted[s] for s in sorted(resumed) if s > step]
    summaries = [json.loads((d / "summary.json").read_text()) for d in (copy, run)]
    for key in ("final_loss", "val_loss", "val_reward_accuracy", "reward_margin"):
        assert summaries[0][key] == summaries[1][key], key
    exported = [load_file(d / "hf_export" / "model.safetensors") for d in (copy, run)]
    assert exported[0].keys() == exported[1].keys()
    assert all(torch.equal(exported[0][k], exported[1][k]) for k in exported[1])


# ---- the DPO metrics in the summary, the sweep table, the objective and the progress line -------


def test_dpo_metrics_reach_the_summary_the_sweep_table_the_objective_and_the_progress_line(tmp_path):
    from test_sweeps import csv_rows, write_records

    from qwen3_neuron.eval.eval_section import EvalSettings
    from qwen3_neuron.eval.objective import check_objective
    from qwen3_neuron.launch.progress import Progress
    from qwen3_neuron.report.summary import summarize, summary_lines, sweep_job_value
    from qwen3_neuron.report.sweep_table import write_report

    for job, beta, accuracy in (("0", 0.1, 0.75), ("1", 0.5, 1.0)):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- preference.beta={beta}\n")
        step = {"loss": 0.4, "pairs": 8.0, "rewards_chosen": 0.3, "rewards_rejected": -0.2,
                "reward_accuracy": accuracy, "reward_margin": 0.5}  # fmt: skip
        held_out = {"val_loss": 0.45, "val_pairs": 4.0, "val_rewards_chosen": 0.25, "val_rewards_rejected": -0.1,
                    "val_reward_accuracy": accuracy / 2, "val_reward_margin": 0.35}  # fmt: skip
        write_records(tmp_path / job, [{"step": 1, **step, "loss": 0.6931}, {"step": 2, **step}, {"step": 2, **held_out}])
        summary = summarize(tmp_path / job, "completed", 1.0)
        (tmp_path / job / "summary.json").write_text(json.dumps(summary))
    assert {k: summary[k] for k in ("first_loss", "final_loss", "reward_accuracy", "reward_margin", "rewards_chosen",
                                    "rewards_rejected", "val_loss", "val_reward_accuracy", "val_reward_margin")} == {
        "first_loss": 0.6931, "final_loss": 0.4, "reward_accuracy": 1.0, "reward_margin": 0.5, "rewards_chosen": 0.3,
        "rewards_rejected": -0.2, "val_loss": 0.45, "val_reward_accuracy": 0.5, "val_reward_margin": 0.35}  # fmt: skip
    assert "preference: reward accuracy 1.00, margin 0.500 (validation: accuracy 0.50, margin 0.350)" in summary_lines(summary)
    for objective in ("reward_accuracy", "val_reward_accuracy", "val_reward_margin"):
        check_objective(objective, EvalSettings())
    assert sweep_job_value(summary, "val_reward_accuracy", stop_on_failure=True) == 0.5
    write_report(tmp_path)
    rows = csv_rows(tmp_path / "summary.csv")
    assert [(r["preference.beta"], r["reward_accuracy"], r["val_reward_accuracy"]) for r in rows] == [
        ("0.1", "0.75", "0.375"), ("0.5", "1.0", "0.5")]  # fmt: skip
    out = io.StringIO()
    progress = Progress(tmp_path / "0" / "metrics.jsonl", total_steps=2, stream=out)
    progress._poll()
    progress.stop()
    assert "step 2/2  loss 0.4000  val 0.4500 (step 2)  acc 0.75  margin 0.500" in out.getvalue()


# ---- the training seam (finetune/dpo_step.py), in-process -------------------------------------


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_frozen_reference_swaps_the_starting_weights_in_and_back_bit_for_bit_and_survives_a_checkpoint():
    from qwen3_neuron.trainers.preference_step import FrozenReference

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference = FrozenReference(model)
    assert int(reference.taken) == 0
    reference.take()
    start = _weights(model)
    with torch.no_grad():  # training moves the policy away
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    trained = _weights(model)
    with reference.swapped_in():
        assert _bitwise_equal(_weights(model), start)
    assert _bitwise_equal(_weights(model), trained)

    # a checkpoint's round trip (torch.save, as DCP stores the tensors): a resumed run's reference
    # is the first run's starting weights, not the weights it resumes with
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    resumed_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    resumed_model.load_state_dict(model.state_dict())
    resumed = FrozenReference(resumed_model)  # as built at a resume: a copy of whatever the model holds
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer))
    assert int(resumed.taken) == 1
    with resumed.swapped_in():
        assert _bitwise_equal(_weights(resumed_model), start)
    assert _bitwise_equal(_weights(resumed_model), trained)


def test_pairs_and_chosen_tokens_are_counted_from_the_sequence_ids():
    from qwen3_neuron.trainers.preference_step import _counts

    sequence_ids = torch.tensor([
        [-1, -1, 0, 0, 0, -1, 1, 1, -1, 2, 2, -1, 3, 3, 3],  # two pairs: chosen 0 (3 tokens) and 2 (2)
        [-1, 0, 0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1],  # one pair: chosen 0 (2 tokens)
        [-1] * 15,  # padding only
    ])  # fmt: skip
    assert _counts(sequence_ids) == (3, 7)


@pytest.mark.numerics
def test_lora_adapters_off_computes_the_base_models_output_and_then_the_adapted_one_again():
    from torchtitan.models.common.linear import Linear

    from qwen3_neuron.trainers.preference_step import adapters_off
    from qwen3_neuron.finetune.lora import LoRADropoutConverter

    torch.manual_seed(0)
    converter = LoRADropoutConverter.Config(rank=2, alpha=4.0, dropout=0.0).build()
    layers = [converter.convert(Linear.Config(in_features=n, out_features=m, bias=False)).build()
              for n, m in ((8, 6), (6, 4))]  # fmt: skip
    with torch.no_grad():
        for p in (p for layer in layers for p in layer.parameters()):
            p.copy_(torch.randn(p.shape))  # B nonzero: the adapters change the output
    model = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1]).eval()
    x = torch.randn(3, 8)
    base = torch.tanh(x @ layers[0].weight.T) @ layers[1].weight.T  # the weights without their adapters
    with torch.no_grad():
        adapted = model(x)
        with adapters_off(model):
            off = model(x)
        again = model(x)
    torch.testing.assert_close(off, base, rtol=0, atol=1e-6)  # float32, the same 8- and 6-term sums: equal
    assert (adapted - base).abs().max() > 1e-2
    assert torch.equal(again, adapted)


# ---- the project's own rendering and packing against TRL's per-sequence log-probabilities --------


@pytest.mark.numerics
def test_the_projects_sequence_logps_are_trls_without_the_newline_after_the_end_of_turn(assets, tmp_path, tokenizer):
    """The same rows rendered and packed by the project (data=preference) and by TRL 1.16's
    DPOTrainer, scored by the same model: each response's log-probability is TRL's less one token.
    TRL trains the `\\n` the chat template writes after `<|im_end|>`; the project does not (as in
    data=chat: generation stops at `<|im_end|>`, the `\\n` is never generated)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(assets.tiny_qwen3_dir, dtype=torch.float32).eval()
    trainer = _trl_trainer(assets.tiny_qwen3_dir, None, model, "sigmoid", 0.1, 0.0, 0.0, tmp_path / "trl")
    batch = next(iter(trainer.get_train_dataloader()))
    ids, mask = batch["input_ids"], batch["completion_mask"]
    trl_labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    with torch.no_grad():
        trl_tokens = token_logps(model(ids, attention_mask=batch["attention_mask"]).logits[:, :-1], trl_labels)
    n = ids.shape[0] // 2  # TRL's rows: the chosen responses, then the rejected ones

    # the project: the same three pairs, one pair a sample (packing=none keeps their order)
    files = tmp_path / "pairs.jsonl"
    files.write_text("".join(json.dumps(row) + "\n" for row in TRL_ROWS))
    source = dataclasses.replace(PREFERENCE, files=str(files), packing="none")
    samples = list(PackedDataset(source, tokenizer, seq_len=128, infinite=False))
    assert len(samples) == n == 3
    matched = []
    newline = tokenizer.encode("\n", add_bos=False, add_eos=False)
    for k, (input_dict, labels) in enumerate(samples):
        inputs, positions = input_dict["input"], input_dict["positions"].tolist()
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
        with torch.no_grad():  # each document alone: what the block-causal mask from positions computes
            logits = torch.cat([model(inputs[None, a:b]).logits[0] for a, b in zip(starts, starts[1:])])
        sums, _ = sequence_sums(token_logps(logits[None], labels[None]), input_dict[SEQUENCE_IDS][None])
        for side in (0, 1):  # chosen, rejected
            ours = labels[input_dict[SEQUENCE_IDS] == side].tolist()
            assert ours[-1] == tokenizer.tokenizer.token_to_id("<|im_end|>")
            # TRL's row of the same response (its loader shuffles): exactly one, one token longer
            trained_by_trl = {r: trl_labels[r][trl_labels[r] != -100].tolist() for r in range(side * n, (side + 1) * n)}
            [row] = [r for r, tokens in trained_by_trl.items() if tokens == ours + newline]
            last = trl_tokens[row][trl_labels[row] != -100][-1]  # TRL's one more token: the newline
            # float32 both, the same model batched differently: its 768-term sums round by at most
            # 768 x 2^-24 = 4.6e-5 relative each, summed over ~30 tokens whose errors do not add up in sign
            assert float(sums[0, side]) == pytest.approx(float(trl_tokens[row].sum() - last), rel=1e-5, abs=1e-5)
            assert float(last) < 0  # a token of its own, with its own probability
            matched.append(row)
    assert sorted(matched) == list(range(2 * n))



# ---- model=hf flavor full: each packed sequence scored alone ------------------------------------

HF_FULL = ("model=hf", "model.flavor=full", "device=cpu")  # full: the backend's causal mask over the whole sample
APART = "block-causal: each packed sequence attends within itself"


@pytest.mark.parametrize("trainer, data, mask, said", [
    ("dpo", "preference", "block_causal", APART),
    ("orpo", "preference", "block_causal", APART),
    ("simpo", "preference", "block_causal", APART),
    ("kto", "preference", "block_causal", APART),
    ("reward_model", "preference", "block_causal", APART),
    ("sft", "chat", "causal", "causal across the sample (model.flavor=full)"),  # SFT keeps the flavour's
])  # fmt: skip
def test_on_model_hf_flavor_full_the_trainers_that_score_sequences_alone_get_the_block_causal_mask(
    assets, tmp_path, trainer, data, mask, said
):
    """The mask is the model config's before anything is built, and the plan's attention line says it."""
    from qwen3_neuron.job.checks.memory import _shape, attention_note
    from qwen3_neuron.job.trainer_config import build_trainer_config

    job = compose_job(*HF_FULL, f"model.hf_model={assets.tiny_qwen3_dir}", f"data={data}", f"trainer={trainer}")
    settled = job.settled()
    config = build_trainer_config(settled, tmp_path)
    assert config.model_spec.model.attn_mask_type == mask
    assert said in attention_note(config, _shape(config, settled.model_dir), "cpu")


# float32's unit roundoff times the longest sum in the model (the MLP's down projection, 768 terms):
# what one logit may round differently when the same rows are computed in another batch shape
SUM_ROUNDING = 2**-24 * 768


@pytest.mark.numerics
def test_on_model_hf_flavor_full_a_packed_pairs_log_probabilities_are_each_sequences_alone(
    assets, tmp_path, tokenizer, monkeypatch
):
    """A pair packed as the trainer packs it (chosen, then rejected, in one sample), scored by the
    model=hf model the DPO trainer's config builds (the tiny dir's weights, attending as a CPU
    worker does: SDPA on the backend's mask made dense): each response's log-probability is the
    one its sequence gets alone, as TRL scores it. With the `full` flavour's causal mask the
    rejected response reads the chosen one: 0.43 nats off on this pair, against a bound of 0.003."""
    from test_hf import build_hf_model, weights
    from torchtitan.experiments.transformers_modeling_backend import model as hf_backend

    from qwen3_neuron.job.trainer_config import build_trainer_config
    from qwen3_neuron.kernels.attention.sdpa import hf_sdpa_attention_forward
    from qwen3_neuron.models.logprobs import model_token_logps

    monkeypatch.setattr(hf_backend, "flex_attention_forward", hf_sdpa_attention_forward)  # devices.fixes' swap
    job = compose_job(*HF_FULL, f"model.hf_model={assets.tiny_qwen3_dir}", "data=preference", "trainer=dpo")
    config = build_trainer_config(job.settled(), tmp_path)
    model = build_hf_model(config)
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, config.hf_assets_path)
    model.load_state_dict(adapter.from_hf(weights(assets.tiny_qwen3_dir)))
    model.eval()

    files = tmp_path / "pairs.jsonl"
    files.write_text("".join(json.dumps(row) + "\n" for row in TRL_ROWS))
    source = dataclasses.replace(PREFERENCE, files=str(files), packing="none")  # one pair a sample
    input_dict, labels = next(iter(PackedDataset(source, tokenizer, seq_len=128, infinite=False)))
    inputs, positions, sequence_ids = input_dict["input"], input_dict["positions"], input_dict[SEQUENCE_IDS]
    starts = [i for i, p in enumerate(positions.tolist()) if p == 0]  # the chosen, the rejected, the padding
    with torch.no_grad():
        packed_logps = model_token_logps(model, inputs[None], labels[None], {"positions": positions[None]})
        packed, counts = sequence_sums(packed_logps, sequence_ids[None])
        largest_logit = float(model(inputs[None], positions=positions[None]).abs().max())
        alone = []  # each sequence in a forward of its own
        for a, b in zip(starts, starts[1:]):
            logps = model_token_logps(model, inputs[None, a:b], labels[None, a:b], {"positions": positions[None, a:b]})
            alone.append(float(logps.sum()))
    # a log-probability is a logit less a logsumexp (a weighted mean of the logits): each rounds by
    # at most SUM_ROUNDING x the largest logit; a sequence's sum adds one per trained token
    assert counts[0].min() > 0  # both responses are in the sample
    for side in (0, 1):
        bound = 2 * SUM_ROUNDING * largest_logit * float(counts[0, side])
        assert abs(float(packed[0, side]) - alone[side]) <= bound, side
