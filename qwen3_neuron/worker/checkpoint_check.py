"""Before the workers load `step-N`: the checkpoint checked against its own DCP `.metadata` (every
storage entry's file there and as long as the metadata says), no tensor read.

torchtitan loads the newest `step-N` that has a `.metadata` (or `checkpoint.load_step`); a shard
cut short after it was written (a full disk, a lost node, an interrupted copy to shared storage)
fails deep inside every rank. The plan (node 0's local rank 0, before any rank builds) checks the
newest first: a damaged one is set aside into `<checkpoint folder>/damaged/step-N` (kept for a
look; torchtitan's search and purge see `step-N` names only, and a later save of that step
writes a fresh folder), and the run continues from the newest intact one, saying which it
skipped and why. `checkpoint.load_step` naming a damaged one, or no intact one left, refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.run_dir import complete_steps

DAMAGED_DIR = "damaged"


def damage(step_dir: Path) -> str | None:
    """What is wrong with a DCP checkpoint's files, or None when they are what its `.metadata` lists."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(step_dir)).read_metadata()
    except Exception as e:  # a cut or overwritten .metadata: unpickling fails in many ways
        return f".metadata cannot be read ({type(e).__name__}: {e})"
    expected: dict[str, int] = {}  # file -> the end of its last entry
    for entry in (metadata.storage_data or {}).values():
        expected[entry.relative_path] = max(expected.get(entry.relative_path, 0), entry.offset + entry.length)
    for name, size in sorted(expected.items()):
        path = step_dir / name
        if not path.is_file():
            return f"{name} is missing (.metadata lists {size:,} bytes)"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size:,} bytes, its .metadata says {size:,}"
    return None


def check_checkpoints(folder: Path, load_step: int, warn: Callable[[str], None]) -> dict[str, Any]:
    """The checkpoint this launch loads and the damaged ones set aside, for the summary:
    {"checkpoint_loaded": "step-N" | None, "checkpoints_skipped": {"step-M": what is wrong}}."""
    steps = complete_steps(folder)
    if load_step != -1:  # the user's choice: never swapped for another
        if load_step not in steps:
            raise ConfigError(
                f"checkpoint.load_step={load_step}: {folder} has no complete step-{load_step} "
                f"(complete: {', '.join(f'step-{s}' for s in steps) or 'none'})."
            )
        problem = damage(folder / f"step-{load_step}")
        if problem:
            raise ConfigError(
                f"checkpoint.load_step={load_step}: {folder / f'step-{load_step}'} is damaged: {problem}. "
                f"Load another (intact ones are checked the same way) or unset checkpoint.load_step to "
                f"continue from the newest intact checkpoint."
            )
        return {"checkpoint_loaded": f"step-{load_step}", "checkpoints_skipped": {}}
    skipped: dict[str, str] = {}
    for step in reversed(steps):
        problem = damage(folder / f"step-{step}")
        if problem is None:
            break
        skipped[f"step-{step}"] = problem
    else:
        if skipped:
            raise ConfigError(
                f"every checkpoint in {folder} is damaged ({_listed(skipped)}): nothing to continue from. "
                f"Copy intact step-N folders back from where they were made, or start a new run."
            )
        return {"checkpoint_loaded": None, "checkpoints_skipped": {}}
    for name, problem in skipped.items():
        kept = _set_aside(folder, name)
        warn(f"[qwen3-neuron] warning: checkpoint {folder / name} is damaged: {problem}. Skipped (moved to {kept}); "
             f"the run continues from step-{step}, the newest intact checkpoint.")  # fmt: skip
    return {"checkpoint_loaded": f"step-{step}", "checkpoints_skipped": skipped}


def _set_aside(folder: Path, name: str) -> Path:
    """`<folder>/damaged/<name>` (`<name>.2`, ... when that step was set aside before)."""
    damaged = folder / DAMAGED_DIR
    damaged.mkdir(exist_ok=True)
    target, count = damaged / name, 1
    while target.exists():
        count += 1
        target = damaged / f"{name}.{count}"
    (folder / name).rename(target)
    return target


def _listed(skipped: dict[str, str]) -> str:
    return "; ".join(f"{name}: {problem}" for name, problem in skipped.items())
