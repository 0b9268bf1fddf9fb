"""One owner per run dir: a launch holds `<run dir>/.lock` (node N > 0 of a multi-node job:
`.lock.nodeN`) from before it reads or writes anything there until it ends.

The lock is the kernel's `fcntl.flock`: released when its process ends, however it ends (kill -9
included), so a crashed launch never blocks the next one. The file also names its owner (host,
pid, the process's start time, since when, the command): for the refusal to say who holds the
dir, and for a second check where flock alone cannot be trusted. On a local disk, NFSv4 and
Lustre/FSx mounted with `flock`, another holder's flock refuses at once. Lustre mounted with
`localflock` sees only this node's flocks, and a file system without locks (`noflock`, an NFSv3
server without lockd) refuses flock itself (ENOSYS, ENOLCK, EOPNOTSUPP): there the record decides.
A record of this host holds while its pid runs with the recorded start time (a reused pid does
not); a record of another host holds while its owner refreshes the file (every
`HEARTBEAT_SECONDS`; a lost or rebooted node stops, and `STALE_AFTER_SECONDS` later its lock
is taken over). Either way a lock whose owner is gone is taken over, and the launch says so.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from qwen3_neuron.errors import RunDirInUse
from qwen3_neuron.run_dir import lock_file

HEARTBEAT_SECONDS = 15.0
STALE_AFTER_SECONDS = 60.0
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)  # the file system has no flock


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float  # the process's start time (epoch seconds): a reused pid started later
    since: str  # when it took the run dir, UTC
    command: str

    @classmethod
    def this_process(cls) -> Owner:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=_start_time(os.getpid()),
            since=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            command=" ".join(sys.argv),
        )

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.since}: {self.command}"

    def is_alive(self, refreshed_at: float) -> bool:
        """This host: the pid runs with the recorded start time. Another host's processes cannot
        be seen from here: its owner refreshed the file within STALE_AFTER_SECONDS."""
        if self.host != socket.gethostname():
            return time.time() - refreshed_at < STALE_AFTER_SECONDS
        try:
            return _start_time(self.pid) == self.started
        except psutil.NoSuchProcess:  # a zombie too: it has exited
            return False


class RunDirLock:
    """Held from `take` until `release` (or the process's end)."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._refresh, name="run-dir-lock", daemon=True)
        self._heartbeat.start()

    @classmethod
    def take(cls, run_dir: Path, node_rank: int = 0) -> RunDirLock:
        """The run dir's lock, or RunDirInUse naming its live owner; a gone owner's is taken over."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / lock_file(node_rank)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise RunDirInUse(_in_use(run_dir, owner)) from None
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    os.close(fd)
                    raise
            if _same_file(fd, path):
                break
            os.close(fd)  # the owner released it (and removed the file) meanwhile: take the new one
        earlier = _read_owner(fd)
        if earlier is not None:
            if earlier.is_alive(os.fstat(fd).st_mtime):
                os.close(fd)
                raise RunDirInUse(_in_use(run_dir, earlier))
            print(f"[qwen3-neuron] run dir {run_dir}: took over a stale lock; its owner is gone "
                  f"({earlier.describe()})", file=sys.stderr, flush=True)  # fmt: skip
        _write_owner(fd, Owner.this_process())
        return cls(path, fd)

    def release(self) -> None:
        """Remove the file, then let go: a launch waiting on the old file sees it gone and retries."""
        self._stop.set()
        self.path.unlink(missing_ok=True)
        os.close(self._fd)

    def _refresh(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self._fd)
            except OSError:
                return


def _in_use(run_dir: Path, owner: Owner | None) -> str:
    who = owner.describe() if owner else "a launch that is starting (no record yet)"
    return (
        f"run dir {run_dir} is in use by another launch ({who}). One launch trains in a run dir at "
        f"a time. Wait for it to end, or stop it (kill {owner.pid if owner else '<pid>'} on its host): "
        f"run.resume={run_dir} then continues from its newest checkpoint. A new run needs a run dir "
        "of its own: leave hydra.run.dir unset."
    )


def _start_time(pid: int) -> float:
    return round(psutil.Process(pid).create_time(), 2)  # clock ticks: 1/100 s


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _read_owner(fd: int) -> Owner | None:
    text = os.pread(fd, 1 << 16, 0).decode(errors="replace")
    try:
        return Owner(**json.loads(text))
    except (ValueError, TypeError):  # empty (being written, or never) or not ours
        return None


def _write_owner(fd: int, owner: Owner) -> None:
    data = json.dumps(asdict(owner)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
