"""Ending a process that imported torch and torchtitan, without the interpreter's teardown.

Python's teardown collects garbage over every module still loaded; after torchtitan's imports that
is ~2 CPU-seconds, on every rank of every run and in a launcher that planned. A process whose work
is done and saved ends here instead: the exit handlers still run (logging's flush, file locks,
temporary dirs, libraries' own handlers), then the process exits with its code. Imports nothing of
ours.
"""

from __future__ import annotations

import atexit
import os
import sys


def exit_without_teardown(code: int) -> None:
    """What `sys.exit(code)` does for a finished process, less the garbage collection at teardown."""
    # atexit's own runner (what the interpreter calls at exit): every handler, last registered first
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
