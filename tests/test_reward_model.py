"""trainer=reward_model: TRL's RewardTrainer loss and metrics on packed pairs scored at their last
tokens; the export a Qwen3ForSequenceClassification dir (and a PEFT adapter with the head) that
scores as the run did; the export as a GRPO reward, mixed with a Python reward by weight.

One launch (`reward_model_run`, model=hf with LoRA, 2 gloo ranks) serves every test that needs a
trained reward model; the rest run in this process."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from conftest import compose_job, plan_of, read_jsonl, trained
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.packing import MARGINS, SEQUENCE_IDS
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.trainers.reward_model import HELD_OUT_SCORES
from qwen3_neuron.trainers.reward_model_loss import mean_metrics, pair_losses, pair_metrics, pair_scores, step_loss

ROWS = [
    {"prompt": [{"role": "user", "content": "What does getcontext() do?"}],
     "chosen": [{"role": "assistant", "content": "Returns this thread's context."}],
     "rejected": [{"role": "assistant", "content": "Nothing at all, ever."}], "margin": 0.5},
    {"prompt": [{"role": "user", "content": "How is it declared?"}],
     "chosen": [{"role": "assistant", "content": "def getcontext():"}],
     "rejected": [{"role": "assistant", "content": "class Context: pass, with more words"}], "margin": 0.0},
    {"prompt": [{"role": "user", "content": "What is a deque?"}],
     "chosen": [{"role": "assistant", "content": "A double-ended queue."}],
     "rejected": [{"role": "assistant", "content": "A dictionary."}], "margin": 1.5},
]  # fmt: skip


@pytest.mark.numerics
def test_the_loss_and_metrics_are_trls_on_the_same_pairs(assets, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(2)  # a head whose scores order some pairs right and some wrong
    model = AutoModelForSequenceClassification.from_pretrained(assets.tiny_qwen3_dir, num_labels=1,
                                                               dtype=torch.float32).eval()  # fmt: skip
    with torch.no_grad():  # a head that scores clearly apart (a new one scores every sequence near 0)
        model.score.weight.normal_(std=0.5)
    coefficient = 0.01
    args = RewardConfig(output_dir=str(tmp_path), center_rewards_coefficient=coefficient, per_device_train_batch_size=3,
                        report_to=[], use_cpu=True, bf16=False, max_length=None)  # fmt: skip
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS),
                            processing_class=AutoTokenizer.from_pretrained(assets.tiny_qwen3_dir))  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        trl_loss = float(trainer.compute_loss(model, dict(batch)))
    trl = {name: values[-1] for name, values in trainer._metrics["eval"].items()}  # the model is in eval mode

    # The same pairs as this project packs them: each pair's chosen and rejected sequence side by
    # side in one sample, each marked at its last token, the pair's margin at the chosen's mark.
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        scores = model.score(model.model(input_ids=ids, attention_mask=mask).last_hidden_state).squeeze(-1)
    n, length = ids.shape[0] // 2, ids.shape[1]
    last = mask.sum(dim=1) - 1  # right-padded: the last token of each sequence
    sequence_ids = torch.full((n, 2 * length), -1)
    margins = torch.zeros(n, 2 * length)
    for pair in range(n):
        sequence_ids[pair, last[pair]] = 0
        sequence_ids[pair, length + last[n + pair]] = 1
        margins[pair, last[pair]] = batch["margin"][pair]
    rewards, pair_margins, present = pair_scores(torch.cat([scores[:n], scores[n:]], dim=1), sequence_ids, margins)
    losses = pair_losses(rewards, pair_margins, present, coefficient)
    ours = mean_metrics(*pair_metrics(rewards, losses, present))

    assert ours["pairs"] == n == 3
    # float32, the same scores on both sides; the losses summed in another order: rel 1e-6 = 17 x 2^-24
    assert float(step_loss(losses, torch.tensor(3.0))) == pytest.approx(trl_loss, rel=1e-6)
    assert ours["loss"] == pytest.approx(trl_loss, rel=1e-6)
    for name in ("margin", "mean_reward", "min_reward", "max_reward"):
        assert ours[name] == pytest.approx(trl[name], rel=1e-6, abs=1e-7), name
    assert ours["accuracy"] == pytest.approx(trl["accuracy"], rel=1e-6)  # TRL's is a float32 mean
    assert 0 < ours["accuracy"] < 1  # the pairs disagree: the sign of each difference matters


def test_a_scored_pair_keeps_every_token_marks_its_last_and_carries_its_margin(assets, tmp_path):
    from transformers import AutoTokenizer

    files = tmp_path / "pairs.jsonl"
    files.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    source = DataSource(format="preference", prompt_field="prompt", files=str(files), scored_pairs=True)
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))
    samples = list(PackedDataset(source, tokenizer, seq_len=128, infinite=False))
    hf = AutoTokenizer.from_pretrained(assets.tiny_qwen3_dir)
    rendered = {tuple(hf.apply_chat_template(row["prompt"] + row[side], tokenize=True, return_dict=True)["input_ids"]):
                (side, row["margin"]) for row in ROWS for side in ("chosen", "rejected")}  # fmt: skip
    seen = []
    for input_dict, _ in samples:
        tokens, positions = input_dict["input"].tolist(), input_dict["positions"].tolist()
        ids, margins = input_dict[SEQUENCE_IDS].tolist(), input_dict[MARGINS].tolist()
        for mark in (i for i, sequence in enumerate(ids) if sequence >= 0):
            sequence = tuple(tokens[mark - positions[mark]:mark + 1])  # its document, up to the mark
            side, margin = rendered[sequence]  # the whole conversation as Transformers renders it
            assert side == ("chosen", "rejected")[ids[mark] % 2]
            assert margins[mark] == (margin if side == "chosen" else 0.0)
            assert mark + 1 == len(positions) or positions[mark + 1] == 0  # the last token of its document
            seen.append(sequence)
    assert sorted(seen) == sorted(rendered)
    # a pair longer than seq_len is dropped whole: a cut sequence has no last token to score
    short = PackedDataset(dataclasses.replace(source, max_dropped=None), tokenizer, seq_len=60, infinite=False)
    list(short)
    assert short.stats["dropped"] == 3 and "a pair is never cut" in short.examples["dropped"][0]


def test_held_out_pairs_are_each_scored_once_before_they_come_round_again(assets):
    """torchtitan's Validator re-loops its data when it takes a fixed number of steps: a held-out set
    smaller than the packing buffer is packed whole each pass, not refilled with copies of itself."""
    source = DataSource(format="preference", prompt_field="prompt", files=str(assets.preference_validation_file),
                        scored_pairs=True)  # fmt: skip
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))
    rows = len(assets.preference_validation_file.read_text().splitlines())
    for rank in range(2):
        dataset = PackedDataset(source, tokenizer, seq_len=128, dp_rank=rank, dp_world_size=2, role="validation")
        seen = []
        for input_dict, _ in dataset:
            tokens, marks = input_dict["input"].tolist(), input_dict[SEQUENCE_IDS].tolist()
            seen += [tuple(tokens[:i + 1]) for i, mark in enumerate(marks) if mark >= 0 and mark % 2 == 0]
            if len(seen) >= rows // 2:
                break
        assert len(set(seen[:rows // 2])) == rows // 2  # the rank's 14 pairs, each once


# ---- the trained reward model ----------------------------------------------------------------------

STEPS = 8


@pytest.fixture(scope="module")
def reward_model_run(tmp_path_factory, assets):
    """trainer=reward_model on the tiny HF dir with LoRA, 2 gloo ranks, float32 parameters (so the
    run's scores compare with Transformers' at float32's precision): the held-out pairs validated
    at steps 1 and 8, the PEFT adapter and the merged Qwen3ForSequenceClassification exported."""
    return trained(tmp_path_factory.mktemp("reward-model") / "run",
                   "model=hf", f"model.hf_model={assets.tiny_qwen3_dir}", "finetune=lora",
                   "checkpointing=[from_hf,export_hf]", "data=preference", "trainer=reward_model",
                   f"data.val_files={assets.preference_validation_file}", f"validator.freq={STEPS}",
                   "validator.steps=2", "training.seq_len=128", "training.local_batch_size=2",
                   f"training.steps={STEPS}",
                   "training.mixed_precision_param=float32", "optimizer.lr=5e-3",
                   "hf.first_loss_check=off")  # fmt: skip


def test_the_steps_and_the_held_out_pairs_report_trls_metrics(reward_model_run):
    records = read_jsonl(reward_model_run / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    validations = [r for r in records if "val_loss" in r]
    assert {"accuracy", "margin", "mean_reward", "min_reward", "max_reward"} <= set(steps[-1])
    assert steps[0]["loss"] == pytest.approx(0.6931, abs=0.05)  # a new head scores every sequence near 0: ln 2
    assert [v["step"] for v in validations] == [1, STEPS]
    first, last = validations
    # the bundled pairs: one constant chosen reply, random words rejected; held out: other questions
    assert last["val_accuracy"] == 1.0 and last["val_pairs"] >= 8
    assert last["val_margin"] > max(1.0, first["val_margin"]) and last["val_loss"] < first["val_loss"]
    summary = json.loads((reward_model_run / "summary.json").read_text())
    assert summary["val_accuracy"] == last["val_accuracy"] and summary["val_margin"] == last["val_margin"]
    assert summary["accuracy"] == steps[-1]["accuracy"]


def _held_out(run_dir) -> list[dict]:
    return [record for path in sorted((run_dir / HELD_OUT_SCORES).glob("rank_*.jsonl")) for record in read_jsonl(path)]


def _scores(model, sequences: list[list[int]]) -> torch.Tensor:
    """Transformers' scores of token sequences, right-padded with the model's pad token."""
    pad, width = model.config.pad_token_id, max(map(len, sequences))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0]


def _bound(model, scores: torch.Tensor) -> float:
    """float32: the same weights through other kernels (one sequence in place of a packed sample);
    the score is a dot product of hidden_size terms: hidden_size x 2^-24, relative."""
    return model.config.hidden_size * 2**-24 * float(scores.abs().max())


@pytest.mark.numerics
def test_the_export_and_the_adapter_load_as_a_sequence_classifier_and_score_as_the_run(reward_model_run, assets):
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    from qwen3_neuron.hf_io.verify import check_adapter_dir, check_model_dir

    export, adapter = reward_model_run / "hf_export", reward_model_run / "hf_adapter"
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
    assert config["pad_token_id"] is not None
    with safe_open(export / "model.safetensors", framework="pt") as f:
        assert "score.weight" in f.keys() and "lm_head.weight" not in f.keys()
    assert check_model_dir(export).ok and check_adapter_dir(adapter).ok  # keys, shapes; adapter + base == merged

    held_out = _held_out(reward_model_run)
    sequences = [r["chosen_ids"] for r in held_out] + [r["rejected_ids"] for r in held_out]
    run_scores = torch.tensor([r["chosen"] for r in held_out] + [r["rejected"] for r in held_out])
    merged = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32).eval()
    assert merged.config.num_labels == 1
    base = AutoModelForSequenceClassification.from_pretrained(assets.tiny_qwen3_dir, num_labels=1, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    bound = _bound(merged, run_scores)
    assert (_scores(merged, sequences) - run_scores).abs().max() <= bound
    assert (_scores(with_adapter, sequences) - run_scores).abs().max() <= bound
    assert len({tuple(r["chosen_ids"]) for r in held_out}) == len(held_out) >= 8  # distinct held-out pairs
    assert all(r["chosen"] > r["rejected"] for r in held_out)


@pytest.mark.numerics
def test_the_export_as_a_grpo_reward_mixes_with_a_python_reward_by_weight(reward_model_run, assets):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from qwen3_neuron.rewards.calls import load_rewards
    from qwen3_neuron.trainers.grpo_loss import total_rewards

    export = reward_model_run / "hf_export"
    rows = read_jsonl(assets.preference_validation_file)[:3]
    prompts = [row["prompt"] for row in rows] * 2
    completions = [row["chosen"] for row in rows] + [row["rejected"] for row in rows]  # as GRPO hands them
    completion_ids = [[7] * (4 + i) for i in range(6)]
    rewards = load_rewards([str(export), "qwen3_neuron.rewards.length_penalty"], [1.0, 0.5])
    scores = rewards.score(prompts, completions, completion_ids, {})

    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32).eval()
    rendered = [tokenizer.apply_chat_template(p + c, tokenize=True, return_dict=True)["input_ids"]
                for p, c in zip(prompts, completions)]  # fmt: skip
    expected = _scores(model, rendered)
    assert (scores[:, 0] - expected).abs().max() <= _bound(model, expected)
    assert scores[:, 1].tolist() == pytest.approx([-len(ids) / 1000 for ids in completion_ids])
    assert total_rewards(scores, torch.tensor(rewards.weights)).tolist() == pytest.approx(
        (scores[:, 0] + 0.5 * scores[:, 1]).tolist())
    assert (scores[:3, 0] > scores[3:, 0]).all()  # the reward model prefers the chosen replies it learned
    assert not any(p.requires_grad for p in rewards.functions[0]._model.parameters())
    assert not rewards.functions[0]._model.training


def test_an_untied_lm_head_is_left_out_of_the_export_and_the_head_joins_the_last_file(tmp_path):
    from safetensors.torch import load_file, save_file

    from qwen3_neuron.hf_io.reward_model_export import write_scored_weights

    save, out = tmp_path / "step-8", tmp_path / "export"
    save.mkdir(), out.mkdir()
    save_file({"model.embed_tokens.weight": torch.ones(4, 2)}, str(save / "model-00001-of-00002.safetensors"))
    save_file({"model.norm.weight": torch.ones(2), "lm_head.weight": torch.ones(4, 2)},
              str(save / "model-00002-of-00002.safetensors"))  # fmt: skip
    save_file({"score.weight": torch.full((1, 2), 0.5)}, str(tmp_path / "score.safetensors"))
    write_scored_weights(save, tmp_path / "score.safetensors", out, "bfloat16")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                   "model.norm.weight": "model-00002-of-00002.safetensors",
                                   "score.weight": "model-00002-of-00002.safetensors"}  # fmt: skip
    head = load_file(out / "model-00002-of-00002.safetensors")["score.weight"]
    assert head.dtype == torch.bfloat16 and head.tolist() == [[0.5, 0.5]]
    assert index["metadata"]["total_size"] == 4 * 2 * 4 + 2 * 4 + 2 * 2


def test_the_plan_counts_a_reward_model_and_refuses_one_that_is_not(reward_model_run, assets, tmp_path):
    from qwen3_neuron.job.checks.memory import GIB

    export = reward_model_run / "hf_export"

    def plan(*rewards):
        listed = ",".join(map(str, rewards))
        job = compose_job("experiment=cpu_qwen3_tiny_grpo", f"grpo.rewards=[{listed}]")
        return plan_of(job, tmp_path / f"run{len(list(tmp_path.iterdir()))}")

    with_model = plan(export, "examples.my_rewards.digit_share")
    assert with_model.memory.reward_models_gib * GIB == (export / "model.safetensors").stat().st_size - _header(export)
    assert "reward models" in with_model.memory.line()
    with pytest.raises(ConfigError, match=r"grpo.rewards\[0\]: .*tiny_qwen3 is no sequence-classification model"):
        plan(assets.tiny_qwen3_dir)
    other = tmp_path / "other_tokenizer"
    shutil.copytree(export, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["added_tokens"][-1]["content"] = "<|another_token|>"  # one special token in place of another
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match=r"grpo.rewards\[0\]: .*other_tokenizer's tokenizer differs from the policy"):
        plan(other)


def _header(model_dir) -> int:
    """The safetensors file's header bytes (8-byte length, then the JSON)."""
    with open(model_dir / "model.safetensors", "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


# ---- the head on either backend, and the settings --------------------------------------------------


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_the_score_head_is_converted_into_either_model_before_it_is_built(assets, tmp_path, backend):
    """On the meta device, as the trainer builds it before parallelising: `score` is a child FSDP
    walks (the Transformers backend lists its children by hand), it trains beside LoRA's adapters,
    the HF keys of the causal LM leave it out, and the forward returns a score per position."""
    from qwen3_neuron.finetune.checkpoint import is_trained_key
    from qwen3_neuron.job.checks.memory import meta_model
    from qwen3_neuron.job.trainer_config import build_trainer_config

    model = ("model=hf", f"model.hf_model={assets.tiny_qwen3_dir}") if backend == "hf" else ()
    job = compose_job(*model, "data=preference", "trainer=reward_model", "finetune=lora", "device=cpu",
                      "checkpointing=[from_hf,export_hf]", f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}")
    config = build_trainer_config(job.settled(), tmp_path)
    built = meta_model(config)
    assert "score" in dict(built.named_children())
    trainable = sorted(name for name, p in built.named_parameters() if p.requires_grad and ".lora_" not in name)
    assert trainable == ["score.weight"] and all(map(is_trained_key, trainable))  # kept in LoRA's checkpoints
    spec = config.model_spec
    hf_keys = spec.state_dict_adapter(spec.model, config.hf_assets_path).to_hf(
        {name: p for name, p in built.named_parameters() if ".lora_" not in name})
    assert not [key for key in hf_keys if "score" in key] and len(hf_keys) > 0
    if backend == "hf":  # packed sequences scored alone: the backend's `full` flavour's mask made block-causal
        assert spec.model.attn_mask_type == "block_causal"


def test_the_native_scored_models_forward_is_the_head_on_the_last_hidden_states(tmp_path):
    from qwen3_neuron.models.flavors import native_model_spec
    from qwen3_neuron.models.logprobs import hidden_states_out
    from qwen3_neuron.models.score_head import with_score_head

    torch.manual_seed(0)
    model = with_score_head(native_model_spec("tiny")).model.build()
    model.init_states()
    tokens, positions = torch.randint(0, 100, (2, 12)), torch.arange(12).repeat(2, 1)
    masks = model.get_attention_masks(positions)
    with torch.no_grad():
        with hidden_states_out(model):
            hidden = super(type(model), model).forward(tokens, positions, masks)  # Qwen3's own
        scores = model(tokens, positions, masks)
    assert scores.shape == (2, 12)
    assert torch.equal(scores, (hidden @ model.score.weight.T).squeeze(-1))
    assert model._skip_lm_head is False  # put back as it was


@pytest.mark.parametrize("overrides, error", [
    (("data=preference", "reward_model.center_rewards_coefficient=0.01"),
     "reward_model.center_rewards_coefficient is a setting of trainer=reward_model, and this run trains with "
     "trainer=dpo"),
    (("data=preference", "trainer=reward_model", "reward_model.center_rewards_coefficient=-1"),
     "reward_model.center_rewards_coefficient must be >= 0"),
    (("data=chat", "trainer=reward_model"), "trainer=reward_model trains on data=preference rows"),
])  # fmt: skip
def test_the_reward_model_section_is_refused_where_it_does_not_apply(assets, overrides, error):
    with pytest.raises(ConfigError, match=error):
        compose_job("device=cpu", *overrides).settled()
