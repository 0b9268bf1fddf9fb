"""Tools and an environment the agentic GRPO tests hand to `grpo.tools` / `grpo.environment`
(imported by the rank's tool process too: nothing heavy here)."""

from __future__ import annotations

import os
import time


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def sleeps_forever(seconds: int) -> str:
    """Never answers (its process id first written where AGENTIC_TOOLS_PIDS says).

    Args:
        seconds: Ignored.
    """
    if "AGENTIC_TOOLS_PIDS" in os.environ:
        with open(os.environ["AGENTIC_TOOLS_PIDS"], "a") as file:
            file.write(f"{os.getpid()}\n")
    while True:
        time.sleep(3600)


def raises(text: str) -> str:
    """Raises ValueError with the text.

    Args:
        text: The message.
    """
    raise ValueError(text)


def undocumented(a: int) -> int:
    return a


def untyped(a):
    """Returns a.

    Args:
        a: Anything.
    """
    return a


class Counter:
    """An environment: a count that starts at the row's `start` and that `increment` raises."""

    def reset(self, start: int = 0, **row) -> str:
        self.count = start
        return f" (the count starts at {start})"

    def increment(self, by: int) -> int:
        """Adds to the count and returns it.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def answered(completions, answer) -> list[float]:
    """A reward without **kwargs: 1 where the last message holds the answer."""
    return [float(answer_ in c[-1]["content"]) for c, answer_ in zip(completions, answer)]


def counted(environments, **kwargs) -> list[float]:
    """A reward that reads each rollout's environment."""
    return [float(environment.count) for environment in environments]
