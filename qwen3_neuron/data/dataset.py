"""One source's rows -> packed training samples, for one data-parallel rank; checkpointable.

`PackedDataset` is torchtitan's `HuggingFaceTextDataset` / `ChatDataset` contract (yields
`({"input", "positions"}, labels)` of exactly `seq_len`, `Stateful`, re-loops with a reshuffle
of seed 42 + epoch) for any local or cached source, text or multi-turn chat. Its state is the
read position (row index, or `datasets`' own stream state when streaming), the packer's buffer,
the samples packed but not yet handed out, and the counts below, so a resumed run continues with
the very next sample.

Counts (`stats`): rows read, documents read, overlong documents truncated / dropped / split,
rows skipped because they cannot be read (not JSON, not a conversation); and of the samples
handed out, their tokens, the tokens with a loss and the padding; `pass_rows`, the rows of one
pass over the rank's share (0 until it has been read to its end), which says how many times the
rows went round (rows / pass_rows). `data_stats()` adds the
documents still waiting in the packer and, for each fate but the plain one, its first few rows
with where they are (file and 1-based line for JSON, 1-based row of the source for the other
formats read map-style) and why, in words that say what to change.
An overlong or skipped row is logged (the first, then at each power of two) and the counts reach
summary.json and the end-of-run lines.

`data.max_dropped`: at the end of each pass over the rank's rows, and every `MAX_DROPPED_AFTER`
rows within one (a streamed corpus may never end a pass), a share of rows dropped or skipped above
it stops the run with a DataError naming the first of them (a validation loader's as validation rows).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from qwen3_neuron.data import row_loading
from qwen3_neuron.data.chat_rows import ChatFormatError, ChatRenderer, row_conversation
from qwen3_neuron.data.packing import (
    DESIRABLE,
    MARGINS,
    SEQUENCE_IDS,
    Packer,
    Sample,
    document,
    fit,
    fit_pair,
    scored_document,
    sequence_ids,
)
from qwen3_neuron.data.preference import Unit, pair_tokens, row_pair, row_units, unit_tokens
from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_tokens, row_columns
from qwen3_neuron.data.row_loading import RowError, read_row
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import DataError

MARGINS_COLUMN = "margin"  # TRL's RewardTrainer's column name
STAT_NAMES = (
    "rows", "documents", "truncated", "dropped", "split", "skipped", "tokens", "label_tokens", "padding_tokens",
    "pass_rows",
)  # fmt: skip
EXAMPLE_STATS = ("truncated", "dropped", "split", "skipped")  # the fates whose first rows are kept, with why
EXAMPLES = 5  # rows kept per fate and rank
MAX_DROPPED_AFTER = 1000  # rows read before data.max_dropped is checked, when a pass is longer


class PackedDataset(IterableDataset, Stateful):
    def __init__(
        self,
        source: DataSource,
        tokenizer,
        *,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        infinite: bool = True,
        streaming: bool = False,
        role: str = "train",
        cache_dir: str | None = None,
    ):
        rows = row_loading.load_rows(source, streaming=streaming, cache_dir=cache_dir)
        rows = row_loading.carve(rows, source.val_fraction, role)
        self._original_data = row_loading.shard(rows, dp_rank, dp_world_size)
        self._data = self._original_data
        self.source, self.seq_len, self.infinite, self.rank, self.role = source, seq_len, infinite, dp_rank, role
        self._validation = role == "validation"
        self._tokenizer = tokenizer
        chat = source.format != "text"
        self._chat = ChatRenderer(tokenizer, source.train_on_prompt, source.thinking) if chat else None
        self._pairs = source.format in ("preference", "kto")  # a pair's (a KTO unit's) two documents: one sample
        self._kto = source.format == "kto"
        # trainer=kto: the completions the next row's KL documents take (the last row's), and the
        # rank's first row's units, which wait for the second row's
        self._previous_completions: list[list[dict]] | None = None
        self._held: list[tuple[Unit, str]] | None = None
        self._prompts = source.format == "prompts"  # one prompt a sample, generated from by the GRPO step
        pad_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        flow = source.format == "text" and source.overlong == "split"
        self._scored = self._pairs and source.scored_pairs  # trainer=reward_model: scores at last tokens, margins
        self._packer = Packer(seq_len, pad_id, "flow" if flow else source.packing, source.pack_buffer)
        self._ready: list[Sample] = []  # packed, not yet handed out
        self._sample_idx = 0
        self._epoch = 0
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self.examples: dict[str, list[str]] = {name: [] for name in EXAMPLE_STATS}  # "where: why"

    # ---- rows -> documents ---------------------------------------------------------------

    def row_tokens(self, row: dict[str, Any]) -> tuple[list[int], list[bool]]:
        """Token ids of one row and which of them are training targets."""
        if self._chat is not None:
            return self._chat.tokens(row_conversation(row, self.source))
        text = row.get(self.source.text_field)
        if not isinstance(text, str):
            raise ChatFormatError(f"data.text_field={self.source.text_field}: expected a string, got {text!r:.40}")
        tokens = self._tokenizer.encode(text, add_bos=True, add_eos=True)
        return tokens, [True] * len(tokens)

    def _read(self, example: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """The row and where it is: its file and line (JSON), its row in the source (map-style), else
        (streamed) its place in this rank's share."""
        try:
            row, where = read_row(example, self.source.name())
        except RowError as e:
            where, _, why = str(e).partition(": ")
            self._count("skipped", where, why)
            return None, where
        return row, where or f"row {self._sample_idx} of rank {self.rank}'s share of {self.source.name()}"

    def _pair(self, example: dict[str, Any]) -> list[Sample]:
        """data=preference: the samples the chosen and the rejected document of one row, fitted
        together, complete."""
        row, where = self._read(example)
        if row is None:
            return []
        try:
            tokens = pair_tokens(self._chat, row_pair(row, self.source))
            margin = row_margin(row) if self._scored else None
        except ChatFormatError as e:
            self._count("skipped", where, str(e))
            return []
        if self._scored:
            documents, fate, why = scored_pair_fate([scored_document(t) for t, _ in tokens], self.seq_len)
        else:
            documents, fate, why = pair_fate([document(*t) for t in tokens], self.seq_len, self.source.overlong)
        if fate:
            self._count(fate, where, why)
        if documents is None:
            return []
        self.stats["documents"] += 2
        if not self._scored:
            return self._packer.add_together(documents)
        return self._packer.add_together(documents, marks=[margin, 0.0])  # read where the chosen one is scored

    def _units(self, example: dict[str, Any]) -> list[Sample]:
        """trainer=kto: the samples completed by placing the row's units (one, or a pair's two),
        each its completion's document and, with the same prompt, the previous row's completion
        (TRL's rotation: every completion is another prompt's mismatched one once; the rank's first
        row waits for the second's)."""
        row, where = self._read(example)
        if row is None:
            return []
        try:
            units = row_units(row, self.source)
        except ChatFormatError as e:
            self._count("skipped", where, str(e))
            return []
        completions = [unit.completion for unit in units]
        if self._previous_completions is None:
            self._held, self._previous_completions = [(unit, where) for unit in units], completions
            return []
        placed, fates, previous = [], set(), self._previous_completions
        for i, unit in enumerate(units):
            placed += self._place_unit(unit, previous[i % len(previous)], where, fates)
        for i, (unit, held_where) in enumerate(self._held or []):
            placed += self._place_unit(unit, completions[i % len(completions)], held_where, set())
        self._held, self._previous_completions = None, completions
        return placed

    def _place_unit(self, unit: Unit, kl_completion: list[dict], where: str, fates: set[str]) -> list[Sample]:
        """One KTO unit's two documents, fitted together; each fate counted once per row (`fates`)."""
        try:
            documents = [document(*unit_tokens(self._chat, unit, completion))
                         for completion in (unit.completion, kl_completion)]  # fmt: skip
        except ChatFormatError as e:
            fate, why, documents = "skipped", str(e), None
        else:
            what = "the unit (its completion, and the KL estimate's mismatched one) is"
            documents, fate, why = pair_fate(documents, self.seq_len, self.source.overlong, what)
        if fate and fate not in fates:
            fates.add(fate)
            self._count(fate, where, why)
        if documents is None:
            return []
        self.stats["documents"] += 2
        return self._packer.add_together(documents, marks=[int(unit.desirable), 0])

    def _prompt(self, example: dict[str, Any]) -> list:
        """data=prompts: one sample, the prompt's tokens padded to seq_len (its length beside them)
        and the row's columns; a prompt longer than seq_len is dropped (the plan checks the room
        left for the completion)."""
        row, where = self._read(example)
        if row is None:
            return []
        try:
            tokens = prompt_tokens(self._tokenizer, row, self.source)
        except ChatFormatError as e:
            self._count("skipped", where, str(e))
            return []
        if len(tokens) >= self.seq_len:
            self._count("dropped", where, f"the prompt is {len(tokens)} tokens, no room left for a completion in "
                                          f"training.seq_len {self.seq_len}")  # fmt: skip
            return []
        self.stats["documents"] += 1
        pad_id = self._packer.pad_id
        padding = self.seq_len - len(tokens)
        return [(tokens + [pad_id] * padding, [IGNORE_INDEX] * self.seq_len, (len(tokens), row_columns(row)), padding)]

    def _document(self, example: dict[str, Any]) -> tuple[list[int], list[int]] | None:
        row, where = self._read(example)
        if row is None:
            return None
        try:
            tokens, trained = self.row_tokens(row)
        except ChatFormatError as e:  # checked on the first rows at plan time; a later bad row is skipped, counted
            self._count("skipped", where, str(e))
            return None
        fitted, fate, why = document_fate(tokens, trained, self.seq_len, self.source.overlong)
        if fate:
            self._count(fate, where, why)
        if fitted is None or len(fitted[0]) == 0:
            return None
        self.stats["documents"] += 1
        return fitted

    def _count(self, stat: str, where: str, why: str) -> None:
        self.stats[stat] += 1
        count = self.stats[stat]
        said = f"{where}: {why}"
        if len(self.examples[stat]) < EXAMPLES and said not in self.examples[stat]:  # once, on every pass
            self.examples[stat].append(said)
        if count & (count - 1) == 0:  # 1, 2, 4, 8, ...: visible, never a flood
            log = logger.info if stat == "split" else logger.warning  # split loses nothing: news, not a warning
            log(f"[qwen3-neuron data] {where}: {stat}: {why} ({stat} so far on rank {self.rank}: {count})")

    def _check_max_dropped(self, pass_done: bool) -> None:
        """data.max_dropped: too many rows dropped or skipped stops the run, naming them."""
        rows, limit = self.stats["rows"], self.source.max_dropped
        if limit is None or not rows or not (pass_done or rows % MAX_DROPPED_AFTER == 0):
            return
        dropped, skipped = self.stats["dropped"], self.stats["skipped"]
        lost = dropped + skipped
        if lost / rows > limit:
            first = (self.examples["dropped"] + self.examples["skipped"])[0]
            which = f"{rows} rows rank {self.rank} read are not trained"
            if self.role == "validation":
                which = f"{rows} validation rows rank {self.rank} read{carved(self.source)} are not validated on"
            raise DataError(
                f"{self.source.name()}: {lost} of the {which} ({100 * lost / rows:.1f} %, more than "
                f"data.max_dropped={limit}); the first: {first}. {untrained_advice(dropped, skipped, 'data')}"
            )

    # ---- iteration -----------------------------------------------------------------------

    def _get_data_iter(self):
        import datasets

        if isinstance(self._data, datasets.Dataset):
            if self._sample_idx >= len(self._data):
                return iter([])
            return iter(self._data.skip(self._sample_idx))
        return iter(self._data)

    def __iter__(self):
        while True:
            yield from self._hand_out()
            whole_pass, rows_this_epoch, documents_before = self._sample_idx == 0, 0, self.stats["documents"]
            # _sample_idx: the rows of this pass read so far, a resumed run's before it was saved included
            for example in self._get_data_iter():
                self._sample_idx += 1
                self.stats["rows"] += 1
                rows_this_epoch += 1
                if self._prompts:
                    self._ready += self._prompt(example)
                elif self._kto:
                    self._ready += self._units(example)
                elif self._pairs:
                    self._ready += self._pair(example)
                else:
                    doc = self._document(example)
                    self._ready += self._packer.add(*doc) if doc is not None else []
                self._check_max_dropped(pass_done=False)
                yield from self._hand_out()
            self._check_max_dropped(pass_done=rows_this_epoch > 0)
            if rows_this_epoch:
                self.stats["pass_rows"] = self._sample_idx  # a pass resumed half-way is whole too
            if whole_pass and rows_this_epoch and self.stats["documents"] == documents_before and self.infinite:
                raise DataError(
                    f"data source {self.source.name()}: none of the {rows_this_epoch} rows of rank {self.rank} "
                    f"became a document (counts: {self.stats}); raise training.seq_len or see data.overlong"
                )
            if not self.infinite:
                held, self._held = self._held or [], None  # the rank read one row: its units' completions rotated
                for i, (unit, where) in enumerate(held):
                    self._ready += self._place_unit(unit, held[(i + 1) % len(held)][0].completion, where, set())
                self._ready += self._packer.flush()
                yield from self._hand_out()
                logger.info(f"[qwen3-neuron data] {self.source.name()}: out of data on rank {self.rank}")  # as planned
                return
            if rows_this_epoch == 0 and self._sample_idx == 0:
                raise DataError(
                    f"data source {self.source.name()} has no rows for data-parallel rank {self.rank} "
                    "(fewer rows than ranks, or an empty carve)"
                )
            if self._validation:
                # held out: each pass packed whole before the rows go round again (a set smaller than
                # the packing buffer would fill it with copies of itself, and best fit would hand out
                # its longest document again and again)
                self._ready += self._packer.flush()
                yield from self._hand_out()
            self.reloop()  # training: what the packer holds waits for the next pass's documents

    def _hand_out(self):
        while self._ready:
            inputs, labels, positions, padding, *marks = self._ready.pop(0)
            if self._prompts:  # (prompt length, the row's columns) where positions go
                (length, columns), positions = positions, None
            self.stats["tokens"] += len(inputs)
            self.stats["label_tokens"] += sum(label != IGNORE_INDEX for label in labels)
            self.stats["padding_tokens"] += padding
            if self._prompts:
                input_dict = {"input": torch.tensor(inputs, dtype=torch.long), PROMPT: torch.tensor(length), ROW: columns}
                yield input_dict, torch.tensor(labels, dtype=torch.long)
                continue
            input_dict = {"input": torch.tensor(inputs, dtype=torch.long),
                          "positions": torch.tensor(positions, dtype=torch.long)}  # fmt: skip
            if self._pairs:
                input_dict[SEQUENCE_IDS] = torch.tensor(sequence_ids(labels, positions), dtype=torch.long)
            if marks:  # trainer=kto: which labels are a desirable completion's; reward_model: each pair's margin
                key, dtype = (MARGINS, torch.float32) if self._scored else (DESIRABLE, torch.long)
                input_dict[key] = torch.tensor(marks[0], dtype=dtype)
            yield input_dict, torch.tensor(labels, dtype=torch.long)

    def data_stats(self) -> dict[str, int]:
        """`stats`, and the documents read but not yet (or not wholly) in a sample handed out."""
        ready = len(self._ready) if self._prompts else sum(
            sample[2].count(0) - (sample[3] > 0) for sample in self._ready)  # positions, padding
        examples = {stat: list(rows) for stat, rows in self.examples.items() if rows}
        return {**self.stats, "buffered_documents": self._packer.waiting_documents() + ready, "examples": examples}

    def reloop(self) -> None:
        import datasets

        self._sample_idx = 0
        self._epoch += 1
        if isinstance(self._data, datasets.Dataset):
            self._data = self._original_data.shuffle(seed=42 + self._epoch)
        elif hasattr(self._data, "set_epoch"):
            self._data.set_epoch(self._epoch)
        logger.warning(f"[qwen3-neuron data] {self.source.name()}: re-looped on rank {self.rank} (epoch {self._epoch})")

    # ---- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        import datasets

        state = {
            "epoch": self._epoch,
            "packer": self._packer.state_dict(),
            "ready": list(self._ready),
            "stats": dict(self.stats),
            "examples": {stat: list(rows) for stat, rows in self.examples.items()},
        }
        if self._kto:
            state["kto"] = {"previous_completions": self._previous_completions, "held": self._held}
        state["sample_idx"] = self._sample_idx  # map-style: where to go on; streamed: the rows of the pass so far
        if not isinstance(self._data, datasets.Dataset):
            state["data"] = self._data.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import datasets

        self._epoch = state["epoch"]
        self._packer.load_state_dict(state["packer"])
        self._ready = [tuple(sample) for sample in state["ready"]]
        if self._prompts:
            self._ready = [(i, l, tuple(p), pad) for i, l, p, pad in self._ready]
        self.stats.update(state["stats"])
        self.examples.update({stat: list(rows) for stat, rows in state.get("examples", {}).items()})
        self._sample_idx = state.get("sample_idx", 0)
        if self._kto:
            self._previous_completions, self._held = state["kto"]["previous_completions"], state["kto"]["held"]
        if isinstance(self._data, datasets.Dataset):
            if self._epoch > 0:
                self._data = self._original_data.shuffle(seed=42 + self._epoch)
        else:
            self._data.set_epoch(state["data"].get("epoch", 0))
            self._data.load_state_dict(state["data"])


def carved(source: DataSource) -> str:
    """Where a source's validation rows come from, when they are its data.val_fraction carve."""
    return f" (data.val_fraction={source.val_fraction})" if source.val_fraction else ""


def untrained_advice(dropped: int, skipped: int, key: str) -> str:
    """What to change when too many rows go untrained, for the reasons they do: a row dropped is
    too long for training.seq_len, a row skipped cannot be read as the data kind's row."""
    ways = ["raise training.seq_len"] if dropped else []
    ways += ["fix or leave out those rows" if skipped else "leave out those rows", f"raise {key}.max_dropped (null: no limit)"]
    said = " or ".join(ways) if len(ways) == 2 else f"{ways[0]}, {ways[1]}, or {ways[2]}"
    return said[0].upper() + said[1:]


def document_fate(
    tokens: list[int], trained: list[bool], seq_len: int, overlong: str
) -> tuple[tuple[list[int], list[int]] | None, str | None, str]:
    """One row's document as training takes it (None: dropped), what happened to it
    ("truncated", "dropped", "split"; None: nothing) and why, in numbers a user can act on."""
    inputs, labels = document(tokens, trained)
    if len(inputs) <= seq_len:
        return (inputs, labels), None, ""
    fitted = fit(inputs, labels, seq_len, overlong)
    if fitted is not None and all(label == IGNORE_INDEX for label in fitted[1]):
        before = trained.index(True) if True in trained else len(trained)
        return None, "dropped", (f"the prompt alone is {before} tokens (before its first assistant token), "
                                 f"training.seq_len {seq_len}: cut there, nothing of it would be trained")  # fmt: skip
    if overlong == "drop":
        return None, "dropped", f"{len(tokens)} tokens, training.seq_len {seq_len} (data.overlong=drop)"
    if overlong == "truncate":
        return fitted, "truncated", f"{len(tokens)} tokens, cut to training.seq_len {seq_len}"
    return fitted, "split", f"{len(tokens)} tokens, run on across training.seq_len {seq_len} samples"


def row_margin(row: dict[str, Any]) -> float:
    """TRL's optional `margin` column: how far the chosen score should lead the rejected one (0 without it)."""
    margin = row.get(MARGINS_COLUMN)
    if margin is None:
        return 0.0
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise ChatFormatError(f"the {MARGINS_COLUMN!r} column is {margin!r}: a finite number (TRL's RewardTrainer "
                              "subtracts it from the score gap), or leave it out")  # fmt: skip
    return float(margin)


def scored_pair_fate(
    documents: list[tuple[list[int], list[int]]], seq_len: int
) -> tuple[list[tuple[list[int], list[int]]] | None, str | None, str]:
    """trainer=reward_model's pair, whole in one sample or dropped: a sequence is scored at its
    last token, which a cut sequence no longer has (TRL drops pairs over max_length too)."""
    length = sum(len(inputs) for inputs, _ in documents)
    if length <= seq_len:
        return documents, None, ""
    return None, "dropped", (f"the pair is {length} tokens, training.seq_len {seq_len}: a reward model scores "
                             "each sequence at its last token, so a pair is never cut")  # fmt: skip


def pair_fate(
    documents: list[tuple[list[int], list[int]]], seq_len: int, overlong: str, what: str = "the pair is"
) -> tuple[list[tuple[list[int], list[int]]] | None, str | None, str]:
    """A preference pair's two documents (or a KTO unit's: `what` names them) as training takes
    them, fitted into one sample (None: dropped), what happened to them and why."""
    length = sum(len(inputs) for inputs, _ in documents)
    if length <= seq_len:
        return documents, None, ""
    if overlong == "drop":
        return None, "dropped", f"{what} {length} tokens, training.seq_len {seq_len} (data.overlong=drop)"
    fitted = fit_pair(documents, seq_len)
    if fitted is None:
        return None, "dropped", (f"{what} {length} tokens, and cut to share one training.seq_len {seq_len} "
                                 "sample a response keeps no token to train")  # fmt: skip
    return fitted, "truncated", f"{what} {length} tokens, both cut to share one training.seq_len {seq_len} sample"
