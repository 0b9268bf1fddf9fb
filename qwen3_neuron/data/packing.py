"""Documents -> fixed-length training samples with per-document positions.

A document is its token ids and, per token, whether it is a training target. Within a document,
inputs are tokens[:-1] and labels tokens[1:] (a label is `IGNORE_INDEX` where its token is not a
target), so the last token of one document never predicts the first of the next. Positions
restart at 0 with every document: torchtitan builds the block-causal attention mask from them
(`Decoder.get_attention_masks(positions)`), so document boundaries never depend on scanning the
tokens for EOS, which Qwen3's chat template writes after every turn.

Every sample is exactly `seq_len` (static shapes, as Neuron's compiler needs). How documents are
placed (`data.packing`, for documents kept whole: chat, and text truncated or dropped when too
long):

- `best_fit` (the default): documents wait in a buffer of `data.pack_buffer` of them. Once it is
  full, one sample is filled from it by best-fit decreasing: the longest waiting document, then
  again and again the longest that still fits the space left (the one that leaves the least),
  until none does; the rest of the sample is padding, and what did not fit waits for a later
  sample. The buffer's contents are part of the state: a resume continues with the same samples.
- `greedy`: documents in their order; a sample that cannot take the next one is padded and
  emitted (torchtitan's ChatDataset packs so).
- `none`: one document per sample, padded.

Text with `data.overlong=split` flows instead (`flow`): documents run on into the next sample,
as torchtitan's text data set does, a document continued there starting again at position 0;
no sample is padded but the very last.

The packer places pieces: a piece is one document, or several (their positions each restarting
at 0) that must land in one sample; best fit places a piece by its whole length. A piece may carry
a mark per document on each of its tokens (trainer=kto: which labels are a desirable completion's;
trainer=reward_model: the pair's margin on its chosen sequence), placed with its tokens: its
samples then carry them too, 0 on every other token.

A document longer than `seq_len` is handled before it gets here (`fit`).

trainer=reward_model reads a score at each sequence's last token, so a pair's documents are
`scored_document`s (every token an input, the last one's label the sequence's mark).
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field

from torchtitan.components.loss import IGNORE_INDEX

# (inputs, labels, positions, padding[, marks]): one seq_len sample, how many of its tokens are padding,
# and its pieces' marks when they carry any
Sample = tuple
Piece = tuple[list[int], ...]  # (inputs, labels, positions[, marks]) placed together


def document(tokens: list[int], trained: list[bool]) -> tuple[list[int], list[int]]:
    """(inputs, labels) of one document: next-token pairs inside it, untrained targets ignored."""
    labels = [token if target else IGNORE_INDEX for token, target in zip(tokens[1:], trained[1:])]
    return tokens[:-1], labels


def scored_document(tokens: list[int]) -> tuple[list[int], list[int]]:
    """(inputs, labels) of a sequence scored at its last token (trainer=reward_model): every token
    an input, no label but the last position's, which marks where the score is read."""
    return list(tokens), [IGNORE_INDEX] * (len(tokens) - 1) + [tokens[-1]]


def fit(inputs: list[int], labels: list[int], seq_len: int, overlong: str) -> tuple[list[int], list[int]] | None:
    """A document of at most `seq_len` inputs: itself, its first `seq_len` (truncate), None (drop).
    `split` leaves it whole: the flow layout cuts it into samples."""
    if len(inputs) <= seq_len or overlong == "split":
        return inputs, labels
    if overlong == "truncate":
        return inputs[:seq_len], labels[:seq_len]
    return None


@dataclass
class Packer:
    seq_len: int
    pad_id: int
    packing: str = "best_fit"  # best_fit | greedy | none (data.packing), or flow
    buffer_size: int = 64  # best_fit: documents waiting before a sample is filled from them
    waiting: list[Piece] = field(default_factory=list)  # best_fit: longest first, in arrival order among equals
    # greedy / flow: the sample being filled
    inputs: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    marks: list[int] | None = None  # when the pieces carry marks

    def add(self, inputs: list[int], labels: list[int]) -> list[Sample]:
        """Add one document; return the samples it completed."""
        return self._place((inputs, labels, list(range(len(inputs)))))

    def add_together(self, documents: list[tuple[list[int], list[int]]], marks: list[int] | None = None
                     ) -> list[Sample]:  # fmt: skip
        """Add documents that must land in one sample (a preference pair), each with its own
        positions, and one mark per document for its tokens when given; return the samples completed."""
        inputs = [token for doc_inputs, _ in documents for token in doc_inputs]
        labels = [label for _, doc_labels in documents for label in doc_labels]
        positions = [p for doc_inputs, _ in documents for p in range(len(doc_inputs))]
        if marks is None:
            return self._place((inputs, labels, positions))
        return self._place((inputs, labels, positions, [m for (doc, _), m in zip(documents, marks) for _ in doc]))

    def flush(self) -> list[Sample]:
        """Every sample still to make of what is buffered (end of the data), padded."""
        done = []
        while self.waiting:
            done.append(self._best_fit())
        if not self.inputs:
            return done
        done.append(self._padded(*self._filling()))
        self.inputs, self.labels, self.positions = [], [], []
        self.marks = [] if self.marks is not None else None
        return done

    def waiting_documents(self) -> int:
        """Documents read but not yet (or not wholly) in a sample."""
        return sum(piece[2].count(0) for piece in self.waiting) + self.positions.count(0)  # positions

    def _place(self, piece: Piece) -> list[Sample]:
        if len(piece[0]) > self.seq_len and self.packing in ("best_fit", "none"):
            # a piece no sample can hold would wait in the buffer for ever (or make an overlong sample)
            raise ValueError(f"a document of {len(piece[0])} tokens does not fit a {self.seq_len}-token sample: "
                             "cut it first (`fit`, `fit_pair`)")  # fmt: skip
        if self.packing == "best_fit":
            insort(self.waiting, piece, key=lambda p: -len(p[0]))
            return [self._best_fit()] if len(self.waiting) >= self.buffer_size else []
        if self.packing == "none":
            return [self._padded(*piece)]
        overflows = self.inputs and len(self.inputs) + len(piece[0]) > self.seq_len
        done = self.flush() if self.packing == "greedy" and overflows else []
        self.inputs += piece[0]
        self.labels += piece[1]
        self.positions += piece[2]
        if len(piece) > 3:
            self.marks = self.marks if self.marks is not None else []
            self.marks += piece[3]
        while len(self.inputs) >= self.seq_len:
            done.append(self._take(self.seq_len))
        return done

    def _best_fit(self) -> Sample:
        """One sample from the waiting pieces, longest first, each that still fits (the buffer is
        sorted longest first, so the first that fits is the best fit of the space left)."""
        space, chosen, left = self.seq_len, [], []
        for piece in self.waiting:
            if len(piece[0]) <= space:
                chosen.append(piece)
                space -= len(piece[0])
            else:
                left.append(piece)
        self.waiting = left
        width = max((len(piece) for piece in chosen), default=3)
        return self._padded(*([token for piece in chosen for token in piece[i]] for i in range(width)))

    def _padded(self, inputs: list[int], labels: list[int], positions: list[int], marks: list[int] | None = None
                ) -> Sample:  # fmt: skip
        pad = self.seq_len - len(inputs)
        # the padding is a document of its own: real tokens never attend to it
        sample = (inputs + [self.pad_id] * pad, labels + [IGNORE_INDEX] * pad, positions + list(range(pad)), pad)
        return sample if marks is None else (*sample, marks + [0] * pad)

    def _filling(self) -> Piece:
        return (self.inputs, self.labels, self.positions) + ((self.marks,) if self.marks is not None else ())

    def _take(self, n: int) -> Sample:
        sample = (self.inputs[:n], self.labels[:n], _restart(self.positions[:n]), 0)
        if self.marks is not None:
            sample, self.marks = (*sample, self.marks[:n]), self.marks[n:]
        self.inputs, self.labels = self.inputs[n:], self.labels[n:]
        self.positions = _restart(self.positions[n:])
        return sample

    def state_dict(self) -> dict:
        # copies: the lists grow in place after the state is taken (waiting pieces never change)
        return {"waiting": list(self.waiting), "inputs": list(self.inputs), "labels": list(self.labels),
                "positions": list(self.positions),
                "marks": None if self.marks is None else list(self.marks)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.waiting = [tuple(piece) for piece in state["waiting"]]
        self.inputs, self.labels, self.positions = list(state["inputs"]), list(state["labels"]), list(state["positions"])
        self.marks = None if state.get("marks") is None else list(state["marks"])


def fit_pair(documents: list[tuple[list[int], list[int]]], seq_len: int) -> list[tuple[list[int], list[int]]] | None:
    """Two documents cut to fit one `seq_len` sample together: the shorter keeps up to half of it,
    the longer the rest; None when either is left without a token to learn from."""
    (short, long_) = sorted(range(2), key=lambda i: len(documents[i][0]))
    keep = {short: min(len(documents[short][0]), seq_len // 2)}
    keep[long_] = seq_len - keep[short]
    fitted = [(inputs[: keep[i]], labels[: keep[i]]) for i, (inputs, labels) in enumerate(documents)]
    if any(all(label == IGNORE_INDEX for label in labels) for _, labels in fitted):
        return None
    return fitted


SEQUENCE_IDS = "sequence_ids"  # the input_dict key carrying each label's sequence id (data=preference)
DESIRABLE = "desirable"  # trainer=kto: the input_dict key marking the labels of desirable completions (1)
MARGINS = "margins"  # the input_dict key of trainer=reward_model's per-token values: each pair's margin


def sequence_ids(labels: list[int], positions: list[int]) -> list[int]:
    """Per label: which sequence of the sample it belongs to, -1 without a loss. A sample holds
    whole pairs in order, chosen before rejected, then padding (no labels): the k-th document
    with labels is sequence k (pair k // 2; chosen when k is even)."""
    ids, sequence, counted = [], -1, False
    for label, position in zip(labels, positions):
        counted = counted and position != 0  # a new document starts uncounted
        if label != IGNORE_INDEX and not counted:
            sequence, counted = sequence + 1, True
        ids.append(sequence if label != IGNORE_INDEX else -1)
    return ids


def _restart(positions: list[int]) -> list[int]:
    """A document cut at a sample boundary continues from position 0 in the next sample."""
    if not positions or positions[0] == 0:
        return positions
    offset, out = positions[0], list(positions)
    for i, p in enumerate(out):
        if p == 0 and i > 0:
            break
        out[i] = p - offset
    return out
