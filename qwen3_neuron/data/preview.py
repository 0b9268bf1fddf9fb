"""`run.show_data=N`: rank 0's first N packed training samples as text, before paying for a run.

The samples come from the planned config's own dataloader (`config.dataloader.build`, as the
trainer builds it, for data-parallel rank 0 of the planned degree), so what is shown is what
rank 0 trains on: any data kind, torchtitan's registered sets included. In the text, tokens
without a loss are inside ⟦ ⟧, padding is ⟦pad ×N⟧, and a rule opens each document (positions
restart there). The tokens with a loss are the model's targets: for chat, the assistant turns
and their end-of-turn markers; for preference pairs, each response (the rule names it chosen or
rejected, and its pair). The rows are read once, as a validation pass reads them: a preview
longer than the data ends with it, never re-looping (a sample then never holds a conversation
and its copy from the next pass).
"""

from __future__ import annotations

import dataclasses

from torchtitan.components.loss import IGNORE_INDEX

from qwen3_neuron.data.loader import PackedDataLoader
from qwen3_neuron.data.packing import DESIRABLE, SEQUENCE_IDS
from qwen3_neuron.data.prompts import PROMPT

NO_LOSS_OPEN, NO_LOSS_CLOSE = "⟦", "⟧"


def show_samples(config, count: int, dp_world_size: int) -> str:
    """The text of rank 0's first `count` samples (one per sample: batch size 1)."""
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader_config = config.dataloader
    if isinstance(loader_config, PackedDataLoader.Config):
        loader_config = dataclasses.replace(loader_config, infinite=False)
    loader = loader_config.build(
        dp_world_size=dp_world_size, dp_rank=0, tokenizer=tokenizer,
        seq_len=config.training.seq_len, local_batch_size=1,
    )  # fmt: skip
    blocks = []
    for index, (input_dict, labels) in zip(range(count), loader):
        inputs = input_dict["input"][0].tolist()
        positions = input_dict["positions"][0].tolist() if "positions" in input_dict else list(range(len(inputs)))
        if PROMPT in input_dict:  # data=prompts: the prompt, then the padding its completions are generated into
            length = int(input_dict[PROMPT][0])
            positions = [*range(length), *range(len(inputs) - length)]
        sequences = input_dict[SEQUENCE_IDS][0].tolist() if SEQUENCE_IDS in input_dict else None
        desirable = input_dict[DESIRABLE][0].tolist() if DESIRABLE in input_dict else None
        blocks.append(format_sample(index, inputs, labels[0].tolist(), positions, tokenizer, sequences, desirable))
    if len(blocks) < count:
        blocks.append(f"=== rank 0's rows end after {len(blocks)} sample(s) ===")
    openings = [line for line in map(_openings, getattr(loader, "packed_datasets", [])) if line][:1]
    return "\n\n".join([*openings, *blocks])


def _openings(dataset) -> str:
    """How the assistant turns of a chat source open (data.thinking), in one line; "" for text."""
    renderer, thinking = getattr(dataset, "_chat", None), dataset.source.thinking
    if renderer is None or dataset.source.format == "prompts":
        return ""
    if thinking == "as_rendered" or not renderer.opening:
        return f"=== data.thinking={thinking}: assistant turns open as the chat template writes them ==="
    return (f"=== data.thinking={thinking}: every assistant turn opens with {renderer.opening!r}, trained with it "
            "(the chat template writes it for a final turn without reasoning only) ===")


def format_sample(index: int, inputs: list[int], labels: list[int], positions: list[int], tokenizer,
                  sequences: list[int] | None = None, desirable: list[int] | None = None) -> str:  # fmt: skip
    """`sequences`: data=preference's sequence id per label (2k: pair k's chosen, 2k + 1: its rejected;
    trainer=kto, with `desirable`'s marks: unit k's completion, and the mismatched one of its KL estimate)."""
    starts = [i for i, p in enumerate(positions) if p == 0] or [0]
    bounds = list(zip(starts, [*starts[1:], len(inputs)]))
    with_loss = sum(label != IGNORE_INDEX for label in labels)
    pad_id = getattr(tokenizer, "eos_id", None)
    lines, documents, padding = [], 0, 0
    for start, end in bounds:
        doc_inputs, doc_labels = inputs[start:end], labels[start:end]
        if all(label == IGNORE_INDEX for label in doc_labels) and all(t == pad_id for t in doc_inputs) and end == len(inputs):
            padding = end - start
            lines.append(f"{NO_LOSS_OPEN}pad ×{padding}{NO_LOSS_CLOSE}")
            continue
        documents += 1
        ids = {s for s in (sequences or [])[start:end] if s >= 0}
        role = f", pair {min(ids) // 2 + 1} {('chosen', 'rejected')[min(ids) % 2]}" if ids else ""
        if ids and desirable is not None:
            kind = ("KL estimate's mismatched" if min(ids) % 2 else
                    "desirable" if any(desirable[start:end]) else "undesirable")  # fmt: skip
            role = f", unit {min(ids) // 2 + 1} {kind} completion"
        lines.append(f"──── document {documents}{role} (tokens {start}-{end - 1}) ────")
        lines.append(format_document(doc_inputs, doc_labels, tokenizer))
    header = (f"=== sample {index + 1} of rank 0: {documents} document(s), {with_loss} of {len(inputs)} "
              f"tokens with a loss, {padding} padding; {NO_LOSS_OPEN}no loss{NO_LOSS_CLOSE} ===")  # fmt: skip
    return "\n".join([header, *lines])


def format_document(inputs: list[int], labels: list[int], tokenizer) -> str:
    """The document's tokens (its inputs, then its last target), spans without a loss in ⟦ ⟧.
    Input token k is a target when label k-1 is kept; the first token never is."""
    tokens = list(inputs)
    trained = [False] + [label != IGNORE_INDEX for label in labels[:-1]]
    if labels and labels[-1] != IGNORE_INDEX:
        tokens.append(labels[-1])
        trained.append(True)
    pieces, run, run_trained = [], [], None
    for token, flag in zip(tokens, trained):
        if run and flag != run_trained:
            pieces.append(_span(run, run_trained, tokenizer))
            run = []
        run.append(token)
        run_trained = flag
    if run:
        pieces.append(_span(run, run_trained, tokenizer))
    return "".join(pieces)


def _span(tokens: list[int], trained: bool, tokenizer) -> str:
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    return text if trained else f"{NO_LOSS_OPEN}{text}{NO_LOSS_CLOSE}"
