"""A process that ends with its parent, however the parent ends (kill -9 included).

Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`): the kernel sends it to a process when the
thread that started it exits. The launcher starts torchrun with it (from its main thread, which
lives as long as the launcher), and every torchrun worker sets it against torchrun as it starts
(torchrun starts its workers from its main thread too): the launcher's end ends torchrun, whose
end ends the workers, on a node and in each SLURM task alike. Elsewhere (macOS) nothing is set:
the launcher's Ctrl-C / SIGTERM handling is then all there is. Imports nothing of ours.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
# loaded before any fork: the child of a threaded process should only call what is already there
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent ends; end now if `parent` is gone already (it ended
    before the signal was set, and this process was handed to another)."""
    if _PRCTL is None:
        return
    if _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def child_dies_with_this_process():
    """A `preexec_fn` for subprocess.Popen: the child ends when this process (its starting thread)
    ends. Runs in the child between fork and exec."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)
