"""data=text|chat|mix without processes: which tokens carry a loss, positions of packed samples,
each file form read in-process, rank shards, the validation carve, resume of the data position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.data.chat_rows import ChatRenderer, Conversation, row_conversation
from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.packing import Packer, document
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.data.row_loading import read_row
from qwen3_neuron.run_dir import read_data_stats, write_data_stats

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Sum 2+2?"},
    {"role": "assistant", "content": "It is 4."},
]


@pytest.fixture(scope="module")
def tokenizer(assets):
    return HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))


@pytest.fixture(autouse=True)
def datasets_cache_in_tmp(tmp_path, monkeypatch):
    """Map-style loads write an Arrow cache: keep it out of the user's HF cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))


def spans_of(tokenizer, ids, flags) -> list[str]:
    """The text of each run of consecutive tokens whose flag is set, special tokens included."""
    spans, current = [], []
    for token, flag in zip(ids, flags):
        if flag:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current, skip_special_tokens=False))
            current = []
    if current:
        spans.append(tokenizer.decode(current, skip_special_tokens=False))
    return spans


# ---- masking ---------------------------------------------------------------------------------


def test_multi_turn_labels_are_exactly_each_assistant_turn_and_its_end_token(tokenizer):
    ids, trained = ChatRenderer(tokenizer).tokens(Conversation(CONVERSATION))
    # Qwen3's template gives the last turn (after the last user query) an empty <think> block, the
    # earlier one none; data.thinking=empty_block opens every turn with it, trained with the turn
    assert spans_of(tokenizer, ids, trained) == ["<think>\n\n</think>\n\nHello!<|im_end|>",
                                                 "<think>\n\n</think>\n\nIt is 4.<|im_end|>"]  # fmt: skip
    as_rendered = ChatRenderer(tokenizer, thinking="as_rendered").tokens(Conversation(CONVERSATION))
    assert spans_of(tokenizer, *as_rendered) == ["Hello!<|im_end|>", "<think>\n\n</think>\n\nIt is 4.<|im_end|>"]
    untrained = spans_of(tokenizer, ids, [not t for t in trained])
    assert untrained[0] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    im_end = tokenizer.token_to_id("<|im_end|>")
    assert [t for t, flag in zip(ids, trained) if flag].count(im_end) == 2  # of 5 turn ends: the assistants'
    assert ids.count(im_end) == 5
    # as labels: each label is the next token, ignored exactly where that token is not trained
    inputs, labels = document(ids, trained)
    assert inputs == ids[:-1]
    assert labels == [t if flag else IGNORE_INDEX for t, flag in zip(ids[1:], trained[1:])]
    kept = [label for label in labels if label != IGNORE_INDEX]
    assert tokenizer.decode(kept, skip_special_tokens=False) == ("<think>\n\n</think>\n\nHello!<|im_end|><think>\n\n"
                                                                 "</think>\n\nIt is 4.<|im_end|>")  # fmt: skip


def test_prompt_response_row_trains_on_the_response_and_its_end_token(tokenizer):
    row = {"instruction": "Name a prime.", "output": "Seven."}
    conversation = row_conversation(row, DataSource(format="chat", prompt_field="instruction", response_field="output"))
    assert conversation.messages == [{"role": "user", "content": "Name a prime."},
                                     {"role": "assistant", "content": "Seven."}]  # fmt: skip
    ids, trained = ChatRenderer(tokenizer).tokens(conversation)
    assert spans_of(tokenizer, ids, trained) == ["<think>\n\n</think>\n\nSeven.<|im_end|>"]


def test_train_on_prompt_trains_every_token(tokenizer):
    as_rendered = ChatRenderer(tokenizer, train_on_prompt=True, thinking="as_rendered")
    ids, trained = as_rendered.tokens(Conversation(CONVERSATION))
    assert all(trained)
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.apply_chat_template(CONVERSATION)
    ids, trained = ChatRenderer(tokenizer, train_on_prompt=True).tokens(Conversation(CONVERSATION))
    assert all(trained) and tokenizer.decode(ids, skip_special_tokens=False).count("<think>\n\n</think>\n\n") == 2


# ---- packing ---------------------------------------------------------------------------------


def test_greedy_packing_keeps_documents_whole_with_positions_per_document():
    packer = Packer(seq_len=8, pad_id=99, packing="greedy")
    assert packer.add([1, 2, 3], [2, 3, 4]) == []
    assert packer.add([5, 6, 7, 8], [6, 7, 8, 9]) == []
    [(inputs, labels, positions, padding)] = packer.add([10, 11, 12, 13, 14], [11, 12, 13, 14, 15])  # does not fit
    assert inputs == [1, 2, 3, 5, 6, 7, 8, 99]
    assert labels == [2, 3, 4, 6, 7, 8, 9, IGNORE_INDEX]
    assert positions == [0, 1, 2, 0, 1, 2, 3, 0]  # the padding is a document of its own
    assert padding == 1
    [(inputs, _, positions, padding)] = packer.flush()
    assert inputs == [10, 11, 12, 13, 14, 99, 99, 99]
    assert positions == [0, 1, 2, 3, 4, 0, 1, 2] and padding == 3


def test_best_fit_fills_each_sample_from_the_buffer_longest_first_and_the_rest_waits():
    packer = Packer(seq_len=8, pad_id=99, packing="best_fit", buffer_size=3)
    doc = {n: (list(range(10 * n, 10 * n + n)), list(range(10 * n + 1, 10 * n + n + 1))) for n in (2, 3, 4, 5, 6)}
    assert packer.add(*doc[5]) == [] and packer.add(*doc[4]) == []
    [(inputs, labels, positions, padding)] = packer.add(*doc[2])  # the buffer is full: 5, then 2 (4 does not fit)
    assert inputs == [50, 51, 52, 53, 54, 20, 21, 99]
    assert labels == [51, 52, 53, 54, 55, 21, 22, IGNORE_INDEX]
    assert positions == [0, 1, 2, 3, 4, 0, 1, 0] and padding == 1
    assert packer.waiting_documents() == 1  # the 4 waits for a later sample
    assert packer.add(*doc[3]) == []
    [(inputs, _, positions, padding)] = packer.add(*doc[6])  # 6, then 4 and 3 do not fit
    assert inputs == [60, 61, 62, 63, 64, 65, 99, 99] and padding == 2
    [(inputs, _, positions, padding)] = packer.flush()  # 4 + 3 (the end of the data: the rest, padded)
    assert inputs == [40, 41, 42, 43, 30, 31, 32, 99]
    assert positions == [0, 1, 2, 3, 0, 1, 2, 0] and padding == 1
    assert packer.flush() == [] and packer.waiting_documents() == 0


@pytest.mark.parametrize("packing", ["best_fit", "none"])
def test_a_document_longer_than_a_sample_is_refused_not_left_waiting(packing):
    packer = Packer(seq_len=4, pad_id=0, packing=packing)
    with pytest.raises(ValueError, match="a document of 5 tokens does not fit a 4-token sample"):
        packer.add([1, 2, 3, 4, 5], [2, 3, 4, 5, 6])
    assert packer.flush() == []  # nothing was left in the buffer to loop on


def test_no_packing_puts_each_document_alone_in_its_sample():
    packer = Packer(seq_len=4, pad_id=0, packing="none")
    assert packer.add([1, 2], [2, 3]) == [([1, 2, 0, 0], [2, 3, IGNORE_INDEX, IGNORE_INDEX], [0, 1, 0, 1], 2)]
    assert packer.add([5, 6, 7, 8], [6, 7, 8, 9]) == [([5, 6, 7, 8], [6, 7, 8, 9], [0, 1, 2, 3], 0)]
    assert packer.flush() == []


def test_a_best_fit_packer_restored_from_its_state_makes_the_same_samples():
    lengths = [(7 * i) % 23 + 1 for i in range(60)]
    documents = [(list(range(n)), list(range(1, n + 1))) for n in lengths]

    def pack(packer, docs):
        return [sample for d in docs for sample in packer.add(*d)] + packer.flush()

    reference = Packer(seq_len=32, pad_id=0, buffer_size=8)
    before = [sample for d in documents[:25] for sample in reference.add(*d)]
    state = reference.state_dict()
    after = pack(reference, documents[25:])
    restored = Packer(seq_len=32, pad_id=0, buffer_size=8)
    restored.load_state_dict(state)
    assert pack(restored, documents[25:]) == after
    samples = before + after
    assert sum(lengths) == 720 == sum(32 - padding for *_, padding in samples)  # every token placed once
    assert (len(samples), sum(padding for *_, padding in samples)) == (23, 16)  # greedy: 29 samples, 208 padding
    # every document read back whole, in one sample: the multiset of lengths and each one's tokens
    read_back = []
    for inputs, _, positions, padding in samples:
        starts = [0, *(i for i, p in enumerate(positions) if p == 0 and i > 0), len(positions)]
        pieces = [inputs[a:b] for a, b in zip(starts, starts[1:])][: len(starts) - 1 - (padding > 0)]
        assert all(piece == list(range(len(piece))) for piece in pieces)
        read_back += [len(piece) for piece in pieces]
    assert sorted(read_back) == sorted(lengths)


def test_flow_layout_runs_a_document_on_and_restarts_its_positions():
    packer = Packer(seq_len=4, pad_id=0, packing="flow")
    samples = packer.add(list(range(10, 16)), list(range(11, 17)))  # 6 tokens: one sample + 2 left
    assert samples == [([10, 11, 12, 13], [11, 12, 13, 14], [0, 1, 2, 3], 0)]
    [(inputs, _, positions, padding)] = packer.add([20, 21, 22], [21, 22, 23])
    assert inputs == [14, 15, 20, 21] and padding == 0
    assert positions == [0, 1, 0, 1]  # the continued document starts at 0 again
    assert packer.inputs == [22] and packer.positions == [0]  # cut at the boundary: 0 in the next sample


# ---- the data set, in-process ------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_texts(folder: Path, form: str, texts: list[str]) -> Path:
    """`texts` as rows of a `text` column in file form `form` (a `data.files` extension, or
    save_to_disk), written in `folder` the way `datasets` writes them; returns what data.files names."""
    import datasets

    table, path = datasets.Dataset.from_dict({"text": texts}), folder / f"{form}.{form}"
    if form == "jsonl":
        write_jsonl(path, [{"text": t} for t in texts])
    elif form == "json":
        path.write_text(json.dumps([{"text": t} for t in texts]))
    elif form == "csv":
        table.to_csv(str(path), index=False)
    elif form == "parquet":
        table.to_parquet(str(path))
    elif form == "txt":
        path.write_text("\n\n".join(texts))  # a row per blank-line-separated paragraph
    elif form == "arrow":
        table.save_to_disk(str(folder / "for_arrow"))
        path = next((folder / "for_arrow").glob("*.arrow"))
    else:
        table.save_to_disk(str(path))
    return path


def take(dataset, n):
    iterator = iter(dataset)
    return [next(iterator) for _ in range(n)]


def test_chat_samples_carry_labels_only_on_assistant_tokens(tmp_path, tokenizer):
    files = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVERSATION}] * 3)
    dataset = PackedDataset(DataSource(files=str(files), format="chat"), tokenizer, seq_len=96)
    (sample, labels), = take(dataset, 1)
    assert sample["input"].shape == labels.shape == sample["positions"].shape == (96,)
    kept = [int(t) for t in labels if t != IGNORE_INDEX]
    assert tokenizer.decode(kept, skip_special_tokens=False) == ("<think>\n\n</think>\n\nHello!<|im_end|><think>\n\n"
                                                                 "</think>\n\nIt is 4.<|im_end|>")  # fmt: skip
    assert sample["positions"][0] == 0 and int(sample["positions"].max()) < 96


def test_overlong_conversations_are_truncated_or_dropped_and_counted(tmp_path, tokenizer):
    long_reply = {"messages": [{"role": "user", "content": "Talk."}, {"role": "assistant", "content": "word " * 200}]}
    files = write_jsonl(tmp_path / "long.jsonl", [long_reply, {"messages": CONVERSATION}])
    truncated = PackedDataset(DataSource(files=str(files), format="chat"), tokenizer, seq_len=96, infinite=False)
    samples = list(truncated)
    assert truncated.stats["truncated"] == 1 and truncated.stats["documents"] == 2
    assert all(s["input"].shape == (96,) for s, _ in samples)
    dropping = DataSource(files=str(files), format="chat", overlong="drop", max_dropped=None)  # half of them
    dropped = PackedDataset(dropping, tokenizer, seq_len=96, infinite=False)
    list(dropped)
    assert dropped.stats["dropped"] == 1 and dropped.stats["documents"] == 1


@pytest.mark.parametrize(
    "packing, samples, padding",
    [("best_fit", [[6, 4], [5, 3, 2], [7]], 3), ("greedy", [[6], [5, 4], [3, 2], [7]], 13), ("none", [[6], [5], [4], [3], [2], [7]], 33)],
)  # fmt: skip
def test_data_stats_count_the_tokens_handed_out_their_padding_and_what_still_waits(
    tmp_path, tokenizer, packing, samples, padding
):
    """Text documents kept whole (overlong=truncate) of 6, 5, 4, 3, 2, 7 tokens into 10-token samples."""
    files = write_jsonl(tmp_path / "rows.jsonl", [{"text": " ".join(["word"] * n)} for n in (6, 5, 4, 3, 2, 7)])
    source = DataSource(files=str(files), overlong="truncate", packing=packing, pack_buffer=3)
    dataset = PackedDataset(source, tokenizer, seq_len=10, infinite=False)
    iterator = iter(dataset)
    handed_out = [next(iterator)]
    read = {"best_fit": 3, "greedy": 2, "none": 1}[packing]  # rows read for the first sample
    assert dataset.data_stats()["buffered_documents"] == read - len(samples[0])
    handed_out += list(iterator)
    assert len(handed_out) == len(samples)
    for (sample, _), lengths in zip(handed_out, samples):
        starts = [i for i, p in enumerate(sample["positions"].tolist()) if p == 0]
        assert [b - a for a, b in zip(starts, starts[1:] + [10])][: len(lengths)] == lengths
    stats = dataset.data_stats()
    assert stats["tokens"] == 10 * len(samples) and stats["padding_tokens"] == padding
    assert stats["label_tokens"] == 27 and stats["buffered_documents"] == 0  # every token of text is a target
    write_data_stats(tmp_path, 0, stats)
    write_data_stats(tmp_path, 1, stats)
    total = read_data_stats(tmp_path)
    assert total["tokens"] == 20 * len(samples) and total["packing_efficiency"] == 27 / (10 * len(samples))


@pytest.mark.parametrize("form", ["jsonl", "json", "csv", "parquet", "txt", "arrow", "save_to_disk"])
def test_each_file_form_reads_its_rows_as_documents(tmp_path, tokenizer, form):

    texts = ["alpha beta", "gamma delta epsilon", "zeta"]
    path = write_texts(tmp_path, form, texts)
    dataset = PackedDataset(DataSource(files=str(path), overlong="split"), tokenizer, seq_len=512, infinite=False)
    [(sample, labels)] = list(dataset)
    eos = tokenizer.eos_id
    tokens = [int(t) for t in sample["input"]]
    documents = [tokenizer.encode(t, add_bos=True, add_eos=True) for t in texts]
    expected = [t for doc in documents for t in doc[:-1]]
    assert tokens[: len(expected)] == expected
    assert dataset.stats["rows"] == 3 and dataset.stats["documents"] == 3
    assert [int(p) for p in sample["positions"][: len(documents[0]) - 1]] == list(range(len(documents[0]) - 1))
    assert int(sample["positions"][len(documents[0]) - 1]) == 0  # the second document starts again
    assert [int(t) for t in labels].count(eos) == 3  # each document's last label is its EOS


NOTES = "alpha beta\ngamma\n\ndelta\n\nepsilon zeta\n"


@pytest.mark.parametrize(
    "sample_by, documents",
    [
        ("paragraph", ["alpha beta\ngamma", "delta", "epsilon zeta\n"]),
        ("document", [NOTES]),
        ("line", ["alpha beta", "gamma", "delta", "epsilon zeta"]),  # a blank line is no document
    ],
)
def test_txt_sample_by_makes_a_document_of_each_paragraph_file_or_line(tmp_path, tokenizer, sample_by, documents):
    path = tmp_path / "notes.txt"
    path.write_text(NOTES)
    source = DataSource(files=str(path), txt_sample_by=sample_by, overlong="split")
    dataset = PackedDataset(source, tokenizer, seq_len=64, infinite=False)
    [(sample, _)] = list(dataset)
    # a document's inputs end before its EOS, the last label
    inputs = [tokenizer.encode(text, add_bos=True, add_eos=True)[:-1] for text in documents]
    expected = [t for document_inputs in inputs for t in document_inputs]
    assert [int(t) for t in sample["input"][: len(expected)]] == expected
    assert dataset.stats["documents"] == len(documents)


def test_data_txt_sample_by_reaches_the_loader(tmp_path, assets):
    from conftest import compose_job, plan_of


    (tmp_path / "notes.txt").write_text(NOTES)
    job = compose_job("data=text", f"data.files={tmp_path / 'notes.txt'}", "data.txt_sample_by=line")
    [source] = plan_of(job, tmp_path / "run").trainer_config.dataloader.sources
    assert source.txt_sample_by == "line"


def test_ranks_read_disjoint_shards_and_the_carve_splits_rows_disjointly(tmp_path, tokenizer):
    rows = [{"text": f"row {i}"} for i in range(40)]
    files = write_jsonl(tmp_path / "rows.jsonl", rows)

    def texts(rank, role, streaming=False):
        source = DataSource(files=str(files), overlong="split", val_fraction=0.25)
        dataset = PackedDataset(source, tokenizer, seq_len=4, dp_rank=rank, dp_world_size=2, infinite=False,
                                role=role, streaming=streaming)  # fmt: skip
        return [read_row(example, source.name())[0]["text"] for example in dataset._get_data_iter()]

    for streaming in (False, True):
        train = [texts(rank, "train", streaming) for rank in (0, 1)]
        val = [texts(rank, "validation", streaming) for rank in (0, 1)]
        everything = [t for part in train + val for t in part]
        assert sorted(everything) == sorted(r["text"] for r in rows)  # each row read once, by one rank
        assert len(val[0]) + len(val[1]) == 10  # a quarter


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("form", ["text", "chat"])
def test_resuming_from_the_state_gives_the_very_next_samples(tmp_path, tokenizer, streaming, form):
    if form == "chat":
        rows = [{"messages": [{"role": "user", "content": f"q{i} " * (i % 7)},
                              {"role": "assistant", "content": f"answer {i} " * (i % 5 + 1)}]} for i in range(30)]  # fmt: skip
    else:
        rows = [{"text": f"document {i} " * (i % 9 + 1)} for i in range(30)]
    files = write_jsonl(tmp_path / "rows.jsonl", rows)
    source = DataSource(files=str(files), format=form, overlong="split" if form == "text" else "truncate",
                        max_dropped=None)  # chat: a third of the prompts fill seq_len 24  # fmt: skip

    def fresh():
        return PackedDataset(source, tokenizer, seq_len=24, streaming=streaming)

    reference = fresh()
    iterator = iter(reference)
    for _ in range(5):
        next(iterator)
    state = reference.state_dict()
    tail = [next(iterator) for _ in range(12)]  # runs past the end of the rows: re-loops once
    resumed = fresh()
    resumed.load_state_dict(state)
    again = take(resumed, 12)
    for (a, a_labels), (b, b_labels) in zip(tail, again):
        assert a["input"].tolist() == b["input"].tolist()
        assert a["positions"].tolist() == b["positions"].tolist()
        assert a_labels.tolist() == b_labels.tolist()


# ---- the launcher's side: show_data, metrics merging, the sweep objective -------------------------


def test_show_data_prints_rank_0_samples_with_the_spans_without_loss_marked(tmp_path, assets):
    from conftest import compose_job, plan_of

    from qwen3_neuron.data.preview import show_samples

    overrides = ("data=chat", "data.packing=greedy", "training.seq_len=256", "run.show_data=1")  # in row order
    plan = plan_of(compose_job(*overrides), tmp_path / "run")
    text = show_samples(plan.trainer_config, 1, dp_world_size=2)
    first = json.loads(assets.chat_train_file.read_text().splitlines()[0])["messages"]
    opening, sample = text.split("\n\n", 1)
    assert opening == ("=== data.thinking=empty_block: every assistant turn opens with '<think>\\n\\n</think>\\n\\n', "
                       "trained with it (the chat template writes it for a final turn without reasoning only) ===")
    assert sample.startswith("=== sample 1 of rank 0: 2 document(s)")
    assert f"⟦<|im_start|>system\n{first[0]['content']}<|im_end|>\n<|im_start|>user\n{first[1]['content']}" in text
    assert f"<|im_start|>assistant\n⟧<think>\n\n</think>\n\n{first[2]['content']}<|im_end|>⟦\n<|im_start|>user" in text
    assert f"<|im_start|>assistant\n⟧<think>\n\n</think>\n\n{first[4]['content']}<|im_end|>" in text
    assert "⟦pad ×" in text


@pytest.mark.integration
def test_show_data_from_the_command_line_prints_the_samples_and_starts_nothing(tmp_path, assets):
    """`launch.py ... run.show_data=2`: the launcher plans and prints rank 0's samples of the
    2-rank job itself; no torchrun starts (no rank logs, no train.log), nothing trains."""
    from conftest import compose_job, launch, plan_of

    from qwen3_neuron.data.preview import show_samples

    overrides = ("data=chat", "training.seq_len=256", "run.show_data=2")
    run_dir = tmp_path / "run"
    result = launch(run_dir, *overrides, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plan = plan_of(compose_job(*overrides), tmp_path / "in-process")
    assert "=== sample 2 of rank 0: " in result.stdout and "=== sample 3 " not in result.stdout
    samples = show_samples(plan.trainer_config, 2, dp_world_size=2)
    assert samples in result.stdout
    # on stderr the plan's one note: how far the run's steps would go into the rows (the first rows only read)
    assert [line.split(", about ")[0] for line in result.stderr.splitlines()] == [
        "[qwen3-neuron] data: the run's steps take 240 samples"]
    # besides the samples, the project's own lines only, as written: what the data pipeline did
    # to rows (here: long conversations cut to seq_len) and the last line
    others = result.stdout.replace(samples, "").splitlines()
    assert others[-1] == "[qwen3-neuron] run.show_data=2: rank 0's first 2 samples shown; nothing trained"
    assert [line for line in others if line and not line.startswith("[qwen3-neuron")] == []
    assert any(line.startswith("[qwen3-neuron data] ") and " line 3: truncated: " in line for line in others)
    assert not {"ranks", "train.log", "metrics.jsonl", "summary.json"} & {p.name for p in run_dir.iterdir()}


def test_validation_records_merge_into_their_step_and_val_loss_is_an_objective(tmp_path):
    from qwen3_neuron.report.summary import summarize, sweep_job_value
    from qwen3_neuron.run_dir import read_metrics
    from qwen3_neuron.worker.metrics import validation_record

    lines = [{"step": 1, "loss": 7.5, "data_loading_pct": 9.0}, validation_record({"validation_metrics/loss": 7.25}, 1),
             {"step": 2, "loss": 7.0, "data_loading_pct": 0.5}, {"step": 3, "loss": 6.9, "data_loading_pct": 0.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_metrics(tmp_path)[0] == {"step": 1, "loss": 7.5, "data_loading_pct": 9.0, "val_loss": 7.25,
                                         "val_perplexity": pytest.approx(1408.1, abs=0.1)}  # fmt: skip
    summary = summarize(tmp_path, "completed", 1.0)
    assert (summary["final_loss"], summary["val_loss"], summary["val_step"]) == (6.9, 7.25, 1)
    assert summary["data_wait_pct"] == pytest.approx(0.6)  # the median after step 1
    assert sweep_job_value(summary, "val_loss", stop_on_failure=False) == 7.25


def test_the_progress_line_shows_the_last_validation_loss(tmp_path):
    import io

    from qwen3_neuron.launch.progress import Progress

    metrics = tmp_path / "metrics.jsonl"
    progress = Progress(metrics, total_steps=4, stream=io.StringIO())
    lines = [{"step": 1, "loss": 7.5, "elapsed_seconds": 1.0}, {"step": 1, "val_loss": 7.25},
             {"step": 2, "loss": 7.0, "elapsed_seconds": 2.0}]  # fmt: skip
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert progress._poll()
    assert progress.line().startswith("[qwen3-neuron]  step 2/4  loss 7.0000  val 7.2500 (step 1)  ")


def test_a_mix_interleaves_text_and_chat_sources_by_weight(tmp_path, tokenizer, assets):
    from conftest import compose_job, plan_of

    from qwen3_neuron.data.loader import PackedDataLoader

    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": f"plain text number {i}"} for i in range(50)])
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVERSATION}] * 50)
    config = PackedDataLoader.Config(sources=[
        DataSource(files=str(texts), format="text", overlong="split", weight=3.0),
        DataSource(files=str(chats), format="chat", weight=1.0),
    ], cache_dir=str(tmp_path / "cache"))  # fmt: skip
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=32, local_batch_size=1)
    kinds = []
    for _, (batch, labels) in zip(range(40), loader):
        has_prompt = bool((labels == IGNORE_INDEX).any()) and batch["input"][0, 0] == tokenizer.token_to_id("<|im_start|>")
        kinds.append("chat" if has_prompt else "text")
    assert 0 < kinds.count("chat") < kinds.count("text")  # weights 3:1, a seeded draw
    assert loader.data_stats()["documents"] > 0
    plan = plan_of(compose_job("data=mix"), tmp_path / "run")  # conf/data/mix.yaml's example
    assert [s.format for s in plan.trainer_config.dataloader.sources] == ["text", "chat"]


def test_a_hub_data_set_is_read_from_the_hub_cache_offline(tmp_path, tokenizer, monkeypatch):
    """What `hf download ID --repo-type dataset` leaves: a snapshot in the hub cache."""
    import huggingface_hub

    snapshot = tmp_path / "hub" / "datasets--acme--tiny-text" / "snapshots" / "abc123"
    (snapshot / "data").mkdir(parents=True)
    write_jsonl(snapshot / "data" / "train.jsonl", [{"text": "hello world"}, {"text": "second row"}])
    (tmp_path / "hub" / "datasets--acme--tiny-text" / "refs").mkdir()
    (tmp_path / "hub" / "datasets--acme--tiny-text" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for streaming in (True, False):
        dataset = PackedDataset(DataSource(hf_dataset="acme/tiny-text", overlong="split"), tokenizer, seq_len=8,
                                streaming=streaming, infinite=False, cache_dir=str(tmp_path / "cache"))  # fmt: skip
        assert [row["text"] for row in dataset._get_data_iter()] == ["hello world", "second row"]
