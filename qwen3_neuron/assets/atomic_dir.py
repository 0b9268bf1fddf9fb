"""Directories that appear only when complete: build aside, then rename into place.

A reader (a rebuild, a resumed run, `from_pretrained`) sees either the old complete dir or the
new complete one, never a half-written one; a killed writer leaves only a hidden temp dir.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def building(final_dir: Path) -> Iterator[Path]:
    """Yield a temp dir beside `final_dir`; when the block ends without error it becomes
    `final_dir` (readable by all), else it is removed."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", dir=final_dir.parent))
    try:
        yield tmp_dir
        _make_world_readable(tmp_dir)
        _move_into_place(tmp_dir, final_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # only left over when the block failed


def _make_world_readable(directory: Path) -> None:
    # mkdtemp (and safetensors) create owner-only modes; shared caches and exports are for all.
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _move_into_place(tmp_dir: Path, final_dir: Path) -> None:
    # An existing dir is moved aside first, so the final name always holds a complete dir.
    stale_dir = tmp_dir.with_name(tmp_dir.name + ".old")
    if final_dir.is_dir():
        final_dir.rename(stale_dir)
    try:
        tmp_dir.rename(final_dir)
    except OSError:
        # Another process renamed the same (deterministic) artifact into place first: keep it.
        if not final_dir.is_dir():
            raise
    shutil.rmtree(stale_dir, ignore_errors=True)
