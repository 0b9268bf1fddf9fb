"""One source's rows -> packed training samples, for one data-parallel rank; checkpointable.

`PackedDataset` is torchtitan's `HuggingFaceTextDataset` / `ChatDataset` contract (yields
`({"input", "positions"}, labels)` of exactly `seq_len`, `Stateful`, re-loops with a reshuffle
of seed 42 + epoch) for any local or cached source, text or multi-turn chat. Its state is the
read position (row index, or `datasets`' own stream state when streaming), the packer's buffer,
the samples packed but not yet handed out, and the counts below, so a resumed run continues with
the very next sample.

Counts (`stats`): rows read, documents read, overlong documents truncated / dropped / split,
rows skipped because they are not a conversation; and of the samples handed out, their tokens,
the tokens with a loss and the padding. `data_stats()` adds the documents still waiting in the
packer. An overlong or skipped row is logged (the first, then at each power of two) and the
counts reach summary.json.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from qwen3_neuron.data import row_loading
from qwen3_neuron.data.chat_rows import ChatFormatError, ChatRenderer, row_conversation
from qwen3_neuron.data.packing import SEQUENCE_IDS, Packer, Sample, document, fit, fit_pair, sequence_ids
from qwen3_neuron.data.preference import pair_tokens, row_pair
from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_tokens, row_columns
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import DataError

STAT_NAMES = (
    "rows", "documents", "truncated", "dropped", "split", "skipped", "tokens", "label_tokens", "padding_tokens",
)  # fmt: skip


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
        self.source, self.seq_len, self.infinite, self.rank = source, seq_len, infinite, dp_rank
        self._tokenizer = tokenizer
        self._chat = ChatRenderer(tokenizer, source.train_on_prompt) if source.format != "text" else None
        self._pairs = source.format == "preference"  # a pair's two documents go into one sample
        self._prompts = source.format == "prompts"  # one prompt a sample, generated from by the GRPO step
        pad_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        flow = source.format == "text" and source.overlong == "split"
        self._packer = Packer(seq_len, pad_id, "flow" if flow else source.packing, source.pack_buffer)
        self._ready: list[Sample] = []  # packed, not yet handed out
        self._sample_idx = 0
        self._epoch = 0
        self.stats = dict.fromkeys(STAT_NAMES, 0)

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

    def _pair(self, row: dict[str, Any]) -> list[tuple[list[int], list[int]]] | None:
        """data=preference: the chosen and the rejected document of one row, fitted together."""
        try:
            documents = [document(*tokens) for tokens in pair_tokens(self._chat, row_pair(row, self.source))]
        except ChatFormatError as e:
            self._count("skipped", f"row {self._sample_idx} cannot be read ({e}): skipped")
            return None
        length = sum(len(inputs) for inputs, _ in documents)
        if length > self.seq_len:
            overlong = self.source.overlong
            fitted = fit_pair(documents, self.seq_len) if overlong == "truncate" else None
            action = "truncated" if fitted else "dropped"
            self._count(action, f"row {self._sample_idx}: the pair is {length} tokens > training.seq_len "
                                f"{self.seq_len}: {action} (data.overlong={overlong})")  # fmt: skip
            if fitted is None:
                return None
            documents = fitted
        self.stats["documents"] += 2
        return documents

    def _prompt(self, row: dict[str, Any]) -> list:
        """data=prompts: one sample, the prompt's tokens padded to seq_len (its length beside them)
        and the row's columns; a prompt longer than seq_len is dropped (the plan checks the room
        left for the completion)."""
        try:
            tokens = prompt_tokens(self._tokenizer, row, self.source)
        except ChatFormatError as e:
            self._count("skipped", f"row {self._sample_idx} cannot be read ({e}): skipped")
            return []
        if len(tokens) >= self.seq_len:
            self._count("dropped", f"row {self._sample_idx}: the prompt is {len(tokens)} tokens, no room left in "
                                   f"training.seq_len {self.seq_len}: dropped")  # fmt: skip
            return []
        self.stats["documents"] += 1
        pad_id = self._packer.pad_id
        padding = self.seq_len - len(tokens)
        return [(tokens + [pad_id] * padding, [IGNORE_INDEX] * self.seq_len, (len(tokens), row_columns(row)), padding)]

    def _document(self, row: dict[str, Any]) -> tuple[list[int], list[int]] | None:
        try:
            tokens, trained = self.row_tokens(row)
        except ChatFormatError as e:  # checked on the first rows at plan time; a later bad row is skipped, counted
            self._count("skipped", f"row {self._sample_idx} cannot be read ({e}): skipped")
            return None
        inputs, labels = document(tokens, trained)
        if len(inputs) > self.seq_len:
            overlong = self.source.overlong
            fitted = fit(inputs, labels, self.seq_len, overlong)
            action = {"truncate": "truncated", "drop": "dropped", "split": "split"}[overlong]
            if fitted is not None and all(label == IGNORE_INDEX for label in fitted[1]):
                fitted, action = None, "dropped"  # truncation left no assistant token to learn from
            self._count(action, f"row {self._sample_idx}: {len(inputs)} tokens > training.seq_len "
                                f"{self.seq_len}: {action} (data.overlong={overlong})")  # fmt: skip
            if fitted is None:
                return None
            inputs, labels = fitted
        if len(inputs) == 0:
            return None
        self.stats["documents"] += 1
        return inputs, labels

    def _count(self, stat: str, message: str) -> None:
        self.stats[stat] += 1
        count = self.stats[stat]
        if count & (count - 1) == 0:  # 1, 2, 4, 8, ...: visible, never a flood
            log = logger.info if stat == "split" else logger.warning  # split loses nothing: news, not a warning
            log(f"[qwen3-neuron data] rank {self.rank}: {message} ({stat} so far: {count})")

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
            for row in self._get_data_iter():
                self._sample_idx += 1
                self.stats["rows"] += 1
                rows_this_epoch += 1
                if self._prompts:
                    self._ready += self._prompt(row)
                elif self._pairs:
                    pair = self._pair(row)
                    self._ready += self._packer.add_together(pair) if pair else []
                else:
                    doc = self._document(row)
                    self._ready += self._packer.add(*doc) if doc is not None else []
                yield from self._hand_out()
            if whole_pass and rows_this_epoch and self.stats["documents"] == documents_before and self.infinite:
                raise DataError(
                    f"data source {self.source.name()}: none of the {rows_this_epoch} rows of rank {self.rank} "
                    f"became a document (counts: {self.stats}); raise training.seq_len or see data.overlong"
                )
            if not self.infinite:
                self._ready += self._packer.flush()
                yield from self._hand_out()
                logger.warning(f"[qwen3-neuron data] {self.source.name()}: out of data on rank {self.rank}")
                return
            if rows_this_epoch == 0 and self._sample_idx == 0:
                raise DataError(
                    f"data source {self.source.name()} has no rows for data-parallel rank {self.rank} "
                    "(fewer rows than ranks, or an empty carve)"
                )
            self.reloop()  # what the packer holds waits for the next pass's documents

    def _hand_out(self):
        while self._ready:
            inputs, labels, positions, padding = self._ready.pop(0)
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
            yield input_dict, torch.tensor(labels, dtype=torch.long)

    def data_stats(self) -> dict[str, int]:
        """`stats`, and the documents read but not yet (or not wholly) in a sample handed out."""
        ready = len(self._ready) if self._prompts else sum(
            positions.count(0) - (padding > 0) for _, _, positions, padding in self._ready)
        return {**self.stats, "buffered_documents": self._packer.waiting_documents() + ready}

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
        }
        if isinstance(self._data, datasets.Dataset):
            state["sample_idx"] = self._sample_idx
        else:
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
        if isinstance(self._data, datasets.Dataset):
            self._sample_idx = state["sample_idx"]
            if self._epoch > 0:
                self._data = self._original_data.shuffle(seed=42 + self._epoch)
        else:
            self._data.set_epoch(state["data"].get("epoch", 0))
            self._data.load_state_dict(state["data"])
