"""A worked example of your own GRPO reward functions: copy this file and edit.

    python launch.py experiment=cpu_qwen3_tiny_grpo grpo.rewards='[examples.my_rewards.digit_share]'

A reward function gets TRL's arguments by keyword: `prompts` (each completion's prompt, as the
row holds it), `completions` (a string, or for a message-list prompt a list holding one assistant
message), `completion_ids` (its token ids) and every other column of the row, by its name, one
entry per completion. It returns one float per completion, or None where it does not apply.
Take `**kwargs` so that columns you do not read are accepted.
"""

from __future__ import annotations

from qwen3_neuron.rewards import completion_text


def digit_share(completions, **kwargs) -> list[float]:
    """The share of a reply's non-space characters that are digits (0 for an empty reply)."""
    rewards = []
    for completion in completions:
        characters = [c for c in completion_text(completion) if not c.isspace()]
        rewards.append(sum(c.isdigit() for c in characters) / len(characters) if characters else 0.0)
    return rewards


def ends_with_word(completions, end_word, **kwargs) -> list[float | None]:
    """1 when the reply's last word is the row's `end_word` column (punctuation aside), else 0."""
    rewards = []
    for completion, word in zip(completions, end_word):
        words = completion_text(completion).split()
        rewards.append(None if word is None else float(bool(words) and words[-1].strip(".!?,;:") == word))
    return rewards
