"""Stage 3, start: run the torchrun command as a subprocess.

torchrun gets its own process group so that Ctrl-C / SIGTERM reach it through the launcher once.
torchrun and its workers end with the launcher however it ends, kill -9 included
(`parent_death`). The launcher forwards either as SIGTERM, which torchrun passes on to its workers: a worker
blocked in a collective never sees a KeyboardInterrupt, but SIGTERM ends it at once. torchrun
starts each worker in a session of its own (a CPU job's forked ranks stay in torchrun's), so if
torchrun has not stopped them within its own 30 s close timeout plus a margin, the launcher kills
torchrun's children as well as torchrun. Worker output always goes to `train.log`; on screen either
all of it (verbose) or one live progress line fed by rank 0's metrics.jsonl (qwen3_neuron.launch.progress);
the end of the output is kept for the launcher to explain a failure with (`launch.workers_failed`). A
train.log that cannot be written (a full disk) stops there; the output is still drained (no
worker blocks on a full pipe) and its end kept for that message and the summary's error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from qwen3_neuron.launch.progress import Progress
from qwen3_neuron.parent_death import child_dies_with_this_process
from qwen3_neuron.run_dir import LOG_FILE

GRACE_SECONDS = 45  # torchrun's own close timeout is 30 s: let it finish first
FAILURE_TAIL_LINES = 30


@dataclass
class LaunchResult:
    returncode: int
    interrupted_by: str | None  # signal name when the user stopped the run
    log_error: str | None = None  # why train.log stopped being written (a full disk), if it did
    output_end: str = ""  # the last lines torchrun and its workers wrote


class Torchrun:
    """The torchrun command as a subprocess, its output drained into train.log from the start
    (on screen too when `echo`, i.e. verbose): it may run while the launcher is still planning."""

    def __init__(self, command: list[str], env: dict[str, str], run_dir: Path, echo: bool):
        self.run_dir, self.echo = run_dir, echo
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=child_dies_with_this_process(),  # kill -9 of the launcher ends torchrun too
        )
        self.tail: deque[bytes] = deque(maxlen=FAILURE_TAIL_LINES)
        self.log_errors: list[str] = []
        tee_args = (self.process, run_dir / LOG_FILE, echo, self.tail, self.log_errors)
        self._tee = threading.Thread(target=_tee, args=tee_args, daemon=True)
        self._tee.start()

    def wait(self, progress: Progress | None = None) -> LaunchResult:
        """Until torchrun exits; Ctrl-C / SIGTERM meanwhile stop it (module docstring)."""
        process, received = self.process, []

        def forward(signum, _frame):
            received.append(signum)
            _signal_group(process, signal.SIGTERM)
            kill_later = threading.Timer(GRACE_SECONDS, _kill_job, (process,))
            kill_later.daemon = True
            kill_later.start()

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if progress is not None:
                progress.start()
            returncode = process.wait()
            self._tee.join()
        finally:
            if progress is not None:
                progress.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        interrupted_by = signal.Signals(received[0]).name if received else None
        log_error = self.log_errors[0] if self.log_errors else None
        return LaunchResult(returncode, interrupted_by, log_error, b"".join(self.tail).decode(errors="replace"))

    def stop(self) -> None:
        """Stop it before it trained (the plan failed): SIGTERM, then SIGKILL to torchrun and its
        workers if they have not gone within the grace time."""
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _kill_job(self.process)
            self.process.wait()
        self._tee.join()


def _tee(process: subprocess.Popen, log_path: Path, echo: bool, tail: deque, log_errors: list[str]) -> None:
    try:
        log = open(log_path, "ab", buffering=0)  # unbuffered: a failed write raises at the write
    except OSError as e:
        log = None
        log_errors.append(f"{log_path} could not be written: {e.strerror}")
    for line in process.stdout:
        if echo:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        tail.append(line)
        if log is not None:
            try:
                log.write(line)
            except OSError as e:  # a full disk: keep draining, so that no worker blocks on the pipe
                log_errors.append(f"{log_path} could not be written: {e.strerror}")
                log.close()
                log = None
    if log is not None:
        log.close()


def _kill_job(process: subprocess.Popen) -> None:
    for pid in _children(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _signal_group(process, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; elsewhere none are found and torchrun's group is all
    that is killed)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass
