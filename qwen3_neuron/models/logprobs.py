"""Per-token log-probabilities of a decoder, through its `lm_head` one sequence chunk at a time.

At Qwen3's 151,936-token vocabulary the [batch, seq, vocab] float32 logits, not the layers,
decide whether a step fits (seq_len 4096: 2.5 GB a sample). The model runs with
`_skip_lm_head` (hidden states out, as torchtitan's `ChunkedLossWrapper` runs it for the SFT
loss); each chunk then goes through `lm_head`, float32 log-softmax and the label gather. With
gradients on, a chunk is checkpointed: its logits are recomputed in the backward instead of
kept, so at most one chunk's [batch, seq / chunks, vocab] logits are alive at a time, forward
and backward. Used for every objective that needs a token's log-probability (DPO's policy and
reference, GRPO's), on model=native and model=hf alike (both honour `_skip_lm_head`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint
from torchtitan.components.loss import IGNORE_INDEX

DEFAULT_CHUNKS = 8  # as torchtitan's ChunkedLossWrapper


@contextmanager
def hidden_states_out(model: torch.nn.Module):
    """The model's forward returns its final hidden states [B, S, D] (after the last norm)."""
    skipped = model._skip_lm_head
    model._skip_lm_head = True
    try:
        yield model.lm_head
    finally:
        model._skip_lm_head = skipped


def model_token_logps(
    model, inputs, labels, extra_kwargs, num_chunks: int = DEFAULT_CHUNKS, temperature: float = 1.0
) -> torch.Tensor:
    """log p(label) at every position of `inputs` under `model` (float32 [B, S], 0 where the
    label is IGNORE_INDEX), never holding more than one chunk's logits; `temperature` divides the
    logits first (GRPO's: the distribution its completions were sampled from, as TRL's)."""
    with hidden_states_out(model) as lm_head:
        hidden = model(inputs, **extra_kwargs)
    return chunked_token_logps(hidden, lm_head, labels, num_chunks, temperature)


def chunked_token_logps(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    labels: torch.Tensor,
    num_chunks: int = DEFAULT_CHUNKS,
    temperature: float = 1.0,
) -> torch.Tensor:
    """`token_logps(lm_head(hidden), labels, temperature)`, a sequence chunk at a time."""
    size = -(-hidden.shape[1] // num_chunks)
    pieces = []
    for hidden_chunk, label_chunk in zip(hidden.split(size, dim=1), labels.split(size, dim=1)):
        if torch.is_grad_enabled() and hidden_chunk.requires_grad:
            pieces.append(checkpoint(_head_logps, lm_head, hidden_chunk, label_chunk, temperature,
                                     use_reentrant=False))  # fmt: skip
        else:
            pieces.append(_head_logps(lm_head, hidden_chunk, label_chunk, temperature))
    return torch.cat(pieces, dim=1)


def token_logps(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(label) per position (float32) of softmax(logits / temperature), 0 where the label is
    IGNORE_INDEX. [B, S]"""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    logps = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return logps.masked_fill(labels == IGNORE_INDEX, 0.0)


def _head_logps(
    lm_head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    return token_logps(lm_head(hidden), labels, temperature)
