"""GRPO's reward functions: `grpo.rewards=[module.function, ...]`, plain Python, called as TRL calls them
(an entry that is a directory: a reward model, `sequence_classifier`).

Each is called once per batch of completions as
    fn(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float | None]
one entry per completion: `prompts` the row's prompt as the data set holds it (a message list or
a string), `completions` the decoded completion (for a message-list prompt, a list holding one
assistant message, as TRL hands it), `completion_ids` its token ids, and every other column of
the row as a keyword of the same length (a column `answer` arrives as `answer=[...]`). A None
means "does not apply to this completion": it is left out of the weighted sum (TRL's nan-sum),
and a completion no function applies to gets no advantage. So a TRL reward function works here
unchanged.

A function that raises, returns the wrong number of rewards or a value that is not a number
stops the run with a sentence naming it, the line of its own that raised, and the completion
(and its prompt): a `Reward error`, the user's to fix, said once on the console (exit code 2).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qwen3_neuron.errors import ConfigError, RewardError
from qwen3_neuron.rewards.sequence_classifier import RewardModel


# what every call hands besides the columns (`environments`: with grpo.environment, checked by the plan)
TRL_ARGUMENTS = {"prompts", "completions", "completion_ids", "environments"}


def load_reward(name: str, key: str = "grpo.rewards", device=None) -> Callable:
    """`module.function` -> the function, a directory -> its reward model (`sequence_classifier`,
    run on `device`); a ConfigError says why it cannot be."""
    if Path(name).expanduser().is_dir():
        return RewardModel(Path(name).expanduser(), key, device)
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        raise ConfigError(f"{key}: {name!r} is not module.function (e.g. qwen3_neuron.rewards.exact_answer).")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key}: {name!r}: module {module_name!r} cannot be imported ({e}); put it on "
                          "PYTHONPATH or next to launch.py.") from e  # fmt: skip
    function = getattr(module, attribute, None)
    if function is None:
        functions = [n for n, value in vars(module).items() if callable(value) and not n.startswith("_")]
        close = difflib.get_close_matches(attribute, functions, n=1)
        hint = f" Did you mean '{module_name}.{close[0]}'?" if close else ""
        raise ConfigError(f"{key}: {name!r}: module {module_name!r} has no {attribute!r}.{hint}")
    if not callable(function):
        raise ConfigError(f"{key}: {name!r} is a {type(function).__name__}, not a function.")
    return function


@dataclass
class Rewards:
    names: list[str]
    functions: list[Callable]
    weights: list[float]

    def score(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[list[int]],
        columns: dict[str, Sequence[Any]],
    ) -> torch.Tensor:  # fmt: skip
        """[N, F] float32 rewards of N completions by each function, NaN where it returned None."""
        scores = torch.empty(len(completions), len(self.functions), dtype=torch.float32)
        for index, (name, function) in enumerate(zip(self.names, self.functions)):
            scores[:, index] = torch.tensor(
                _call(name, function, prompts, completions, completion_ids, columns), dtype=torch.float32
            )
        return scores

    def check_columns(self, columns: set[str], source: str) -> None:
        """Before anything starts: every column a function requires is one the rows hold, and a
        function without **kwargs accepts every column it will be handed (TRL hands them all)."""
        for index, (name, function) in enumerate(zip(self.names, self.functions)):
            parameters = inspect.signature(function).parameters.values()
            required = [p.name for p in parameters if p.default is p.empty and p.name not in TRL_ARGUMENTS
                        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
            missing = [column for column in required if column not in columns]
            if missing:
                raise ConfigError(
                    f"grpo.rewards[{index}]: {name} reads the column {', '.join(map(repr, missing))} of each row, "
                    f"which the first rows of {source} lack (their columns besides the prompt: "
                    f"{', '.join(sorted(columns)) or 'none'}). Add it to the rows, or choose a reward that reads "
                    "the columns they have."
                )
            if not any(p.kind is p.VAR_KEYWORD for p in parameters):
                unexpected = sorted(columns - TRL_ARGUMENTS - {p.name for p in parameters})
                if unexpected:
                    raise ConfigError(
                        f"grpo.rewards[{index}]: {name} takes no **kwargs, but every column of the row is "
                        f"handed to it as TRL does ({', '.join(unexpected)} too): add **kwargs to its parameters."
                    )


def load_rewards(names: Sequence[str], weights: Sequence[float] | None, device=None) -> Rewards:
    """The `grpo.rewards` functions and their weights (1 each when none are given); reward models
    score on `device`."""
    if not names:
        raise ConfigError("grpo.rewards is empty: name at least one module.function (e.g. "
                          "grpo.rewards=[qwen3_neuron.rewards.exact_answer]).")  # fmt: skip
    functions = [load_reward(name, f"grpo.rewards[{i}]", device) for i, name in enumerate(names)]
    if weights is None:
        weights = [1.0] * len(names)
    elif len(weights) != len(names):
        raise ConfigError(f"grpo.reward_weights has {len(weights)} weights for {len(names)} rewards "
                          f"({', '.join(names)}): give one per reward, or none (1 each).")  # fmt: skip
    return Rewards(list(names), functions, [float(w) for w in weights])


def _call(name, function, prompts, completions, completion_ids, columns) -> list[float]:
    count = len(completions)
    try:
        values = list(function(prompts=list(prompts), completions=list(completions),
                               completion_ids=list(completion_ids), **columns))  # fmt: skip
    except Exception as e:
        row = _first_failing_row(function, prompts, completions, completion_ids, columns)
        where = f" on completion {row} (prompt {_short(prompts[row])}, completion {_short(completions[row])})" if row is not None else ""
        raise RewardError(f"reward {name} raised {type(e).__name__}: {e}{_own_line(function, e)}{where}") from e
    if len(values) != count:
        raise RewardError(f"reward {name} returned {len(values)} rewards for {count} completions: it must return "
                          "one per completion (None where it does not apply).")  # fmt: skip
    rewards = []
    for row, value in enumerate(values):
        if value is None:
            rewards.append(math.nan)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            rewards.append(float(value))
        else:
            raise RewardError(f"reward {name} returned {value!r} for completion {row} (prompt {_short(prompts[row])}, "
                              f"completion {_short(completions[row])}): a reward is a finite number or None.")  # fmt: skip
    return rewards


def _own_line(function: Callable, error: Exception) -> str:
    """Where the function's own file raised (the innermost such frame: the user's line, not a
    library's it called), as " at FILE, line N: CODE"; "" when none of its frames is there."""
    try:
        source = inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:  # a callable object (a reward model dir): no source of its own
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == source]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {frame.filename}, line {frame.lineno}" + (f": {frame.line.strip()}" if frame.line else "")


def _first_failing_row(function, prompts, completions, completion_ids, columns) -> int | None:
    """The first completion the function raises on when called on it alone."""
    for row in range(len(completions)):
        try:
            function(prompts=[prompts[row]], completions=[completions[row]], completion_ids=[completion_ids[row]],
                     **{key: [values[row]] for key, values in columns.items()})  # fmt: skip
        except Exception:
            return row
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
