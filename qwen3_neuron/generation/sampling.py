"""Sampling completions after prompts, one token a forward on a KV cache (`generation.kv_cache`).

A batch is a buffer [B, seq_len] holding each row's prompt (right-padded); `Sampler.sample` writes
each row's completion after its prompt, in place. Sampling is TRL's: temperature, then top-p
(Transformers' own logits warpers), from a generator the caller seeds. A completion ends at the
end-of-turn token (kept in it) or at `max_completion_length`, or where seq_len leaves no room; the
batch stops once every row has ended, as `generate()` does (no forward for padding alone).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from qwen3_neuron.generation.kv_cache import (
    StaticCache,
    attention_mask,
    kv_cache,
    position_mask,
    prefill_width,
    static_kv_cache,
)
from qwen3_neuron.models.logprobs import hidden_states_out


class Sampler:
    """Samples completions of a policy. `static_cache` (a compiled model, Neuron's one compile):
    fixed-shape buffers and graphs; else an eager KV cache. `one_shape` (the tests' reference): a
    forward of the whole buffer per token, with `model_inputs(ids)` its keyword inputs."""

    def __init__(self, *, end_id: int, pad_id: int, max_completion_length: int, warpers: list, hf_backend: bool,
                 static_cache: StaticCache | None = None, one_shape: bool = False,
                 model_inputs: Callable[[torch.Tensor], dict] | None = None):  # fmt: skip
        self.end_id, self.pad_id, self.max_completion_length = end_id, pad_id, max_completion_length
        self.warpers, self.hf_backend, self.static_cache = warpers, hf_backend, static_cache
        self.one_shape, self.model_inputs = one_shape, model_inputs

    def sample(self, model, ids: torch.Tensor, prompt_lengths: torch.Tensor, generator) -> torch.Tensor:
        """Write each row's completion after its prompt in `ids` (in place); its length, end-of-turn included."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        ended = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        # the plan checked that its first rows leave max_completion_length; a longer prompt further
        # on gets the room seq_len leaves it, and its completion is cut there (counted as clipped)
        room = ids.shape[1] - prompt_lengths
        lengths = room.clamp(max=self.max_completion_length)
        tokens = None
        with self.next_token_logits(model, ids, prompt_lengths) as next_token_logits:
            for t in range(self.max_completion_length):
                scores = next_token_logits(t, tokens)
                for warper in self.warpers:
                    scores = warper(ids, scores)
                probabilities = torch.softmax(scores, dim=-1).cpu()
                tokens = torch.multinomial(probabilities, 1, generator=generator).squeeze(1).to(ids.device)
                tokens = torch.where(ended, self.pad_id, tokens)
                inside = t < room
                ids[rows[inside], (prompt_lengths + t)[inside]] = tokens[inside]
                newly = (tokens == self.end_id) & ~ended & inside
                lengths = torch.where(newly, t + 1, lengths)
                ended |= newly
                if bool((ended | (room <= t + 1)).all()):  # every row has ended or filled its room
                    break
        return lengths

    @contextmanager
    def next_token_logits(self, model, ids: torch.Tensor, prompt_lengths: torch.Tensor):
        """`logits(t, tokens)`: float32 [B, vocab] scores of every row's next token once t tokens
        are sampled, `tokens` [B] the last of them: the prompts' forward, then one forward of
        `tokens` alone on the KV cache (`generation.kv_cache`; compiled: the static cache, its
        shapes fixed). `one_shape` (the tests' reference): a forward of the whole buffer (in which
        `_sample` wrote the tokens) each time."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        lm_head = model.lm_head
        last_position = ids.shape[1] - 1
        if self.static_cache is not None:
            with static_kv_cache(model, self.hf_backend, self.static_cache, *ids.shape) as forward:

                def static(t: int, tokens) -> torch.Tensor:
                    if t == 0:  # the buffer's first columns, each row's prompt at its own
                        width = prefill_width(int(prompt_lengths.max()), ids.shape[1])
                        positions = torch.arange(width, device=ids.device).repeat(ids.shape[0], 1)
                        hidden = forward(ids[:, :width], positions, position_mask(positions, ids.shape[1]))
                        return lm_head(hidden[rows, prompt_lengths - 1]).float()
                    # a row past its room (its completion cut at seq_len) writes seq_len's last column, unused
                    positions = (prompt_lengths + t - 1).clamp(max=last_position).unsqueeze(1)
                    hidden = forward(tokens.unsqueeze(1), positions, position_mask(positions, ids.shape[1]))
                    return lm_head(hidden[:, 0]).float()

                yield static
            return
        if self.one_shape:
            extra_kwargs = self.model_inputs(ids)

            def whole_buffer(t: int, tokens) -> torch.Tensor:
                with hidden_states_out(model):
                    hidden = model(ids, **extra_kwargs)
                return lm_head(hidden[rows, (prompt_lengths + t - 1).clamp(max=ids.shape[1] - 1)]).float()

            yield whole_buffer
            return
        width = int(prompt_lengths.max())
        with kv_cache(model, self.hf_backend, width + self.max_completion_length) as forward:

            def cached(t: int, tokens) -> torch.Tensor:
                if t == 0:
                    positions = torch.arange(width, device=ids.device).repeat(ids.shape[0], 1)
                    hidden = forward(ids[:, :width], positions, attention_mask(prompt_lengths, width, 0, width))
                    return lm_head(hidden[rows, prompt_lengths - 1]).float()
                # a row past its room (its completion cut at seq_len) goes on at seq_len's last position, unused
                positions = (prompt_lengths + t - 1).clamp(max=last_position).unsqueeze(1)
                hidden = forward(tokens.unsqueeze(1), positions, attention_mask(prompt_lengths, width, width + t - 1, 1))
                return lm_head(hidden[:, 0]).float()

            yield cached


def logits_warpers(temperature: float, top_p: float) -> list:
    """Transformers' own warpers for sampling's temperature, then top-p; none at 1.0 and 1.0."""
    # imported here: transformers costs every worker of a run without GRPO a second of start-up
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    return warpers + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
