"""Rows as data sets ship them, and every row accounted for: in-process, through the data package.

JSON rows whose keys differ from row to row are read as the objects the file holds; a malformed
one, and every row dropped, truncated or skipped, is named by its file and 1-based line, with
why, in the counts the end-of-run lines show (all ranks merged); data.max_dropped stops a run
that would train on too few of its rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data import CONVERSATION, datasets_cache_in_tmp, tokenizer, write_jsonl  # noqa: F401 (fixtures)

from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.data.row_loading import first_rows
from qwen3_neuron.errors import ConfigError, DataError
from qwen3_neuron.report.summary import summary_lines
from qwen3_neuron.run_dir import read_data_stats, write_data_stats

TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}  # fmt: skip
CALL = {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}
# the first row carries what the others do not (tools, reasoning, a name, a column of its own)
SHIPPED = [
    {"messages": [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "content": "12:00"},
                  {"role": "assistant", "content": "Noon.", "reasoning_content": "The tool said 12:00."}],
     "tools": [TOOL], "id": 7},
    {"messages": CONVERSATION},
    {"messages": [{"role": "user", "content": "Hi.", "name": "ann"}, {"role": "assistant", "content": "Hello."}],
     "source": "forum"},
]  # fmt: skip


def chat(path: Path, **keys) -> DataSource:
    """A chat source as a launch reads it: data.max_dropped is conf/config.yaml's 0.1 unless given."""
    return DataSource(files=str(path), format="chat", **{"max_dropped": 0.1, **keys})


def test_rows_with_keys_others_lack_are_read_as_the_file_holds_them(tmp_path, tokenizer):
    """datasets' own JSON reader stops at such a file (KeyError: 'tools'), or pads every row with
    every key another row has; here each row is the object its line holds."""
    path = write_jsonl(tmp_path / "chats.jsonl", SHIPPED * 40)  # beyond the rows the plan reads
    placed = first_rows(chat(path), 4)
    assert placed == [(row, f"{path} line {i}") for i, row in enumerate([*SHIPPED, SHIPPED[0]], 1)]
    for streaming in (False, True):
        dataset = PackedDataset(chat(path), tokenizer, seq_len=512, infinite=False, streaming=streaming)
        samples = list(dataset)
        assert dataset.stats["rows"] == dataset.stats["documents"] == 120 and dataset.stats["skipped"] == 0
        text = tokenizer.decode([int(t) for s, _ in samples for t in s["input"]], skip_special_tokens=False)
        assert text.count('"name": "get_time", "description"') == 40  # the tools of the rows that have them


def test_a_json_array_file_is_read_item_by_item(tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(SHIPPED, indent=1))
    assert first_rows(chat(path), 8) == [(row, f"{path} item {i}") for i, row in enumerate(SHIPPED, 1)]


def test_malformed_json_is_named_by_its_file_and_line(tmp_path, tokenizer):
    good = json.dumps({"messages": CONVERSATION})
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join([good, "", *[good] * 5, good[:40], "[1, 2]", *[good] * 20]) + "\n")  # lines 8, 9
    placed = first_rows(chat(path), 64)  # the plan's first rows: a malformed one is its error, counted as skipped
    assert [str(row) for row, _ in placed[6:8]] == [
        f"{path} line 8: not JSON (Unterminated string starting at column 34): {good[:40]!r}",
        f"{path} line 9: a row must be a JSON object {{...}}, got list: '[1, 2]'",
    ]
    dataset = PackedDataset(chat(path), tokenizer, seq_len=512, infinite=False)  # past the first rows: skipped
    list(dataset)
    assert dataset.stats["rows"] == 28 and dataset.stats["skipped"] == 2 and dataset.stats["documents"] == 26
    assert dataset.data_stats()["examples"]["skipped"] == [
        f"{path} line 8: not JSON (Unterminated string starting at column 34): {good[:40]!r}",
        f"{path} line 9: a row must be a JSON object {{...}}, got list: '[1, 2]'",
    ]


LONG_PROMPT = {"messages": [{"role": "user", "content": "why " * 60}, {"role": "assistant", "content": "Because."}]}
LONG_REPLY = {"messages": [{"role": "user", "content": "Talk."}, {"role": "assistant", "content": "word " * 120}]}


def test_each_row_dropped_or_truncated_is_named_with_why(tmp_path, tokenizer):
    rows = [{"messages": CONVERSATION}, LONG_PROMPT, LONG_REPLY, *[{"messages": CONVERSATION}] * 10]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    dataset = PackedDataset(chat(path), tokenizer, seq_len=100, infinite=False)
    list(dataset)
    stats = dataset.data_stats()
    assert {k: stats[k] for k in ("rows", "documents", "truncated", "dropped", "skipped")} == {
        "rows": 13, "documents": 12, "truncated": 1, "dropped": 1, "skipped": 0}  # fmt: skip
    assert stats["examples"] == {
        "dropped": [f"{path} line 2: the prompt alone is 132 tokens (before its first assistant token), "
                    "training.seq_len 100: cut there, nothing of it would be trained"],
        "truncated": [f"{path} line 3: 151 tokens, cut to training.seq_len 100"],
    }  # fmt: skip


def test_data_max_dropped_stops_the_run_naming_the_first_row(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVERSATION}, LONG_PROMPT] * 3)
    with pytest.raises(DataError) as error:
        list(PackedDataset(chat(path, max_dropped=0.1), tokenizer, seq_len=100, infinite=False))
    assert str(error.value) == (
        f"{path}: 3 of the 6 rows rank 0 read are not trained (50.0 %, more than data.max_dropped=0.1); the first: "
        f"{path} line 2: the prompt alone is 132 tokens (before its first assistant token), training.seq_len 100: cut "
        "there, nothing of it would be trained. Raise training.seq_len, leave out those rows, or raise "
        "data.max_dropped (null: no limit)"
    )
    allowed = PackedDataset(chat(path, max_dropped=0.5), tokenizer, seq_len=100, infinite=False)
    list(allowed)
    assert allowed.stats["dropped"] == 3


def test_the_end_of_run_lines_account_for_every_row_of_every_rank(tmp_path):
    """Rank by rank counts and first rows, merged; above 1 % not trained is a warning."""
    def rank_stats(dropped: list[str], truncated: list[str]) -> dict:
        return {"rows": 100, "documents": 100 - len(dropped), "truncated": len(truncated), "dropped": len(dropped),
                "split": 0, "skipped": 0, "tokens": 1000, "label_tokens": 500, "padding_tokens": 10,
                "buffered_documents": 3, "examples": {"dropped": dropped, "truncated": truncated}}  # fmt: skip

    write_data_stats(tmp_path, 0, rank_stats(["a.jsonl line 2: why 2"], ["a.jsonl line 5: long"]))
    write_data_stats(tmp_path, 1, rank_stats(["a.jsonl line 3: why 3", "a.jsonl line 9: why 9"], []))
    merged = read_data_stats(tmp_path)
    assert merged["rows"] == 200 and merged["dropped"] == 3
    assert merged["examples"] == {"dropped": ["a.jsonl line 2: why 2", "a.jsonl line 3: why 3", "a.jsonl line 9: why 9"],
                                  "truncated": ["a.jsonl line 5: long"]}  # fmt: skip
    summary = {"status": "completed", "steps": 3, "wall_seconds": 1.0, "first_loss": None, "data_stats": merged,
               "packing_efficiency": merged["packing_efficiency"]}  # fmt: skip
    assert summary_lines(summary)[1:] == [
        "data: 200 rows read: 197 kept (1 of them truncated), 3 dropped, 0 skipped; packing efficiency 0.9900 "
        "(the share of tokens that is not padding); 6 documents read but not trained on (still buffered)",
        "data: warning: 1.5 % of the rows read are not trained (above 1 %); data.max_dropped sets the share "
        "that stops a run",
        "  dropped 3 (too long for training.seq_len or nothing left to train):",
        "    a.jsonl line 2: why 2",
        "    a.jsonl line 3: why 3",
        "    a.jsonl line 9: why 9",
        "  truncated 1 (kept, cut to training.seq_len):",
        "    a.jsonl line 5: long",
    ]


def test_the_end_of_run_list_of_a_fate_says_how_many_more_it_leaves_unnamed():
    """Five rows named of nine counted: four more. Fewer named than shown is every row of that
    fate (each rank keeps its first five), though rows read on each pass count each time."""
    from qwen3_neuron.report.summary import data_lines

    named = [f"a.jsonl line {line}: no assistant turn" for line in range(1, 8)]
    stats = {"rows": 1000, "skipped": 9, "examples": {"skipped": named}}
    assert data_lines(stats)[1:] == [
        "  skipped 9 (cannot be read as the data kind's row):", *[f"    {row}" for row in named[:5]], "    and 4 more"]
    once = {"rows": 300, "pass_rows": 100, "skipped": 3, "examples": {"skipped": named[:1]}}
    assert data_lines(once)[2:] == ["  skipped 3 (cannot be read as the data kind's row):", f"    {named[0]}"]


def test_the_plan_says_what_the_first_rows_lose_at_this_seq_len(tmp_path, assets):
    from conftest import compose_job, plan_of


    rows = [{"messages": CONVERSATION}, LONG_PROMPT, LONG_REPLY, {"messages": CONVERSATION}]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    said = []
    plan_of(compose_job("data=chat", f"data.files={path}", "data.val_files=null", "training.seq_len=100",
                          "data.max_dropped=0.5"), tmp_path / "run", warn=said.append)  # fmt: skip
    assert [line for line in said if " data: of " in line] == [
        f"[qwen3-neuron] data: of the 4 rows of {path} at training.seq_len 100, 1 would be truncated, 1 dropped "
        f"and 0 skipped (e.g. {path} line 2: the prompt alone is 132 tokens (before its first assistant token), "
        f"training.seq_len 100: cut there, nothing of it would be trained; {path} line 3: 151 tokens, cut to "
        "training.seq_len 100); the run counts them as it goes, against data.max_dropped=0.5"
    ]


NO_ASSISTANT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]}


def test_one_bad_row_among_the_first_rows_is_skipped_and_counted_by_the_plan_and_the_workers(
    tmp_path, assets, tokenizer
):
    """One row policy: a row the workers would skip (line 10: no assistant turn) is skipped by the
    plan too, counted with why, within data.max_dropped's default share."""
    from conftest import compose_job, plan_of

    rows = [{"messages": CONVERSATION}] * 300
    rows[9] = NO_ASSISTANT
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    said = []
    plan_of(compose_job("data=chat", f"data.files={path}", "data.val_files=null"), tmp_path / "run", warn=said.append)
    why = "no assistant turn: nothing to train on (roles: system, user)"
    assert [line for line in said if " data: of " in line] == [
        f"[qwen3-neuron] data: of the first 64 rows of {path} at training.seq_len 256, 0 would be truncated, 0 "
        f"dropped and 1 skipped (e.g. {path} line 10: {why}); the run counts them as it goes, against "
        "data.max_dropped=0.1"
    ]
    dataset = PackedDataset(chat(path), tokenizer, seq_len=512, infinite=False)
    list(dataset)
    stats = dataset.data_stats()
    assert (stats["rows"], stats["skipped"], stats["documents"]) == (300, 1, 299)
    assert stats["examples"] == {"skipped": [f"{path} line 10: {why}"]}


def test_first_rows_over_data_max_dropped_are_refused_with_the_count_and_the_first_of_them(tmp_path, assets):
    """A third of the first rows unreadable (malformed JSON and rows without an assistant turn):
    refused, counted, the first three named; data.max_dropped=null lets such a file train."""
    from conftest import compose_job, plan_of

    good, lines = json.dumps({"messages": CONVERSATION}), []
    for number in range(1, 301):
        lines.append(good[:30] if number % 6 == 3 else json.dumps(NO_ASSISTANT) if number % 6 == 0 else good)
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    overrides = ("data=chat", f"data.files={path}", "data.val_files=null")
    with pytest.raises(ConfigError) as error:
        plan_of(compose_job(*overrides), tmp_path / "run")
    assert str(error.value) == (
        f"21 of the first 64 rows of {path} would not be trained (33 %, more than data.max_dropped=0.1): 0 dropped "
        "(too long for training.seq_len=256), 21 skipped (cannot be read as rows of data.kind=chat); the first: "
        f"{path} line 3: not JSON (Unterminated string starting at column 24): {good[:30]!r}; {path} line 6: no "
        f"assistant turn: nothing to train on (roles: system, user); {path} line 9: not JSON (Unterminated string "
        f"starting at column 24): {good[:30]!r}. Fix or leave out those rows or raise data.max_dropped (null: no "
        "limit)"
    )
    plan_of(compose_job(*overrides, "data.max_dropped=null"), tmp_path / "run2", warn=lambda _: None)


def test_validation_rows_are_held_to_data_max_dropped_by_the_plan_and_the_workers_alike(tmp_path, assets, tokenizer):
    """The README's line (data=chat data.val_fraction=0.05) on 100 rows whose 20th, 40th and 60th
    have no assistant turn: 3 of the 5 validation rows, 0 of the 95 training rows. The plan
    refuses it as the validation loader would stop, both naming validation rows and advising what
    fits a skipped row; at data.max_dropped=0.6 (3 of 5 exactly) both let it run."""
    from conftest import compose_job, plan_of

    rows = [{"messages": CONVERSATION}] * 100
    rows[19] = rows[39] = rows[59] = NO_ASSISTANT
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    why = "no assistant turn: nothing to train on (roles: system, user)"
    overrides = ("data=chat", f"data.files={path}", "data.val_fraction=0.05")
    with pytest.raises(ConfigError) as refused:
        plan_of(compose_job(*overrides), tmp_path / "run", warn=lambda _: None)
    assert str(refused.value) == (
        f"3 of the 5 validation rows of {path} (data.val_fraction=0.05) would not be validated on (60 %, more than "
        "data.max_dropped=0.1): 0 dropped (too long for training.seq_len=256), 3 skipped (cannot be read as rows of "
        f"data.kind=chat); the first: {path} line 20: {why}; {path} line 40: {why}; {path} line 60: {why}. Fix or "
        "leave out those rows or raise data.max_dropped (null: no limit)"
    )
    validation = PackedDataset(chat(path, val_fraction=0.05), tokenizer, seq_len=256, role="validation", infinite=False)
    with pytest.raises(DataError) as stopped:
        list(validation)
    assert str(stopped.value) == (
        f"{path}: 3 of the 5 validation rows rank 0 read (data.val_fraction=0.05) are not validated on (60.0 %, more "
        f"than data.max_dropped=0.1); the first: {path} line 20: {why}. Fix or leave out those rows or raise "
        "data.max_dropped (null: no limit)"
    )
    plan_of(compose_job(*overrides, "data.max_dropped=0.6"), tmp_path / "run2", warn=lambda _: None)
    at_the_limit = chat(path, val_fraction=0.05, max_dropped=0.6)
    assert len(list(PackedDataset(at_the_limit, tokenizer, seq_len=256, role="validation", infinite=False))) == 1


def test_data_max_dropped_0_trains_a_clean_set_and_a_share_at_the_limit_passes_the_plan_and_the_workers(
    tmp_path, assets, tokenizer
):
    """data.max_dropped is the largest share allowed: 0 lets every clean row train, and 1 unreadable
    row in 10 at 0.1 passes both the plan and the workers; a second is refused by both."""
    from conftest import compose_job, plan_of

    clean = write_jsonl(tmp_path / "clean.jsonl", [{"messages": CONVERSATION}] * 10)
    plan_of(compose_job("data=chat", f"data.files={clean}", "data.val_files=null", "data.max_dropped=0"),
            tmp_path / "run", warn=lambda _: None)  # fmt: skip
    dataset = PackedDataset(chat(clean, max_dropped=0), tokenizer, seq_len=256, infinite=False)
    list(dataset)
    assert (dataset.stats["rows"], dataset.stats["documents"]) == (10, 10)
    rows = [{"messages": CONVERSATION}] * 10
    rows[3] = NO_ASSISTANT
    one_in_ten = write_jsonl(tmp_path / "one.jsonl", rows)
    plan_of(compose_job("data=chat", f"data.files={one_in_ten}", "data.val_files=null"), tmp_path / "run2",
            warn=lambda _: None)  # fmt: skip
    dataset = PackedDataset(chat(one_in_ten), tokenizer, seq_len=256, infinite=False)
    list(dataset)
    assert (dataset.stats["rows"], dataset.stats["skipped"]) == (10, 1)
    rows[7] = NO_ASSISTANT
    two_in_ten = write_jsonl(tmp_path / "two.jsonl", rows)
    with pytest.raises(ConfigError, match="2 of the 10 rows of .* would not be trained"):
        plan_of(compose_job("data=chat", f"data.files={two_in_ten}", "data.val_files=null"), tmp_path / "run3")
    with pytest.raises(DataError, match="2 of the 10 rows rank 0 read are not trained"):
        list(PackedDataset(chat(two_in_ten), tokenizer, seq_len=256, infinite=False))


def test_malformed_json_past_the_first_rows_counts_against_data_max_dropped(tmp_path, tokenizer):
    """A file of bad JSON stops the run: skipped rows are untrained rows, as dropped ones are."""
    good = json.dumps({"messages": CONVERSATION})
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join([good] * 4 + [good[:30]] * 4) + "\n")
    with pytest.raises(DataError) as error:
        list(PackedDataset(chat(path, max_dropped=0.1), tokenizer, seq_len=512, infinite=False))
    assert str(error.value) == (
        f"{path}: 4 of the 8 rows rank 0 read are not trained (50.0 %, more than data.max_dropped=0.1); the first: "
        f"{path} line 5: not JSON (Unterminated string starting at column 24): {good[:30]!r}. Fix or leave out "
        "those rows or raise data.max_dropped (null: no limit)"
    )


def test_a_long_streamed_pass_is_held_to_data_max_dropped_as_it_goes_not_only_at_its_end(
    tmp_path, tokenizer, monkeypatch
):
    """Checked every MAX_DROPPED_AFTER rows (here 100): 300 texts streamed, 20 of the first 100
    unreadable, none after. At the pass's end the share would be 6.7 %, within
    data.max_dropped=0.1; the check at row 100 (20 %) stops it."""
    from qwen3_neuron.data import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "MAX_DROPPED_AFTER", 100)
    rows = [{"text": f"line {i}"} if i % 5 else {"text": None} for i in range(100)]
    path = write_jsonl(tmp_path / "corpus.jsonl", rows + [{"text": f"line {i}"} for i in range(200)])
    source = DataSource(files=str(path), format="text", max_dropped=0.1)
    dataset = PackedDataset(source, tokenizer, seq_len=64, streaming=True, infinite=False)  # one pass
    with pytest.raises(DataError, match=r"^.*: 20 of the 100 rows rank 0 read are not trained \(20\.0 %"):
        list(dataset)
    assert dataset.stats["rows"] == 100


def test_show_data_reads_the_rows_once_and_never_packs_a_conversation_twice(tmp_path, assets, caplog):
    """A preview longer than a small file: one sample holding each conversation once, no re-loop."""
    from conftest import compose_job, plan_of

    from qwen3_neuron.data.preview import show_samples

    replies = [f"Reply number {i}." for i in range(3)]
    rows = [{"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": r}]} for r in replies]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    plan = plan_of(compose_job("data=chat", f"data.files={path}", "data.val_files=null", "run.show_data=3"),
                     tmp_path / "run")  # fmt: skip
    text = show_samples(plan.trainer_config, 3, dp_world_size=1)
    assert text.split("\n\n", 1)[1].startswith("=== sample 1 of rank 0: 3 document(s)") and "=== sample 2" not in text
    assert [text.count(reply) for reply in replies] == [1, 1, 1]
    assert text.endswith("=== rank 0's rows end after 1 sample(s) ===")
    assert "re-looped" not in caplog.text


def test_the_progress_line_warns_once_more_than_1_percent_of_rows_go_untrained(tmp_path):
    """Rank 0's share, as its metrics.jsonl records it (worker.metrics), read by the launcher."""
    import io

    from qwen3_neuron.launch.progress import Progress
    from qwen3_neuron.worker.metrics import JsonlLogger

    metrics = tmp_path / "metrics.jsonl"
    writer = JsonlLogger(str(metrics), world_size=1)
    progress = Progress(metrics, total_steps=3, stream=io.StringIO())
    writer.log({"loss_metrics/global_avg_loss": 7.0, "data/rows_not_trained": 0.01}, step=1)
    progress._poll()
    assert "rows not trained" not in progress.line()
    writer.log({"loss_metrics/global_avg_loss": 6.9, "data/rows_not_trained": 0.3314}, step=2)
    progress._poll()
    assert progress.line().startswith("[qwen3-neuron]  step 2/3  loss 6.9000  WARNING 33.1% rows not trained  ETA ")
    writer.close()


def test_a_skipped_parquet_row_is_named_by_its_row_in_the_file_on_every_rank(tmp_path, tokenizer):
    """A map-style source `datasets` reads itself: each rank reads a contiguous share, and a row it
    cannot read is named by the file's 1-based row, not by its place in that rank's share; the row
    a reward function or the chat template gets has the file's columns only."""
    import datasets

    rows = [{"messages": CONVERSATION}] * 12
    rows[8] = {"messages": [{"role": "wizard", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]}
    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    source = chat(path, max_dropped=None)  # one row in six
    second_half = PackedDataset(source, tokenizer, seq_len=512, dp_rank=1, dp_world_size=2, infinite=False)
    list(second_half)
    assert second_half.stats["rows"] == 6 and second_half.stats["skipped"] == 1
    [skipped] = second_half.data_stats()["examples"]["skipped"]
    assert skipped.startswith(f"row 9 of {path}: ") and "wizard" in skipped
    row, where = second_half._read(next(iter(second_half._original_data)))
    assert (sorted(row), where) == (["messages"], f"row 7 of {path}")


@pytest.fixture(scope="module")
def prompts_plan(tmp_path_factory, assets):
    """The tiny GRPO experiment planned on 40 prompts of a file, a fifth of them held out, as
    docs/reinforcement-learning.md writes it (data.val_fraction; validator.* as data=prompts sets
    them): the plan, its file, and what it said."""
    from conftest import compose_job, plan_of

    folder = tmp_path_factory.mktemp("prompts")
    prompts = write_jsonl(folder / "prompts.jsonl", [{"prompt": [{"role": "user", "content": f"What is {i}?"}]}
                                                     for i in range(40)])  # fmt: skip
    said = []
    plan = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo", f"data.files={prompts}", "data.val_fraction=0.2"),
                   folder / "run", warn=said.append)  # fmt: skip
    return plan, prompts, said


def test_the_plan_says_when_the_data_goes_round_and_what_it_knows_when_it_cannot_tell(prompts_plan, tmp_path):
    """From the first rows only: all of a small file's training rows (the steps' prompts over the
    rows a data.val_fraction carve leaves), or, past the rows the plan reads, the rows the steps
    take. Held-out prompts plan with data=prompts' validator settings."""
    from conftest import compose_job, plan_of

    plan, prompts, said = prompts_plan  # 12 steps x 2 ranks x (8 completions / 4 a prompt), over 40 - 8 prompts
    assert plan.trainer_config.validator.enable and plan.trainer_config.validator.steps == 2
    assert [line for line in said if " data: " in line] == [
        f"[qwen3-neuron] data: the data goes round: the run's steps take 48 prompts, and the 32 training rows of "
        f"{prompts} make about 32: about 1.50 passes over them (each pass reshuffled)"
    ]
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVERSATION}] * 65)  # one row past the first rows
    said = []
    plan_of(compose_job("data=chat", f"data.files={chats}", "data.val_files=null", "training.steps=10"),
            tmp_path / "run2", warn=said.append)  # fmt: skip
    assert [line for line in said if " data: " in line] == [
        f"[qwen3-neuron] data: the run's steps take 80 samples, about 233 rows at the first 64 rows' 2.91 rows a "
        f"sample; the plan reads the first rows only, so whether {chats} goes round is said at the end of the run"
    ]


def test_show_data_of_prompts_shows_each_prompt_and_the_padding_its_completions_fill(prompts_plan):
    from qwen3_neuron.data.preview import show_samples

    plan, _, _ = prompts_plan
    assert show_samples(plan.trainer_config, 1, dp_world_size=1) == (
        "=== sample 1 of rank 0: 1 document(s), 0 of 64 tokens with a loss, 47 padding; ⟦no loss⟧ ===\n"
        "──── document 1 (tokens 0-16) ────\n"
        "⟦<|im_start|>user\nWhat is 0?<|im_end|>\n<|im_start|>assistant\n⟧\n"
        "⟦pad ×47⟧"
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_the_end_of_a_run_says_the_data_went_round_and_how_often(tmp_path, tokenizer, streaming):
    """A rank that read its rows again: its share's size and the passes, in the end-of-run lines,
    whether or not it was resumed half-way through a pass."""
    from qwen3_neuron.report.summary import data_lines

    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVERSATION}] * 8)
    dataset = PackedDataset(chat(path, packing="none"), tokenizer, seq_len=64, streaming=streaming)
    samples = iter(dataset)
    for _ in range(10):  # a sample a row
        next(samples)
    stats = dataset.data_stats()
    assert (stats["rows"], stats["pass_rows"]) == (10, 8)
    assert data_lines(stats)[1] == "data: went round: 8 rows, 1.25 passes over them (each pass reshuffled)"
    # the same rows, saved after 5 and resumed: the first pass, read on from its 6th row, is whole too
    saved = PackedDataset(chat(path, packing="none"), tokenizer, seq_len=64, streaming=streaming)
    samples = iter(saved)
    for _ in range(5):
        next(samples)
    resumed = PackedDataset(chat(path, packing="none"), tokenizer, seq_len=64, streaming=streaming)
    resumed.load_state_dict(saved.state_dict())
    samples = iter(resumed)
    for _ in range(5):
        next(samples)
    assert data_lines(resumed.data_stats())[1:2] == data_lines(stats)[1:2]
    once = PackedDataset(chat(path, packing="none"), tokenizer, seq_len=64, streaming=streaming, infinite=False)
    list(once)
    assert not [line for line in data_lines(once.data_stats()) if "went round" in line]
