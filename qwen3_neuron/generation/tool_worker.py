"""The process that runs `grpo.tools` functions for a rank, and the rank's handle on it.

Processes, not threads: a Python thread cannot be stopped, so a tool that hangs (or spins) in a
thread would keep its thread, and its share of the rank's interpreter, for the rest of the run,
one more with each hang. A process can be killed: a call that passes `grpo.tool_timeout_s` is
answered as timed out, and the process, with every call still running in it, is killed then; a
fresh one starts at the next call. Inside it each call runs in a thread of its own, so the calls
of one round run at once and a round waits at most the timeout, whatever number of them hang.
The process ends with the rank (Linux's parent-death signal, and at the end of its input), so
none outlives the run.

Started as `python -m qwen3_neuron.generation.tool_worker FD PARENT_PID`, it imports the tool
modules by name (the rank's sys.path in its PYTHONPATH) and nothing of torch. Messages are
pickled over a socket pair (`multiprocessing.connection`): the names first, then per call
`(index, name, arguments)`; it answers `("ready",)` once loaded, then per call
`(index, failure, text)`, failure None or "raised", text the result as `str()` gives it (TRL's).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

START_TIMEOUT_S = 120.0  # importing the tool modules, before any call's clock starts


class ToolProcess:
    """The worker process for functions named `module.function`, started at the first call."""

    def __init__(self, names: list[str]):
        self.names = names
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None

    def run(self, calls: list[tuple[str, dict]], timeout_s: float) -> list[tuple[str | None, str]]:
        """Each `(tool name, arguments)` called at once: per call `(failure, text)`, failure None,
        "raised" (text: what it raised), "ended" (the process died under it) or "timeout"."""
        if not calls:
            return []
        if self.process is None:
            self._start()
        deadline = time.monotonic() + timeout_s
        for index, (name, arguments) in enumerate(calls):
            self.connection.send((index, name, arguments))
        answers: dict[int, tuple[str | None, str]] = {}
        ended = None
        while len(answers) < len(calls):
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0 or not self.connection.poll(remaining):
                    break
                index, failure, text = self.connection.recv()
            except (EOFError, OSError):  # a tool ended the process (os._exit, a crash)
                ended = f"the tools' process ended (exit code {self.process.wait()}) while it ran"
                break
            answers[index] = (failure, text)
        if len(answers) < len(calls):
            self.close()  # the calls still running end with it
        missing = ("ended", ended) if ended else ("timeout", "")
        return [answers.get(index, missing) for index in range(len(calls))]

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.connection.close()
        self.process = self.connection = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        # the rank's own import path (run.python_path, the test's dirs): the tool modules import alike
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        # no preexec_fn in a rank's threaded process: the child sets its parent-death signal itself
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())], pass_fds=[theirs.fileno()],
            env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        theirs.close()
        self.connection = Connection(ours.detach())
        self.connection.send(self.names)
        try:
            if not self.connection.poll(START_TIMEOUT_S):
                raise EOFError(f"not ready in {START_TIMEOUT_S:.0f} s")
            self.connection.recv()
        except (EOFError, OSError) as e:  # an import that fails there (its traceback on the rank's stderr)
            code = self.process.poll()
            self.close()
            raise RuntimeError(f"the tools' process could not import {', '.join(self.names)} "
                               f"({e or f'exit code {code}'})") from e


def _serve(connection: Connection) -> None:
    functions = {}
    for name in connection.recv():
        module, _, attribute = name.rpartition(".")
        function = getattr(importlib.import_module(module), attribute)
        functions[function.__name__] = function
    sending = threading.Lock()
    connection.send(("ready",))

    def call(index: int, name: str, arguments: dict) -> None:
        try:
            result = functions[name](**arguments)
            if inspect.isawaitable(result):  # an async tool, as TRL takes them
                result = asyncio.run(result)
            answer = (index, None, str(result))
        except Exception as e:
            answer = (index, "raised", f"{type(e).__name__}: {e}")
        with sending:
            connection.send(answer)

    while True:
        try:
            index, name, arguments = connection.recv()
        except EOFError:  # the rank closed its end
            return
        threading.Thread(target=call, args=(index, name, arguments), daemon=True).start()


if __name__ == "__main__":
    from qwen3_neuron.parent_death import die_with_parent

    die_with_parent(int(sys.argv[2]))
    _serve(Connection(int(sys.argv[1])))
    os._exit(0)  # the calls still running (daemon threads) end with the process
