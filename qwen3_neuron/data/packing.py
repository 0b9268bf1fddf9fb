"""Documents -> fixed-length training samples with per-document positions.

A document is its token ids and, per token, whether it is a training target. Within a document,
inputs are tokens[:-1] and labels tokens[1:] (a label is `IGNORE_INDEX` where its token is not a
target), so the last token of one document never predicts the first of the next. Positions
restart at 0 with every document: torchtitan builds the block-causal attention mask from them
(`Decoder.get_attention_masks(positions)`), so document boundaries never depend on scanning the
tokens for EOS, which Qwen3's chat template writes after every turn.

Two layouts, both exactly `seq_len` per sample (static shapes, as Neuron's compiler needs):

- `pad`: a document never crosses a sample; a sample that cannot take the next document is
  padded (pad id, no labels, its own positions) and emitted. Chat, and text that is truncated or
  dropped when too long.
- `flow`: documents run on into the next sample, as torchtitan's text data set does; a document
  continued there starts again at position 0. Pretraining text (`data.overlong=split`).

A document longer than `seq_len` is handled before it gets here (`fit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.components.loss import IGNORE_INDEX

OVERLONG = ("truncate", "drop", "split")


def document(tokens: list[int], trained: list[bool]) -> tuple[list[int], list[int]]:
    """(inputs, labels) of one document: next-token pairs inside it, untrained targets ignored."""
    labels = [token if target else IGNORE_INDEX for token, target in zip(tokens[1:], trained[1:])]
    return tokens[:-1], labels


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
    layout: str = "pad"  # "pad" | "flow"
    inputs: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    padding: int = 0  # pad tokens written so far

    def add(self, inputs: list[int], labels: list[int]) -> list[tuple[list[int], list[int], list[int]]]:
        """Add one document; return the samples it completed, (inputs, labels, positions) each."""
        done = []
        if self.layout == "pad" and self.inputs and len(self.inputs) + len(inputs) > self.seq_len:
            done.append(self._padded())
        self.inputs += inputs
        self.labels += labels
        self.positions += range(len(inputs))
        while len(self.inputs) >= self.seq_len:
            done.append(self._take(self.seq_len))
        return done

    def flush(self) -> list[tuple[list[int], list[int], list[int]]]:
        """The last, padded sample of what is buffered (end of the data)."""
        return [self._padded()] if self.inputs else []

    def _padded(self):
        pad = self.seq_len - len(self.inputs)
        self.padding += pad
        self.inputs += [self.pad_id] * pad
        self.labels += [IGNORE_INDEX] * pad
        self.positions += range(pad)  # a document of its own: real tokens never attend to padding
        return self._take(self.seq_len)

    def _take(self, n: int):
        sample = (self.inputs[:n], self.labels[:n], _restart(self.positions[:n]))
        self.inputs, self.labels = self.inputs[n:], self.labels[n:]
        self.positions = _restart(self.positions[n:])
        return sample

    def state_dict(self) -> dict:
        # copies: the buffers grow in place after the state is taken
        return {"inputs": list(self.inputs), "labels": list(self.labels), "positions": list(self.positions),
                "padding": self.padding}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.inputs, self.labels, self.positions = list(state["inputs"]), list(state["labels"]), list(state["positions"])
        self.padding = state["padding"]


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
