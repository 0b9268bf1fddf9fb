"""The preference family beside DPO (trainer=orpo|simpo|kto): each loss and its metrics equal TRL's
own on the same batch of log-probabilities (TRL 1.16's ORPOTrainer, CPOTrainer with
loss_type="simpo", KTOTrainer, their loss functions driven with fixed log-probabilities in place of
a model's); KTO's rows, units and mismatched completions; the trainers reference-free or not, and
what the plan says about them."""

from __future__ import annotations

import io
import json
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from conftest import compose_job, plan_of
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.data.chat_rows import ChatFormatError
from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.packing import DESIRABLE, SEQUENCE_IDS
from qwen3_neuron.data.preference import row_units
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.trainers.kto import KTOObjective
from qwen3_neuron.trainers.orpo import ORPOObjective
from qwen3_neuron.trainers.preference_step import sequence_sums
from qwen3_neuron.trainers.simpo import SimPOObjective

# float32 on both sides, the same per-token log-probabilities summed (ours through the packed
# slots' index_add, TRL's per sequence) then a few elementwise operations: rel 1e-5 = 168 x 2^-24
REL = 1e-5
ACCELERATOR = SimpleNamespace(device="cpu", gather_for_metrics=lambda tensor: tensor)


def _packed_pairs(seed: int, pairs: int = 5, seq_len: int = 64):
    """Per-token log-probabilities of `pairs` pairs of responses of random lengths, packed as
    data=preference packs them (pairs side by side in samples, their tokens marked with sequence
    ids, padding after), and each response's own tokens for TRL."""
    generator = torch.Generator().manual_seed(seed)
    responses = [torch.log_softmax(torch.randn(int(n), 11, generator=generator) * 2, -1)[:, 0]
                 for n in torch.randint(1, 12, (2 * pairs,), generator=generator)]  # fmt: skip
    per_token, ids = torch.zeros(2, seq_len), torch.full((2, seq_len), -1)
    for k in range(pairs):  # pairs 0, 2, 4 in sample 0, the others in sample 1
        sample, slot = k % 2, k // 2
        start = int((ids[sample] >= 0).sum()) + 3 * slot  # 3 prompt tokens before each response: no loss
        for side in range(2):
            tokens = responses[2 * k + side]
            per_token[sample, start:start + len(tokens)] = tokens
            ids[sample, start:start + len(tokens)] = 2 * slot + side
            start += len(tokens) + 3
    sums, counts = sequence_sums(per_token, ids)
    chosen, rejected = responses[0::2], responses[1::2]
    return sums, counts, chosen, rejected


def _ours(objective, policy, counts, reference=None, desirable=None):
    terms = objective.terms(policy, reference, counts, desirable, lambda tensor: tensor)
    present = (counts[:, 0] > 0) & (counts[:, 1] > 0) if desirable is None else counts[:, 0] > 0  # pairs, KTO's units
    slots = present.sum().float()
    loss = objective.loss(terms, slots, counts[:, 0].sum())
    means = objective.means(objective.metric_sums(terms))
    return float(loss), means


def _trl_pair_batch(chosen, rejected, nll: bool):
    """What TRL's `concatenated_forward` returns for these responses: mean log-probabilities (its
    average_log_prob), logits (unused here) and the chosen NLL, a mean over their tokens."""
    mean = lambda responses: torch.stack([r.mean() for r in responses])  # noqa: E731
    chosen_nll = -torch.cat(chosen).mean() if nll else torch.tensor(0.0)
    logits = torch.zeros(len(chosen), 1, 1)
    return mean(chosen), mean(rejected), logits, logits, chosen_nll


@pytest.mark.numerics
@pytest.mark.parametrize("beta, seed", [(0.1, 0), (0.5, 1)])
def test_the_orpo_loss_and_metrics_are_trls(beta, seed):
    from trl.experimental.orpo import ORPOTrainer

    policy, counts, chosen, rejected = _packed_pairs(seed)
    trl = SimpleNamespace(beta=beta, aux_loss_enabled=False, accelerator=ACCELERATOR)
    trl.odds_ratio_loss = types.MethodType(ORPOTrainer.odds_ratio_loss, trl)
    trl.concatenated_forward = lambda model, batch: _trl_pair_batch(chosen, rejected, nll=True)
    trl_loss, trl_metrics = ORPOTrainer.get_batch_loss_metrics(trl, None, {}, "train")

    loss, ours = _ours(ORPOObjective(SimpleNamespace(beta=beta)), policy, counts)
    assert ours["pairs"] == len(chosen) == 5
    assert loss == pytest.approx(float(trl_loss), rel=REL) == pytest.approx(ours["loss"], rel=REL)
    for name, trl_name in (("rewards_chosen", "rewards/chosen"), ("rewards_rejected", "rewards/rejected"),
                           ("reward_accuracy", "rewards/accuracies"), ("reward_margin", "rewards/margins"),
                           ("nll_loss", "nll_loss"), ("log_odds_ratio", "log_odds_ratio"),
                           ("log_odds_chosen", "log_odds_chosen")):  # fmt: skip
        assert ours[name] == pytest.approx(trl_metrics[trl_name], rel=REL, abs=1e-7), name


@pytest.mark.numerics
@pytest.mark.parametrize("beta, simpo_gamma, cpo_alpha, seed",
                         [(2.0, 0.5, 0.0, 0), (0.1, 0.5, 1.0, 1), (2.5, 1.4, 0.3, 2)])  # fmt: skip
def test_the_simpo_loss_and_metrics_are_trls(beta, simpo_gamma, cpo_alpha, seed):
    from trl.experimental.cpo import CPOTrainer

    policy, counts, chosen, rejected = _packed_pairs(seed)
    trl = SimpleNamespace(beta=beta, simpo_gamma=simpo_gamma, cpo_alpha=cpo_alpha, loss_type="simpo",
                          label_smoothing=0.0, alpha=0.0, aux_loss_enabled=False, accelerator=ACCELERATOR)  # fmt: skip
    trl.cpo_loss = types.MethodType(CPOTrainer.cpo_loss, trl)
    trl.concatenated_forward = lambda model, batch: _trl_pair_batch(chosen, rejected, nll=cpo_alpha != 0)
    trl_loss, trl_metrics = CPOTrainer.get_batch_loss_metrics(trl, None, {}, "train")

    settings = SimpleNamespace(beta=beta, simpo_gamma=simpo_gamma, cpo_alpha=cpo_alpha)
    loss, ours = _ours(SimPOObjective(settings), policy, counts)
    assert loss == pytest.approx(float(trl_loss), rel=REL) == pytest.approx(ours["loss"], rel=REL)
    for name, trl_name in (("rewards_chosen", "rewards/chosen"), ("rewards_rejected", "rewards/rejected"),
                           ("reward_accuracy", "rewards/accuracies"),
                           ("reward_margin", "rewards/margins")):  # fmt: skip
        assert ours[name] == pytest.approx(trl_metrics[trl_name], rel=REL, abs=1e-7), name
    if cpo_alpha:  # TRL computes (and reports) no NLL without its weight
        assert ours["nll_loss"] == pytest.approx(trl_metrics["nll_loss"], rel=REL)


def _kto_batch(seed: int, units: int, kl_shift: float):
    """Per-token log-probabilities of `units` completions and of their mismatched ones, under the
    policy and the reference (the policy's mismatched ones `kl_shift` above the reference's on
    average), each row padded to 12 positions with zeros outside the completion (TRL's fused
    head's log_probs), and the labels: the first three desirable."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(1, 9, (units,), generator=generator)
        mask = torch.arange(12).unsqueeze(0) >= 12 - lengths.unsqueeze(1)  # the completion ends each row
        logps = (torch.log_softmax(torch.randn(units, 12, 7, generator=generator) * 2, -1)[..., 0] + shift) * mask
        return logps, mask

    policy, mask = tokens()
    reference = (policy + 0.3 * torch.randn(units, 12, generator=generator)) * mask
    kl_policy, kl_mask = tokens(kl_shift)
    kl_reference = (kl_policy - kl_shift + 0.2 * torch.randn(units, 12, generator=generator)) * kl_mask
    labels = [i < 3 for i in range(units)]
    return policy, reference, mask, kl_policy, kl_reference, kl_mask, labels


@pytest.mark.numerics
@pytest.mark.parametrize("beta, desirable_weight, undesirable_weight, kl_shift, seed",
                         [(0.1, 1.0, 1.0, 0.05, 0), (0.5, 1.33, 1.0, 0.02, 1), (0.1, 1.0, 1.0, -0.3, 2)])  # fmt: skip
def test_the_kto_loss_kl_and_metrics_are_trls(beta, desirable_weight, undesirable_weight, kl_shift, seed):
    from trl import KTOTrainer

    units = 7
    policy, reference, mask, kl_policy, kl_reference, kl_mask, labels = _kto_batch(seed, units, kl_shift)
    batch = {"input_ids": torch.zeros(units, 13, dtype=torch.long), "attention_mask": torch.ones(units, 13),
             "completion_mask": torch.cat([torch.zeros(units, 1), mask.float()], 1), "label": torch.tensor(labels),
             "ref_logps": reference.sum(-1), "ref_KL_logps": kl_reference.sum(-1),
             "KL_input_ids": torch.zeros(units, 13, dtype=torch.long), "KL_attention_mask": torch.ones(units, 13),
             "KL_completion_mask": torch.cat([torch.zeros(units, 1), kl_mask.float()], 1)}  # fmt: skip

    def model(input_ids, **kwargs):  # TRL's fused head's outputs: the per-token log-probabilities
        logps = kl_policy if input_ids is batch["KL_input_ids"] else policy
        return SimpleNamespace(log_probs=logps, entropy=torch.zeros_like(logps), mean_logits=torch.zeros_like(logps))

    trl = SimpleNamespace(beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
                          loss_type="kto", calculate_KL=True, precompute_ref_logps=True, aux_loss_enabled=False,
                          accelerator=ACCELERATOR, model=SimpleNamespace(training=True),
                          _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)  # fmt: skip
    trl._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, trl)
    trl_loss = float(KTOTrainer._compute_loss(trl, model, batch, return_outputs=False))
    trl_metrics = {name: values[-1] for name, values in trl._metrics["train"].items()}

    # the same units as their slots: column 0 the completion, 1 the mismatched one; one slot empty
    slots = lambda a, b: torch.cat([torch.stack([a.sum(-1), b.sum(-1)], 1), torch.zeros(1, 2)])  # noqa: E731
    counts = slots(mask.float(), kl_mask.float())
    desirable = torch.tensor([*labels, False])
    settings = SimpleNamespace(beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight)
    loss, ours = _ours(KTOObjective(settings), slots(policy, kl_policy), counts, slots(reference, kl_reference),
                       desirable)  # fmt: skip
    assert (ours["units"], ours["desirable"], ours["undesirable"]) == (7, 3, 4)
    assert loss == pytest.approx(trl_loss, rel=REL) == pytest.approx(ours["loss"], rel=REL)
    assert ours["kl"] == pytest.approx(trl_metrics["kl"], rel=REL, abs=1e-7)
    assert (ours["kl"] > 0) == (kl_shift > 0)  # below 0 the estimate is held at 0, as TRL holds it
    for name, trl_name in (("rewards_chosen", "rewards/chosen"), ("rewards_rejected", "rewards/rejected"),
                           ("reward_margin", "rewards/margins")):  # fmt: skip
        assert ours[name] == pytest.approx(trl_metrics[trl_name], rel=REL, abs=1e-7), name


# ---- KTO's rows -------------------------------------------------------------------------------

KTO_SOURCE = DataSource(format="kto", prompt_field="prompt")


@pytest.fixture(scope="module")
def tokenizer(assets):
    return HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))


def test_kto_reads_trls_unpaired_rows_and_pairs_as_one_desirable_and_one_undesirable_unit():
    unpaired = row_units({"prompt": "Hi?", "completion": "Hello.", "label": False}, KTO_SOURCE)
    assert [(u.prompt, u.completion, u.desirable) for u in unpaired] == [
        ([{"role": "user", "content": "Hi?"}], [{"role": "assistant", "content": "Hello."}], False)]
    hi = [{"role": "user", "content": "Hi?"}]
    pair = row_units({"prompt": hi, "chosen": "Hello.", "rejected": "Go."}, KTO_SOURCE)
    assert [(u.completion[0]["content"], u.desirable) for u in pair] == [("Hello.", True), ("Go.", False)]
    assert pair[0].prompt == pair[1].prompt == [{"role": "user", "content": "Hi?"}]


@pytest.mark.parametrize("row, error", [
    ({"prompt": "Hi?", "completion": "Hello."}, "data.label_field=label: the row has no label (true: desirable, "
                                                "false: undesirable), and no chosen / rejected pair"),
    ({"prompt": "Hi?", "completion": "Hello.", "label": "yes"}, "data.label_field=label: the label is 'yes', not "
                                                                "true (desirable) or false (undesirable)"),
    ({"prompt": "Hi?", "completion": "Hello.", "label": 1}, "the label is 1, not true"),
    ({"prompt": "Hi?", "label": True}, "data.completion_field=completion: the row has no completion"),
])  # fmt: skip
def test_a_row_kto_cannot_read_says_why(row, error):
    with pytest.raises(ChatFormatError, match=error.replace("(", r"\(").replace(")", r"\)")):
        row_units(row, KTO_SOURCE)


def test_each_kto_unit_is_packed_with_its_prompt_and_the_previous_rows_completion(tmp_path, tokenizer):
    """TRL's rotation over the rank's rows: row i's units take row i - 1's completions for their
    KL estimate (the first row, the second's); the desirable completions marked; a bad label skipped."""
    rows = [{"prompt": f"Q{i}?", "completion": f"A{i}.", "label": i % 3 != 1} for i in range(6)]
    rows.insert(3, {"prompt": "Q?", "completion": "A.", "label": "maybe"})
    files = tmp_path / "feedback.jsonl"
    files.write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = DataSource(format="kto", prompt_field="prompt", files=str(files), packing="greedy", max_dropped=0.5)
    dataset = PackedDataset(source, tokenizer, seq_len=512, infinite=False)
    (input_dict, labels), = list(dataset)
    text = lambda ids: tokenizer.decode([t for t in ids if t >= 0])  # noqa: E731  (special tokens left out)
    ids, marks, positions = input_dict[SEQUENCE_IDS], input_dict[DESIRABLE], input_dict["positions"]
    starts = [i for i, p in enumerate(positions.tolist()) if p == 0]
    documents = [(text(input_dict["input"][a:b].tolist()), labels[a:b], ids[a:b], marks[a:b])
                 for a, b in zip(starts, starts[1:])]  # fmt: skip
    seen = [(doc.split("user\n")[1].split("\n")[0], text(doc_labels.tolist()).split("\n\n")[-1],
             int(doc_ids.max()), bool(doc_marks.any()))
            for doc, doc_labels, doc_ids, doc_marks in documents]  # fmt: skip
    assert seen == [("Q1?", "A1.", 0, False), ("Q1?", "A0.", 1, False),
                    ("Q0?", "A0.", 2, True), ("Q0?", "A1.", 3, False),
                    ("Q2?", "A2.", 4, True), ("Q2?", "A1.", 5, False),
                    ("Q3?", "A3.", 6, True), ("Q3?", "A2.", 7, False),
                    ("Q4?", "A4.", 8, False), ("Q4?", "A3.", 9, False),
                    ("Q5?", "A5.", 10, True), ("Q5?", "A4.", 11, False)]  # fmt: skip
    assert dataset.stats["skipped"] == 1 and "the label is 'maybe'" in dataset.examples["skipped"][0]
    assert dataset.stats["documents"] == 12


# ---- their sections, and the memory plan: ORPO and SimPO hold no reference ----------------------


def test_a_trainer_section_without_its_yaml_is_refused():
    """A trainer's section comes whole from its YAML (its dataclass holds no defaults)."""
    from qwen3_neuron.errors import ConfigError
    from qwen3_neuron.fields import build_fields
    from qwen3_neuron.job.settings import KTOSettings

    with pytest.raises(ConfigError, match=r"^kto.desirable_weight is not set: the YAML that fills the kto section names "
                                          r"every key of it \(beta, desirable_weight, undesirable_weight\).$"):
        build_fields(KTOSettings, {"beta": 0.1}, "kto")
    values = {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 2}
    assert build_fields(KTOSettings, values, "kto") == KTOSettings(beta=0.1, desirable_weight=1.0, undesirable_weight=2.0)


def test_orpo_and_simpo_plan_no_reference_and_less_memory_than_dpo(tmp_path, assets):
    full = ["experiment=cpu_qwen3_tiny_preference", "finetune=full", "run.nproc_per_node=1"]
    estimates = {trainer: plan_of(compose_job(*full, f"trainer={trainer}"), tmp_path / trainer).memory
                 for trainer in ("dpo", "kto", "orpo", "simpo")}  # fmt: skip
    assert estimates["dpo"].reference_gib == estimates["kto"].reference_gib == estimates["dpo"].parameters_gib > 0
    for trainer in ("orpo", "simpo"):
        assert estimates[trainer].reference_gib == 0
        dpo = estimates["dpo"]
        assert estimates[trainer].per_rank_gib == pytest.approx(dpo.per_rank_gib - dpo.reference_gib)



# ---- their metrics in the summary, the sweep table and the progress line ---------------------------


def test_orpo_and_kto_metrics_reach_the_summary_the_sweep_table_and_the_progress_line(tmp_path):
    from test_sweeps import csv_rows, write_records

    from qwen3_neuron.launch.progress import Progress
    from qwen3_neuron.report.summary import summarize, summary_lines
    from qwen3_neuron.report.sweep_table import write_report

    orpo = {"loss": 5.9, "pairs": 4.0, "rewards_chosen": -0.58, "rewards_rejected": -0.7, "reward_accuracy": 1.0,
            "reward_margin": 0.12, "nll_loss": 5.88, "log_odds_ratio": -0.26, "log_odds_chosen": 1.18}
    kto = {"loss": 0.4, "units": 8.0, "desirable": 3.0, "undesirable": 5.0, "rewards_chosen": 0.2,
           "rewards_rejected": -0.3, "reward_margin": 0.5, "kl": 0.125}  # fmt: skip
    summaries = {}
    for job, trainer, step in (("0", "orpo", orpo), ("1", "kto", kto)):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- trainer={trainer}\n")
        held_out = {f"val_{name}": value / 2 for name, value in step.items() if name != "loss"}
        write_records(tmp_path / job, [{"step": 1, **step}, {"step": 1, "val_loss": 0.3, **held_out}])
        summaries[trainer] = summarize(tmp_path / job, "completed", 1.0)
        (tmp_path / job / "summary.json").write_text(json.dumps(summaries[trainer]))
    shown = ("reward_accuracy", "nll_loss", "log_odds_ratio", "val_log_odds_chosen")
    assert {k: summaries["orpo"][k] for k in shown} == {
        "reward_accuracy": 1.0, "nll_loss": 5.88, "log_odds_ratio": -0.26, "val_log_odds_chosen": 0.59}
    assert "kl" not in summaries["orpo"]
    assert {k: summaries["kto"][k] for k in ("reward_accuracy", "reward_margin", "kl", "val_kl")} == {
        "reward_accuracy": None, "reward_margin": 0.5, "kl": 0.125, "val_kl": 0.0625}
    assert "preference: kl 0.1250, reward margin 0.500" in summary_lines(summaries["kto"])
    write_report(tmp_path)
    rows = csv_rows(tmp_path / "summary.csv")
    assert [(r["trainer"], r["reward_margin"], r["nll_loss"], r["log_odds_ratio"], r["kl"]) for r in rows] == [
        ("orpo", "0.12", "5.88", "-0.26", ""), ("kto", "0.5", "", "", "0.125")]
    out = io.StringIO()
    progress = Progress(tmp_path / "1" / "metrics.jsonl", total_steps=1, stream=out)
    progress._poll()
    progress.stop()
    assert "step 1/1  loss 0.4000  val 0.3000 (step 1)  kl 0.1250  margin 0.500" in out.getvalue()
