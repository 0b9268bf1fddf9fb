"""General reward functions for GRPO (`grpo.rewards=[qwen3_neuron.rewards.exact_answer, ...]`).

Each takes TRL's arguments (`prompts`, `completions`, `completion_ids`, and the row's other
columns as keywords) and returns one float per completion, or None where it does not apply.
Copy examples/my_rewards.py to write your own.
"""

from __future__ import annotations

import re
from typing import Any

from qwen3_neuron.generation.tool_calls import is_tool_error

NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def completion_text(completion: Any) -> str:
    """The text of a completion: itself, or the content of its last message."""
    if isinstance(completion, str):
        return completion
    return completion[-1].get("content") or ""


def final_answer(text: str) -> str:
    """The answer a reply states last: the last \\boxed{...}, else its last number, else its last line."""
    boxed = BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = NUMBER.findall(text)
    if numbers:
        return numbers[-1]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _normal(answer: Any) -> str:
    text = str(answer).strip().rstrip(".").lower()
    return text.replace(",", "") if NUMBER.fullmatch(text) else text


def exact_answer(completions, answer, **kwargs) -> list[float | None]:
    """1 when the reply's final answer (`final_answer`) equals the row's `answer` column
    (numbers compared without thousands separators, text without case), else 0; None where the
    row has no answer."""
    return [None if expected is None else float(_normal(final_answer(completion_text(c))) == _normal(expected))
            for c, expected in zip(completions, answer)]  # fmt: skip


def matches_format(completions, format_pattern, **kwargs) -> list[float | None]:
    """1 when the whole reply matches the row's `format_pattern` regex (re.fullmatch, DOTALL),
    else 0; None where the row has no pattern."""
    return [None if pattern is None else float(re.fullmatch(pattern, completion_text(c), re.DOTALL) is not None)
            for c, pattern in zip(completions, format_pattern)]  # fmt: skip


def tool_success(completions, **kwargs) -> list[float]:
    """The share of a completion's tool calls that answered: its tool turns that are not TRL's
    `{'error': ...}` (a malformed call, an unknown tool, wrong arguments, a raise, a timeout);
    0 for a completion that called none (grpo.tools / grpo.environment runs)."""
    rewards = []
    for completion in completions:
        answers = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role") == "tool"]
        rewards.append(sum(not is_tool_error(a) for a in answers) / len(answers) if answers else 0.0)
    return rewards


def length_penalty(completion_ids, **kwargs) -> list[float]:
    """Minus the completion's length in thousands of tokens: weight it to prefer short replies."""
    return [-len(ids) / 1000.0 for ids in completion_ids]
