"""data=chat and data=text train on 2 CPU ranks: one launch each, shared by every assertion here.

- chat: the tiny multi-turn conversations (many longer than the 128-token sequences: truncated
  and counted), validation on the held-out file, validated at steps 1, 3 and 6. (Its resume is
  tests/test_lora.py's: LoRA on the same conversations.)
- text: a .txt file of paragraphs, streamed, a tenth carved out for validation, long documents
  split across samples, a checkpoint every 2 steps: resumed from step 2, it ends as it did.
- mix: one source in each other file form (.json, .csv, .parquet, .arrow, a save_to_disk dir) and a
  data set in the hub cache, map-style, killed and resumed: its own launch pair.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from unittest.mock import ANY

import pytest
from conftest import REPO, TINY, launch, read_jsonl
from test_data import write_jsonl, write_texts
from test_resume import as_of_checkpoint, kill_9_after_checkpoint

from qwen3_neuron.assets.build import stdlib_docstrings
from qwen3_neuron.run_dir import read_job, read_metrics

pytestmark = pytest.mark.integration

CHAT_STEPS, TEXT_STEPS = 6, 5
CHAT = ("data=chat", f"training.steps={CHAT_STEPS}", "validator.freq=3", "validator.steps=2")


def launched(run_dir: Path, *overrides: str, cwd: Path = REPO):
    result = launch(run_dir, *TINY, *overrides, timeout=900, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir, result


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory, assets):
    run_dir = tmp_path_factory.mktemp("chat") / "run"
    return launched(run_dir, *CHAT)


@pytest.fixture(scope="session")
def text_run(tmp_path_factory, assets):
    corpus = tmp_path_factory.mktemp("corpus") / "docstrings.txt"
    corpus.write_text("\n\n".join(stdlib_docstrings()[:400]))  # one row per paragraph
    run_dir = corpus.parent / "run"
    return launched(run_dir, *text_overrides(corpus.name), cwd=corpus.parent)  # data.files relative to there


def text_overrides(corpus: Path | str) -> tuple[str, ...]:
    return ("data=text", f"data.files={corpus}", "data.streaming=true", "data.val_fraction=0.1",
            f"training.steps={TEXT_STEPS}", "validator.freq=5", "validator.steps=2",
            "checkpointing=periodic", "checkpoint.interval=2")  # fmt: skip


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ---- chat ------------------------------------------------------------------------------------


def test_chat_run_trains_and_its_loss_falls(chat_run):
    summary = summary_of(chat_run[0])
    assert summary["status"] == "completed" and summary["steps"] == CHAT_STEPS
    assert summary["final_loss"] < summary["first_loss"] - 0.2
    # rank 0's share of rows dropped or skipped so far, for the progress line: none here
    assert [r["rows_not_trained"] for r in read_jsonl(chat_run[0] / "metrics.jsonl") if "loss" in r] == [0.0] * CHAT_STEPS


def test_chat_validation_loss_reaches_metrics_summary_and_progress_line(chat_run):
    run_dir, result = chat_run
    records = read_jsonl(run_dir / "metrics.jsonl")
    validations = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in validations] == [1, 3, CHAT_STEPS]  # step 1 and every validator.freq
    assert all(math.isfinite(r["val_loss"]) for r in validations)
    assert validations[-1]["val_loss"] < validations[0]["val_loss"]
    summary = summary_of(run_dir)
    assert summary["val_loss"] == validations[-1]["val_loss"] and summary["val_step"] == CHAT_STEPS
    assert summary["val_perplexity"] == pytest.approx(math.exp(summary["val_loss"]))
    assert f"val {summary['val_loss']:.4f}" in result.stdout  # the progress line


def test_chat_overlong_conversations_are_counted_in_log_and_summary(chat_run):
    run_dir, result = chat_run
    stats = summary_of(run_dir)["data_stats"]
    per_rank = [json.loads((run_dir / "data_stats" / f"rank_{r}.json").read_text()) for r in (0, 1)]
    counts = [name for name in per_rank[0] if name != "examples"]
    assert stats == {**{k: per_rank[0][k] + per_rank[1][k] for k in counts}, "packing_efficiency": ANY,
                     "examples": {"truncated": per_rank[0]["examples"]["truncated"] + per_rank[1]["examples"]["truncated"]}}
    assert stats["truncated"] > 0 and stats["dropped"] == 0 and stats["skipped"] == 0 and stats["split"] == 0
    assert stats["documents"] == stats["rows"] > 0
    # the first truncated rows of each rank, by their line of the bundled file, and the end-of-run lines
    assert re.fullmatch(r".*/train\.jsonl line \d+: \d+ tokens, cut to training\.seq_len 128", stats["examples"]["truncated"][0])
    assert (f"data: {stats['rows']:,} rows read: {stats['rows']:,} kept ({stats['truncated']:,} of them truncated), "
            "0 dropped, 0 skipped; packing efficiency ") in result.stdout
    assert f"[qwen3-neuron]     {stats['examples']['truncated'][0]}" in result.stdout
    # a share of the tokens packed (6 steps x 2 ranks x 2 rows x 128, + what is still buffered): prompts carry none
    assert 0 < stats["label_tokens"] < CHAT_STEPS * 2 * 2 * 128 + 2 * 128
    log = (run_dir / "train.log").read_text()
    assert re.search(r"train\.jsonl line \d+: truncated: \d+ tokens, cut to training\.seq_len 128", log)
    assert "[qwen3-neuron data] rank 0: rows" in log


def test_chat_run_packs_best_fit_and_reports_its_packing_efficiency(chat_run):
    """data=chat's default packing: best fit over 64 waiting conversations per rank. Every token
    trained is counted (6 steps x 2 ranks x 2 samples x 128), its padding and the conversations
    still waiting; packing_efficiency reaches summary.json and the end-of-run line."""
    run_dir, result = chat_run
    config = json.loads((run_dir / "trainer_config.json").read_text())
    [source] = config["dataloader"]["sources"]
    assert (source["packing"], source["pack_buffer"]) == ("best_fit", 64)
    summary = summary_of(run_dir)
    stats = summary["data_stats"]
    assert stats["tokens"] == CHAT_STEPS * 2 * 2 * 128
    assert summary["packing_efficiency"] == stats["packing_efficiency"] == 1 - stats["padding_tokens"] / stats["tokens"]
    assert summary["packing_efficiency"] > 0.95
    # each rank's buffer was full (64) before its last sample took 1 or 2 conversations of >= 52 tokens
    assert 2 * 62 <= stats["buffered_documents"] <= 2 * 63
    buffered = f"{stats['buffered_documents']:,} documents read but not trained on"
    assert f"; packing efficiency {summary['packing_efficiency']:.4f} (the share" in result.stdout and buffered in result.stdout


def test_chat_run_records_its_data_config_and_writes_only_in_the_run_dir(chat_run, assets):
    run_dir, _ = chat_run
    config = json.loads((run_dir / "trainer_config.json").read_text())
    [source] = config["dataloader"]["sources"]
    assert source["format"] == "chat" and source["files"] == str(assets.chat_train_file)
    assert config["validator"]["enable"] is True
    assert config["validator"]["dataloader"]["sources"][0]["files"] == str(assets.chat_validation_file)
    assert config["dataloader"]["cache_dir"] == str(run_dir / "data_cache")
    assert (run_dir / "data_cache").is_dir()


# ---- text ------------------------------------------------------------------------------------


def test_text_run_from_a_txt_file_streams_splits_and_validates(text_run):
    run_dir, _ = text_run
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == TEXT_STEPS
    assert summary["final_loss"] < summary["first_loss"]
    assert math.isfinite(summary["val_loss"]) and summary["val_step"] == TEXT_STEPS
    stats = summary["data_stats"]
    assert stats["split"] > 0 and stats["truncated"] == stats["dropped"] == 0  # data.overlong=split
    assert stats["padding_tokens"] == 0  # documents flow on: no padding
    config = json.loads((run_dir / "trainer_config.json").read_text())
    assert config["dataloader"]["streaming"] is True
    assert not (run_dir / "data_cache").exists() or not any((run_dir / "data_cache").rglob("*.arrow"))  # streamed


def test_streamed_text_run_resumed_from_step_2_continues_with_the_same_losses(text_run, tmp_path):
    """Streaming: the position is datasets' own stream state (shard and row), checkpointed. The run's
    dir as it stood after its step-2 checkpoint, resumed from another directory than the one its
    relative data.files was typed in: steps 3-5 and the step-5 validation are the uninterrupted run's."""
    reference_dir = text_run[0]
    corpus = reference_dir.parent / "docstrings.txt"
    assert read_job(reference_dir)["data"]["files"] == str(corpus)  # recorded as the first launch found it
    run_dir = as_of_checkpoint(reference_dir, tmp_path / "run", step=2)
    result = launch(None, f"run.resume={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"Loading the checkpoint from \S*step-2\b", (run_dir / "train.log").read_text())
    resumed, reference = _losses(run_dir), _losses(reference_dir)
    assert sorted(resumed) == list(range(1, TEXT_STEPS + 1))
    after = range(3, TEXT_STEPS + 1)
    assert [resumed[s] for s in after] == [reference[s] for s in after]
    assert summary_of(run_dir)["val_loss"] == summary_of(reference_dir)["val_loss"]


# ---- mix: every other file form, and the hub cache -------------------------------------------------

MIX_FORMS = ("json", "csv", "parquet", "arrow", "save_to_disk")


def _write_sources(folder: Path, texts: list[str]) -> list[str]:
    """The texts split over one source per form of MIX_FORMS and a hub-cache data set, written as
    `datasets` writes them (as `hf download ... --repo-type dataset` leaves the last one)."""
    parts = [texts[i :: len(MIX_FORMS) + 1] for i in range(len(MIX_FORMS) + 1)]
    sources = [f"{{files:'{write_texts(folder, form, part)}',weight:1}}" for form, part in zip(MIX_FORMS, parts)]
    repo = folder / "hub" / "datasets--acme--docstrings"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    write_jsonl(repo / "snapshots" / "abc123" / "train.jsonl", [{"text": t} for t in parts[-1]])
    return [*sources, "{hf_dataset:acme/docstrings,weight:1}"]


def test_a_mix_of_every_file_form_and_a_hub_data_set_trains_and_resumes_after_kill_9(tmp_path, monkeypatch, assets):
    """2 ranks read each form (map-style, a tenth of every source carved out for validation);
    kill -9 after the step-3 checkpoint, run.resume: the steps the killed run logged after its
    checkpoint, and the step-4 validation, come out the same from the resumed one."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the launcher's and the workers' hub cache
    sources = _write_sources(tmp_path, stdlib_docstrings()[:600])
    run_dir = tmp_path / "run"
    overrides = [*TINY, "data=mix", f"data.sources=[{','.join(sources)}]", "data.overlong=split",
                 "data.val_fraction=0.1", "training.steps=12", "validator.freq=4", "validator.steps=2",
                 "checkpointing=periodic", "checkpoint.interval=3"]  # fmt: skip
    kill_9_after_checkpoint(run_dir, overrides, checkpoint_step=3, steps_logged=5)
    before_kill = {r["step"]: r for r in read_metrics(run_dir) if "loss" in r}
    for later in (6, 9):  # resume from step 3 whatever the kill's timing
        shutil.rmtree(run_dir / "checkpoint" / f"step-{later}", ignore_errors=True)

    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"Loading the checkpoint from \S*step-3\b", (run_dir / "train.log").read_text())
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert math.isfinite(summary["val_loss"]) and summary["val_step"] == 12
    after = {r["step"]: r for r in read_metrics(run_dir) if "loss" in r}
    replayed = [step for step in sorted(before_kill) if step > 3]  # at least 4 and 5
    assert [after[s]["loss"] for s in replayed] == [before_kill[s]["loss"] for s in replayed]
    assert after[4]["val_loss"] == before_kill[4]["val_loss"]
    stats = summary["data_stats"]
    assert stats["documents"] > 0 and stats["split"] > 0  # the docstrings run over 128-token samples


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


# ---- multi-turn rows, one opening; a bad row among the first trained around ------------------

REPLY = "Forty two."
SUBJECTS = ("the moon", "heaps", "rivers", "bread", "glass", "wind", "copper", "owls", "tides", "maps", "snow", "bees")


def test_multi_turn_rows_teach_one_opening_and_a_bad_first_row_is_trained_around(tmp_path, assets):
    """100 two-turn rows answered with one constant reply, line 10 without an assistant turn. The
    launch trains around that row (skipped and counted with why, as the plan's first rows said),
    says its 100 rows went round, and its export, through transformers' generate with the chat
    template, answers held-out single-turn questions with the opening data.thinking=empty_block
    (the default) promises: Qwen3's empty <think> block, then the reply."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def turns(a, b):
        return [{"role": "user", "content": f"Tell me about {a}."}, {"role": "assistant", "content": REPLY},
                {"role": "user", "content": f"And {b}?"}, {"role": "assistant", "content": REPLY}]  # fmt: skip

    rows = [{"messages": turns(SUBJECTS[i % 12], SUBJECTS[(5 * i + 3) % 12])} for i in range(100)]
    rows[9] = {"messages": [{"role": "user", "content": "Hello?"}]}
    path = write_jsonl(tmp_path / "two_turns.jsonl", rows)
    run_dir, result = launched(tmp_path / "run", "data=chat", f"data.files={path}", "data.val_files=null",
                               "training.steps=30", "optimizer.lr=3e-3", "checkpointing=export_hf")  # fmt: skip
    why, export = f"{path} line 10: no assistant turn: nothing to train on (roles: user)", run_dir / "hf_export"
    assert f"0 dropped and 1 skipped (e.g. {why})" in result.stderr  # the plan's first rows
    console = result.stdout.splitlines()
    went_round = [line for line in console if re.match(r"\[qwen3-neuron\] data: went round: 100 rows, \d\.\d\d ", line)]
    assert went_round, [line for line in console if " data: " in line]
    # each pass reads the bad row again (counted), and it is named once
    [skipped] = [i for i, line in enumerate(console) if re.match(r"\[qwen3-neuron\]   skipped \d+ \(cannot ", line)]
    assert console[skipped + 1:][:2] == [f"[qwen3-neuron]     {why}", f"[qwen3-neuron] HF export: {export}"]
    tokenizer, model = AutoTokenizer.from_pretrained(export), AutoModelForCausalLM.from_pretrained(export)
    for question in ("What is a sunset?", "Explain gravity.", "Who builds bridges?", "Name a colour."):
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)  # fmt: skip
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        reply = tokenizer.decode(output, skip_special_tokens=False)
        assert reply == f"<think>\n\n</think>\n\n{REPLY}<|im_end|>", question
