"""GRPO's tools: `grpo.tools=[module.function, ...]` and `grpo.environment=module.Class`, as TRL 1.16 takes them.

A tool is a plain Python function (sync or async) with a type hint on each argument and a
docstring describing it: its JSON schema is transformers' `get_json_schema`'s (as TRL's), handed
to the chat template as `tools=` with the prompts. An environment is a class instantiated once per
rollout (TRL's `environment_factory`): `reset(**row)` is called with the row's columns and may
return text appended to the prompt's last message; its other public methods are tools (bound to
that rollout's instance); a `get_reward()` method scores the rollout (a reward of weight 1 named
after the class); rewards get the instances as `environments=[...]`.

`ToolBox.run` answers one round of calls, each as TRL's tool message content: the result's
`str()`, or `{'error': '...'}` saying what went wrong -- a block that is not a call (malformed), an
unknown tool, arguments the function does not take, an exception, or no answer within
`grpo.tool_timeout_s` -- counted by kind (`FAILURES`). Functions run in the rank's tool process
(`tool_worker`: killed at a timeout); an environment's methods run in the rank's own process (its
state is what the rewards read), each call in a daemon thread waited for at most the timeout: a
call past it is answered as timed out and left to end on its own (Python cannot stop a thread; it
ends with the run at the latest).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.generation.tool_calls import ToolCall, tool_error
from qwen3_neuron.generation.tool_worker import ToolProcess

FAILURES = ("malformed", "unknown", "arguments", "raised", "timeout")
TOOL_TIMEOUT_S, MAX_TOOL_CALLING_ITERATIONS = 10.0, 4  # conf/trainer/grpo.yaml's; the chat command's defaults
ENVIRONMENT_HOOKS = ("reset", "get_reward")  # an environment's methods that are not tools (TRL's)


@dataclass(frozen=True)
class ToolKeys:
    """How the user named the tools and their timeout (a launch's keys, a command's flags): the messages say so."""

    tool: str = "grpo.tools[{index}]"
    timeout: str = "grpo.tool_timeout_s"


@dataclass(frozen=True)
class ToolResult:
    """A call's tool message (`name`, `content`) and its failure kind (None: it answered)."""

    name: str
    content: str
    failure: str | None

    def message(self) -> dict[str, str]:
        return {"role": "tool", "name": self.name, "content": self.content}


class ToolBox:
    """The loaded tools: `functions` (name -> function, `module.function` each in `paths`), the
    `environment` class and its tool methods' names, every tool's schema, the timeout."""

    def __init__(self, functions: dict[str, Callable], paths: list[str], environment: type | None,
                 methods: list[str], schemas: list[dict], timeout_s: float, keys: ToolKeys = ToolKeys()):  # fmt: skip
        self.functions, self.environment, self.methods = functions, environment, methods
        self.schemas, self.timeout_s, self.keys = schemas, timeout_s, keys
        self.names = [*functions, *methods]
        self._process = ToolProcess(paths)

    def new_environment(self) -> Any:
        return self.environment()

    def run(self, calls: Sequence[tuple[ToolCall, Any]]) -> list[ToolResult]:
        """One round: each `(call, its rollout's environment or None)` answered, all at once."""
        results: list[ToolResult | None] = [None] * len(calls)
        in_process, in_threads = [], []
        for index, (call, environment) in enumerate(calls):
            if call.error:
                results[index] = _failed(call.name, "malformed", call.error)
                continue
            function = self.functions.get(call.name)
            if function is None and environment is not None and call.name in self.methods:
                function = getattr(environment, call.name)
            if function is None:
                known = ", ".join(self.names) or "none"
                results[index] = _failed(call.name, "unknown", f"unknown tool {call.name!r}; the tools are {known}")
                continue
            try:
                inspect.signature(function).bind(**call.arguments)
            except TypeError as e:
                results[index] = _failed(call.name, "arguments", f"wrong arguments for {call.name}: {e}")
                continue
            (in_process if call.name in self.functions else in_threads).append((index, call.name, function, call))
        deadline = time.monotonic() + self.timeout_s
        threads = _started(in_threads)  # the environments' calls run while the process answers its own
        answers = self._process.run([(name, call.arguments) for _, name, _, call in in_process], self.timeout_s)
        for (index, name, _, _), (failure, text) in zip(in_process, answers):
            results[index] = self._result(name, failure, text)
        for (index, name, _, _), (thread, box) in zip(in_threads, threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            results[index] = self._result(name, *box) if box else self._result(name, "timeout", "")
        return results

    def close(self) -> None:
        """Ends the tool process (a later call starts a new one)."""
        self._process.close()

    def _result(self, name: str, failure: str | None, text: str) -> ToolResult:
        if failure is None:
            return ToolResult(name, text, None)
        if failure == "timeout":
            return _failed(name, failure, f"{name} gave no answer within {self.keys.timeout}={self.timeout_s:g} s "
                                          "and was stopped")  # fmt: skip
        if failure == "ended":  # the process died under it (os._exit, a crash): as a raise
            return _failed(name, "raised", f"{name} could not answer: {text}")
        return _failed(name, failure, f"{name} raised {text}")


def _failed(name: str, failure: str, text: str) -> ToolResult:
    return ToolResult(name, tool_error(text), failure)


def _started(calls: list) -> list[tuple[threading.Thread, list]]:
    """Each `(index, name, method, call)` started in a daemon thread; its `(failure, text)` lands in the box."""
    started = []
    for _, name, method, call in calls:
        box: list = []

        def target(method=method, arguments=call.arguments, box=box):
            try:
                result = method(**arguments)
                if inspect.isawaitable(result):
                    result = asyncio.run(result)
                box.extend((None, str(result)))
            except Exception as e:
                box.extend(("raised", f"{type(e).__name__}: {e}"))

        thread = threading.Thread(target=target, daemon=True, name=f"grpo-tool-{name}")
        thread.start()
        started.append((thread, box))
    return started


# ---- loading ---------------------------------------------------------------------------------


def load_tools(names: Sequence[str], environment: str | None, timeout_s: float,
               keys: ToolKeys = ToolKeys()) -> ToolBox | None:  # fmt: skip
    """The `grpo.tools` functions and the `grpo.environment` class with their schemas; None when
    neither is set. A ConfigError names what cannot be loaded or described (as `keys` spell them), and why."""
    if not names and not environment:
        return None
    if not timeout_s > 0:
        raise ConfigError(f"{keys.timeout}={timeout_s}: the seconds a tool call may take, > 0 (e.g. 10).")
    functions, schemas = {}, []
    for index, name in enumerate(names):
        key = keys.tool.format(index=index)
        function = _imported(name, key)
        if inspect.isclass(function) or not callable(function):
            raise ConfigError(f"{key}: {name} is a {type(function).__name__}, not a function (an environment class "
                              "goes to grpo.environment).")  # fmt: skip
        if function.__name__ in functions:
            raise ConfigError(f"{key}: {name} has the name of another tool, {function.__name__}: the model calls "
                              "tools by name, so each needs its own.")  # fmt: skip
        schemas.append(_schema(function, key, name))
        functions[function.__name__] = function
    cls, methods = None, []
    if environment:
        cls = _imported(environment, "grpo.environment")
        if not inspect.isclass(cls) or not callable(getattr(cls, "reset", None)):
            raise ConfigError(f"grpo.environment: {environment} must be a class with a reset(**row) method "
                              "(TRL's environment_factory: one instance per rollout, its public methods the "
                              "tools).")  # fmt: skip
        for method_name, method in inspect.getmembers(cls, predicate=inspect.isfunction):
            if method_name in ENVIRONMENT_HOOKS or method_name.startswith("_"):
                continue
            if method_name in functions:
                raise ConfigError(f"grpo.environment: {environment}.{method_name} has the name of the tool "
                                  f"{functions[method_name].__module__}.{method_name}: each tool needs its own "
                                  "name.")  # fmt: skip
            # a method bound to a stand-in: its schema without `self`, no instance built at plan time
            schemas.append(_schema(types.MethodType(method, cls), "grpo.environment", f"{environment}.{method_name}"))
            methods.append(method_name)
    return ToolBox(functions, list(names), cls, methods, schemas, float(timeout_s), keys)


def environment_reward(environment: type | None) -> tuple[str, Callable] | None:
    """TRL's reward of an environment that owns it: `get_reward()` of each rollout's instance,
    named after the class (weight 1)."""
    if environment is None or not callable(getattr(environment, "get_reward", None)):
        return None

    def get_reward(**kwargs) -> list[float | None]:
        return [instance.get_reward() for instance in kwargs["environments"]]

    return environment.__name__, get_reward


def _imported(name: str, key: str) -> Any:
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        raise ConfigError(f"{key}: {name!r} is not module.name (e.g. examples.my_tools.add).")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key}: {name!r}: module {module_name!r} cannot be imported ({e}); put it on "
                          "PYTHONPATH or in the working directory.") from e  # fmt: skip
    if not hasattr(module, attribute):
        raise ConfigError(f"{key}: {name!r}: module {module_name!r} has no {attribute!r}.")
    return getattr(module, attribute)


def _schema(function: Callable, key: str, name: str) -> dict:
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    try:
        return get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as e:
        raise ConfigError(
            f"{key}: {name} cannot be described to the model: {str(e).rstrip('.!')}. A tool's schema comes from its type hints "
            "and docstring (transformers' get_json_schema, as TRL's): a type hint on each argument, and a docstring "
            "with a description and an `Args:` line per argument."
        ) from e
