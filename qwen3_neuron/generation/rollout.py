"""Multi-turn rollouts: the policy calls tools between its turns (`grpo.tools`, `grpo.environment`).

A batch is a buffer [B, seq_len] of prompts, as for one turn (`sampling.Sampler`). Every row
samples an assistant turn until its end-of-turn marker; once every row has ended its turn, the
tool calls of the round (`tool_calls.parse_turn`) run at once (`tools.ToolBox.run`), and each row
that called a tool gets its tool turn appended: the tokens the chat template writes after an
assistant turn for those tool messages (the turn closed by <|im_end|>, the tool turn, the next
assistant header), rendered alone as TRL's `_get_tool_suffix_ids` does -- never a re-render of the
conversation, which Qwen3's template would change (it drops earlier <think> blocks). Token in,
token out: the sampled ids stay as sampled, and only they are trained (`Rollouts.trained`).
Then the next turn, up to `grpo.max_tool_calling_iterations` rounds of tools (TRL's name).

`grpo.max_completion_length` counts every token after the prompt, the tools' too (TRL's rule): a
turn cut by it ends its rollout, and so does a tool turn that would leave the model no token of
it (not appended: TRL rolls it back); both are counted as clipped.

Rows' turns and tool answers differ in length, so each row's tokens sit at their own positions
(the static cache's layout, `kv_cache.static_kv_cache`): the prompts' forward, then each forward
feeds each row the tokens it has not fed yet -- its last sampled token, or that token and its
appended tool turn -- written at their positions; a row with nothing to feed writes a padding
token at its next position, overwritten before anything attends to it. Eager, a forward is as wide
as what it feeds and the buffers hold the longest prompt plus max_completion_length columns; on a
compiled model (`compile.enable`) the run's fixed [local_batch_size, seq_len] buffers, the [B, 1]
decode and, for tool turns, [B, APPEND_WIDTH] forwards: one more graph, compiled once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from qwen3_neuron.data.prompts import prompt_tokens
from qwen3_neuron.errors import DataError
from qwen3_neuron.generation.kv_cache import (
    APPEND_WIDTH,
    StaticCache,
    position_mask,
    prefill_width,
    static_kv_cache,
)
from qwen3_neuron.generation.tool_calls import parse_turn
from qwen3_neuron.generation.tools import FAILURES, ToolBox


@dataclass
class Rollouts:
    """One batch's completions: the buffer with prompts and completions, and per row what the
    step trains and reports."""

    ids: torch.Tensor  # [B, S]: prompt, completion (the tools' turns in it), padding
    prompt_lengths: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B] tokens after the prompt, the tools' included
    trained: torch.Tensor  # [B, S] bool: the tokens the policy sampled
    clipped: torch.Tensor  # [B] bool: cut at max_completion_length (or seq_len)
    completions: list[list[dict]] | None = None  # TRL's message lists; None: one turn, decoded by the step
    prompts: list[Any] | None = None  # the prompts as sampled from (an environment's reset text added)
    environments: list[Any] | None = None  # each rollout's environment instance
    tool_counts: torch.Tensor | None = None  # [B, len(count_names(tools))] float32

    @classmethod
    def one_turn(cls, ids, prompt_lengths, lengths, end_id: int) -> Rollouts:
        """`Sampler.sample`'s completions: every token after the prompt is the policy's."""
        columns = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        trained = (columns >= prompt_lengths.unsqueeze(1)) & (columns < (prompt_lengths + lengths).unsqueeze(1))
        last = ids[torch.arange(ids.shape[0], device=ids.device), prompt_lengths + lengths - 1]
        return cls(ids, prompt_lengths, lengths, trained, last != end_id)


def count_names(tools: ToolBox) -> list[str]:
    """The columns of `Rollouts.tool_counts`."""
    return ["calls", *(f"failures/{kind}" for kind in FAILURES), "turns", *(f"calls/{name}" for name in tools.names)]


def tool_metrics(sums: torch.Tensor, completions: int, tools: ToolBox) -> dict[str, float]:
    """TRL's `tools/call_frequency` (calls per completion) and `tools/failure_frequency` (failed
    calls per call), the turns per completion, and counts: the calls, each failure kind's, each tool's."""
    counts = dict(zip(count_names(tools), sums.tolist()))
    calls, failures = counts["calls"], sum(counts[f"failures/{kind}"] for kind in FAILURES)
    metrics = {"tools/call_frequency": calls / completions, "tools/turns_per_completion": counts["turns"] / completions,
               "tools/failure_frequency": failures / calls if calls else 0.0}  # fmt: skip
    return metrics | {f"tools/{name}": value for name, value in counts.items() if name != "turns"}


def tool_turn_text(apply_chat_template, tool_messages: list[dict], end_of_turn: str) -> str:
    """What the chat template writes after an assistant turn's end-of-turn marker for these tool
    messages, up to the next assistant turn's header (TRL's `_get_tool_suffix_ids`, in text).
    Read after the marker of a stand-in assistant turn, not as the difference of two renders:
    Qwen3's template writes an assistant turn differently once messages follow it."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"] or "tool", "arguments": {}}}]
    user = [{"role": "user", "content": "dummy"}]
    header = apply_chat_template(user, add_generation_prompt=True)
    whole = apply_chat_template([*user, {"role": "assistant", "content": "", "tool_calls": calls}, *tool_messages],
                                add_generation_prompt=True)  # fmt: skip
    end = whole.find(end_of_turn, len(header)) if whole.startswith(header) else -1
    if end < 0:
        raise DataError("the chat template does not write a user turn, then an assistant turn closed by "
                        f"{end_of_turn!r}, as it writes a user turn alone, so a tool turn cannot be appended to what "
                        "the model wrote; use a template that does, as Qwen3's does")  # fmt: skip
    return whole[end + len(end_of_turn):]


class Rollout:
    """Samples multi-turn completions of a policy with `tools`. `source`: the data source whose
    prompts (and tools) an environment's reset text is rendered with."""

    def __init__(self, *, tools: ToolBox, tokenizer, source, end_id: int, pad_id: int, end_of_turn: str,
                 max_completion_length: int, max_iterations: int, warpers: list, hf_backend: bool,
                 static_cache: StaticCache | None = None):  # fmt: skip
        self.tools, self.tokenizer, self.source = tools, tokenizer, source
        self.end_id, self.pad_id, self.end_of_turn = end_id, pad_id, end_of_turn
        self.max_completion_length = max_completion_length
        self.max_iterations, self.warpers = max_iterations, warpers
        self.hf_backend, self.static_cache = hf_backend, static_cache
        self.names = count_names(tools)

    @torch.no_grad()
    def sample(self, model, ids: torch.Tensor, prompt_lengths: torch.Tensor, rows: list[dict], generator) -> Rollouts:
        """Roll each row out after its prompt in `ids` (in place; an environment's reset text
        re-renders the prompt there and in `prompt_lengths`)."""
        batch, seq_len = ids.shape
        index = torch.arange(batch, device=ids.device)
        prompts = [row.get(self.source.prompt_field or "prompt") for row in rows]
        environments = None
        if self.tools.environment is not None:
            environments = [self.tools.new_environment() for _ in rows]
            for b, (environment, row) in enumerate(zip(environments, rows)):
                observation = environment.reset(**row)
                if observation:
                    prompts[b] = self._prompted(ids, prompt_lengths, b, row, str(observation))
        budget = (seq_len - prompt_lengths).clamp(max=self.max_completion_length)
        length, turn_start = prompt_lengths.clone(), prompt_lengths.tolist()
        trained = torch.zeros_like(ids, dtype=torch.bool)
        done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        clipped = done.clone()
        completions: list[list[dict]] = [[] for _ in rows]
        counts = torch.zeros(batch, len(self.names))
        with row_forwards(model, self.hf_backend, ids, prompt_lengths, self.static_cache,
                          self.max_completion_length) as (prefill, feed):  # fmt: skip
            logits, fed = prefill(), prompt_lengths.clone()
            for turn in range(self.max_iterations + 1):
                writing = ~done
                while True:  # every row not done samples its turn to its end
                    tokens = self._sampled(ids, logits, generator)
                    at = length[writing]
                    ids[index[writing], at] = tokens[writing]
                    trained[index[writing], at] = True
                    length = length + writing
                    writing &= (tokens != self.end_id) & (length - prompt_lengths < budget)
                    if not writing.any():
                        break
                    logits = feed(fed, torch.where(writing, length, fed))
                    fed = torch.where(writing, length, fed)
                calls = self._turns_ended(ids, length, turn_start, done, clipped, completions, counts, turn)
                appended = self._tool_turns(calls, ids, length, prompt_lengths, budget, turn_start, done, clipped,
                                            completions, counts, environments)  # fmt: skip
                if not appended.any():
                    break
                logits = feed(fed, torch.where(appended, length, fed))  # the end of turn and the tool turn
                fed = torch.where(appended, length, fed)
        return Rollouts(ids, prompt_lengths, length - prompt_lengths, trained, clipped, completions, prompts,
                        environments, counts)  # fmt: skip

    def _turns_ended(self, ids, length, turn_start, done, clipped, completions, counts, turn: int) -> list:
        """Each row's turn as a message; (row, its tool calls) where the rollout goes on to call them."""
        calls = []
        ends = length.tolist()
        for b in (~done).nonzero().flatten().tolist():
            turn_ids = ids[b, turn_start[b]:ends[b]].tolist()
            finished = turn_ids[-1] == self.end_id
            message, turn_calls = parse_turn(self.tokenizer.decode(turn_ids[:-1] if finished else turn_ids))
            completions[b].append(message)
            counts[b, self.names.index("turns")] += 1
            if not finished:
                clipped[b] = done[b] = True
            elif not turn_calls or turn == self.max_iterations:
                done[b] = True
            else:
                calls.append((b, turn_calls))
        return calls

    def _tool_turns(self, calls, ids, length, prompt_lengths, budget, turn_start, done, clipped, completions, counts,
                    environments) -> torch.Tensor:  # fmt: skip
        """One round of the rows' tool calls, answered, and their tool turns appended where they fit."""
        answers = iter(self.tools.run([(call, environments[b] if environments else None)
                                       for b, turn_calls in calls for call in turn_calls]))  # fmt: skip
        appended = torch.zeros_like(done)
        for b, turn_calls in calls:
            results = [next(answers) for _ in turn_calls]
            for result in results:
                counts[b, 0] += 1
                if result.failure:
                    counts[b, self.names.index(f"failures/{result.failure}")] += 1
                elif f"calls/{result.name}" in self.names:
                    counts[b, self.names.index(f"calls/{result.name}")] += 1
            messages = [result.message() for result in results]
            text = tool_turn_text(self.tokenizer.apply_chat_template, messages, self.end_of_turn)
            turn_ids = torch.tensor(self.tokenizer.tokenizer.encode(text).ids, dtype=ids.dtype, device=ids.device)
            start, count = int(length[b]), turn_ids.numel()
            if start - int(prompt_lengths[b]) + count >= int(budget[b]):  # no token left for the model
                clipped[b] = done[b] = True
                continue
            ids[b, start:start + count] = turn_ids
            length[b] += count
            turn_start[b] = start + count
            completions[b] += messages
            appended[b] = True
        return appended

    def _sampled(self, ids: torch.Tensor, logits: torch.Tensor, generator) -> torch.Tensor:
        """One token per row (as `Sampler.sample`): the warpers, then a draw from the generator."""
        for warper in self.warpers:
            logits = warper(ids, logits)
        probabilities = torch.softmax(logits, dim=-1).cpu()
        return torch.multinomial(probabilities, 1, generator=generator).squeeze(1).to(ids.device)

    def _prompted(self, ids, prompt_lengths, b: int, row: dict, observation: str) -> list:
        """Row b's prompt with an environment's reset text appended to its last message, rendered
        into the buffer as the data renders prompts; returns the new prompt."""
        field = self.source.prompt_field or "prompt"
        prompt = list(row[field])
        prompt[-1] = {**prompt[-1], "content": (prompt[-1].get("content") or "") + observation}
        tokens = prompt_tokens(self.tokenizer, {**row, field: prompt}, self.source)
        if len(tokens) >= ids.shape[1]:
            raise DataError(f"grpo.environment: reset() returned {len(observation)} characters, which make a prompt "
                            f"of {len(tokens)} tokens: no room left in training.seq_len={ids.shape[1]}; raise "
                            "training.seq_len or return less")  # fmt: skip
        ids[b] = self.pad_id
        ids[b, :len(tokens)] = torch.tensor(tokens, dtype=ids.dtype)
        prompt_lengths[b] = len(tokens)
        return prompt


@contextmanager
def row_forwards(model, hf_backend: bool, ids: torch.Tensor, prompt_lengths: torch.Tensor,
                 static_cache: StaticCache | None, max_completion_length: int) -> Iterator[tuple]:  # fmt: skip
    """`(prefill, feed)` on a cache of each row's tokens at their positions: `prefill()` the
    prompts' forward, `feed(starts, ends)` one of `ids[b, starts[b]:ends[b]]` per row; each returns
    float32 [B, vocab] scores of every row's next token (a row that fed nothing: unused). Compiled
    (`static_cache`): the run's buffers, prompts in `prefill_widths` columns, appends in
    `APPEND_WIDTH` pieces; eager: buffers of this generation's own, as wide as what is fed."""
    batch, seq_len = ids.shape
    rows, lm_head = torch.arange(batch, device=ids.device), model.lm_head
    if static_cache is not None:
        cache, columns, append = static_cache, seq_len, min(APPEND_WIDTH, seq_len)
    else:  # freed after this generation
        cache, append = StaticCache(None), None
        columns = min(seq_len, int(prompt_lengths.max()) + max_completion_length)
    with static_kv_cache(model, hf_backend, cache, batch, columns) as forward:

        def prefill() -> torch.Tensor:
            longest = int(prompt_lengths.max())
            width = prefill_width(longest, seq_len) if append else longest
            positions = torch.arange(width, device=ids.device).repeat(batch, 1)
            hidden = forward(ids[:, :width], positions, position_mask(positions, columns))
            return lm_head(hidden[rows, prompt_lengths - 1]).float()

        def feed(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
            counts = ends - starts
            widest = int(counts.max())
            width = max(widest, 1) if append is None or widest <= 1 else append
            scores = None
            for first in range(0, max(widest, 1), width):  # compiled: tool turns in [B, append] pieces
                offsets = first + torch.arange(width, device=ids.device)
                positions = (starts.unsqueeze(1) + offsets).clamp(max=columns - 1)
                hidden = forward(ids.gather(1, positions), positions, position_mask(positions, columns))
                last = counts - 1 - first  # each row's last token, where this piece holds it
                piece = lm_head(hidden[rows, last.clamp(0, width - 1)]).float()
                held = ((last >= 0) & (last < width)).unsqueeze(1)
                scores = piece if scores is None else torch.where(held, piece, scores)
            return scores

        yield prefill, feed
