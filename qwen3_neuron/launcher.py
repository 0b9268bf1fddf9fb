"""Stage 4, launch: run the planned torchrun command as a subprocess.

torchrun gets its own process group so that Ctrl-C / SIGTERM reach it through the launcher once:
the launcher forwards the signal, torchrun stops its workers, and if it does not within a grace
period the whole group is killed. Worker output goes to the terminal and to `train.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

LOG_FILE = "train.log"
GRACE_SECONDS = 30


@dataclass
class LaunchResult:
    returncode: int
    interrupted_by: str | None  # signal name when the user stopped the run


def run_torchrun(command: list[str], env: dict[str, str], run_dir: Path) -> LaunchResult:
    process = subprocess.Popen(
        command,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        _signal_group(process, signum)
        kill_later = threading.Timer(GRACE_SECONDS, _signal_group, (process, signal.SIGKILL))
        kill_later.daemon = True
        kill_later.start()

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _tee(process, run_dir / LOG_FILE)
        returncode = process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    interrupted_by = signal.Signals(received[0]).name if received else None
    return LaunchResult(returncode, interrupted_by)


def _tee(process: subprocess.Popen, log_path: Path) -> None:
    with open(log_path, "ab") as log:
        for line in process.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            log.write(line)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass
