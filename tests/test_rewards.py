"""GRPO's reward functions: loaded by name, called as TRL calls them, their failures named."""

from __future__ import annotations

import math

import pytest

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.rewards.calls import RewardError, Rewards, load_rewards
from qwen3_neuron.rewards import exact_answer, final_answer, length_penalty, matches_format


def _seen(prompts, completions, completion_ids, answer, **kwargs):
    """Records how it was called; None for the second completion."""
    _seen.calls.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                        "answer": answer, **kwargs})  # fmt: skip
    return [1.5, None, 0.0][: len(completions)]


_seen.calls = []


def _raises_on_b(completions, **kwargs):
    if any("b" in c for c in completions):
        raise KeyError("b")
    return [1.0] * len(completions)


def _number(text: str) -> float:
    return float(text)


def _through_a_helper(completions, **kwargs):
    return [_number(c) for c in completions]


def _too_few(completions, **kwargs):
    return [1.0]


def _text(completions, **kwargs):
    return ["high"] * len(completions)


def test_rewards_are_called_as_trl_calls_them_none_is_nan():
    rewards = load_rewards([f"{__name__}._seen", "qwen3_neuron.rewards.length_penalty"], [1.0, 2.0])
    scores = rewards.score(["p", "p", "q"], ["a", "b", "c"], [[1], [2, 3], [4]],
                           {"answer": ["x", "y", "z"], "level": [1, 2, 3]})  # fmt: skip
    assert _seen.calls[-1] == {"prompts": ["p", "p", "q"], "completions": ["a", "b", "c"],
                               "completion_ids": [[1], [2, 3], [4]], "answer": ["x", "y", "z"], "level": [1, 2, 3]}  # fmt: skip
    assert scores[0].tolist() == [1.5, pytest.approx(-0.001)]
    assert math.isnan(scores[1, 0]) and scores[1, 1] == pytest.approx(-0.002)
    assert rewards.weights == [1.0, 2.0]


def test_a_failing_reward_stops_naming_itself_and_the_completion():
    with pytest.raises(RewardError) as raised:  # the line of its own that raised, not the project's
        load_rewards([f"{__name__}._raises_on_b"], None).score(["p", "q"], ["a", "b"], [[1], [2]], {})
    line = _raises_on_b.__code__.co_firstlineno + 2
    assert str(raised.value) == (f"reward test_rewards._raises_on_b raised KeyError: 'b' at {__file__}, line {line}: "
                                 "raise KeyError(\"b\") on completion 1 (prompt 'q', completion 'b')")
    with pytest.raises(RewardError) as raised:  # inside a helper of the user's file: the helper's line
        load_rewards([f"{__name__}._through_a_helper"], None).score(["p", "q"], ["1", "b"], [[1], [2]], {})
    line = _number.__code__.co_firstlineno + 1
    assert str(raised.value).startswith(f"reward test_rewards._through_a_helper raised ValueError: could not convert "
                                        f"string to float: 'b' at {__file__}, line {line}: return float(text) on "
                                        "completion 1")  # fmt: skip
    with pytest.raises(RewardError, match=r"^reward test_rewards._too_few returned 1 rewards for 2 completions"):
        load_rewards([f"{__name__}._too_few"], None).score(["p", "q"], ["a", "b"], [[1], [2]], {})
    with pytest.raises(RewardError, match=r"^reward test_rewards._text returned 'high' for completion 0 "
                                          r"\(prompt 'p', completion 'a'\): a reward is a finite number or None\.$"):  # fmt: skip
        load_rewards([f"{__name__}._text"], None).score(["p"], ["a"], [[1]], {})


@pytest.mark.parametrize("names, weights, message", [
    (["nowhere_module.f"], None, r"^grpo.rewards\[0\]: 'nowhere_module.f': module 'nowhere_module' cannot be imported"),
    (["qwen3_neuron.rewards.nothing"], None, r"^grpo.rewards\[0\]: 'qwen3_neuron.rewards.nothing': module "
                                             r"'qwen3_neuron.rewards' has no 'nothing'\.$"),
    (["qwen3_neuron.rewards.exact_answr"], None, r"^grpo.rewards\[0\]: 'qwen3_neuron.rewards.exact_answr': module "
                                                 r"'qwen3_neuron.rewards' has no 'exact_answr'\. Did you mean "
                                                 r"'qwen3_neuron.rewards.exact_answer'\?$"),
    (["qwen3_neuron.rewards.NUMBER"], None, r"^grpo.rewards\[0\]: 'qwen3_neuron.rewards.NUMBER' is a Pattern, not a function\.$"),
    (["exact_answer"], None, r"^grpo.rewards\[0\]: 'exact_answer' is not module.function"),
    (["qwen3_neuron.rewards.exact_answer"], [1.0, 2.0], r"^grpo.reward_weights has 2 weights for 1 rewards"),
    ([], None, r"^grpo.rewards is empty"),
])  # fmt: skip
def test_a_reward_that_cannot_be_used_is_named_before_anything_runs(names, weights, message):
    with pytest.raises(ConfigError, match=message):
        load_rewards(names, weights)


def test_the_shipped_rewards():
    replies = [[{"role": "assistant", "content": "So it is 1,234."}], "The answer: \\boxed{42}", "Paris.", "7", "x"]
    assert final_answer("a 1 then 2 and\nthen 3.5 end") == "3.5"
    assert exact_answer(replies, ["1234", "42", "paris", "8", None]) == [1.0, 1.0, 1.0, 0.0, None]
    assert matches_format(["<think>a</think> b", "b", "c"], [r"<think>.*</think>.+", r"<think>.*</think>.+", None]) == [1.0, 0.0, None]
    assert length_penalty(completion_ids=[[1] * 10, []]) == [-0.01, -0.0]


@pytest.mark.parametrize("reply, answer, reward", [
    ("So the result is -3.", "-3", 1.0), ("So the result is 3.", "-3", 0.0), ("It is -3 degrees.", "3", 0.0),
    ("It costs 2.5 dollars.", "2.5", 1.0), ("It costs 2.5 dollars.", "25", 0.0), ("It is -0.75", "-0.75", 1.0),
    ("Total: 1,234", "1234", 1.0), ("First 7, then \\boxed{-12}, not 4", "-12", 1.0), ("\\boxed{ 42 }.", 42, 1.0),
    ("\\boxed{12} but -12", "-12", 0.0),
])  # fmt: skip
def test_exact_answer_reads_signed_decimal_and_boxed_answers(reply, answer, reward):
    assert exact_answer([reply], [answer]) == [reward]


def test_the_columns_a_reward_reads_are_checked_against_the_rows_before_anything_runs():
    def reads_answer(prompts, completions, answer, **kwargs):
        return [1.0 for _ in completions]

    def no_kwargs(prompts, completions, completion_ids, answer):
        return [1.0 for _ in completions]

    both = Rewards(["m.reads_answer", "m.no_kwargs"], [reads_answer, no_kwargs], [1.0, 1.0])
    both.check_columns({"answer"}, "rows.jsonl")  # what each reads is there, nothing else is handed over
    with pytest.raises(ConfigError) as missing:
        both.check_columns({"solution"}, "rows.jsonl")
    assert str(missing.value) == (
        "grpo.rewards[0]: m.reads_answer reads the column 'answer' of each row, which the first rows of rows.jsonl "
        "lack (their columns besides the prompt: solution). Add it to the rows, or choose a reward that reads the "
        "columns they have."
    )
    with pytest.raises(ConfigError) as unexpected:
        both.check_columns({"answer", "source"}, "rows.jsonl")
    assert str(unexpected.value) == (
        "grpo.rewards[1]: m.no_kwargs takes no **kwargs, but every column of the row is handed to it as TRL does "
        "(source too): add **kwargs to its parameters."
    )
