"""Checkpoints checked against their own DCP .metadata before they are loaded (worker.checkpoint_check),
on small DCP checkpoints written here in-process."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.run_dir import complete_steps
from qwen3_neuron.worker.checkpoint_check import check_checkpoints, damage


def _save(folder: Path, step: int) -> Path:
    step_dir = folder / f"step-{step}"
    state = {"model": {"w": torch.full((64, 16), float(step)), "b": torch.zeros(16)}, "step": step}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... a single process": what we want
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(step_dir)), no_dist=True)
    return step_dir


def _shard(step_dir: Path) -> Path:
    (shard,) = step_dir.glob("*.distcp")
    return shard


def _cut_to_a_third(path: Path) -> tuple[int, int]:
    size = path.stat().st_size
    os.truncate(path, size // 3)
    return size, size // 3


def test_a_truncated_or_missing_shard_is_named_with_its_sizes(tmp_path):
    step_dir = _save(tmp_path, 2)
    assert damage(step_dir) is None
    shard = _shard(step_dir)
    size, cut = _cut_to_a_third(shard)
    assert damage(step_dir) == f"{shard.name} is {cut:,} bytes, its .metadata says {size:,}"
    shard.unlink()
    assert damage(step_dir) == f"{shard.name} is missing (.metadata lists {size:,} bytes)"
    (step_dir / ".metadata").write_bytes(b"cut")
    assert damage(step_dir).startswith(".metadata cannot be read (")


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_newest_intact_one_loads(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path, step)
    size, cut = _cut_to_a_third(_shard(tmp_path / "step-6"))
    warned = []
    loads = check_checkpoints(tmp_path, -1, warned.append)
    problem = f"{_shard(tmp_path / 'damaged' / 'step-6').name} is {cut:,} bytes, its .metadata says {size:,}"
    assert loads == {"checkpoint_loaded": "step-4", "checkpoints_skipped": {"step-6": problem}}
    assert warned == [
        (
            f"[qwen3-neuron] warning: checkpoint {tmp_path}/step-6 is damaged: {problem}. Skipped (moved to "
            f"{tmp_path}/damaged/step-6); the run continues from step-4, the newest intact checkpoint."
        )
    ]
    assert complete_steps(tmp_path) == [2, 4]  # what torchtitan's own search finds now: step-4 is the newest
    # the same step damaged again later is kept beside the first
    _save(tmp_path, 6)
    os.truncate(_shard(tmp_path / "step-6"), 10)
    assert check_checkpoints(tmp_path, -1, warned.append)["checkpoint_loaded"] == "step-4"
    assert sorted(p.name for p in (tmp_path / "damaged").iterdir()) == ["step-6", "step-6.2"]


def test_a_damaged_checkpoint_the_user_named_or_no_intact_one_refuses(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    size, cut = _cut_to_a_third(_shard(tmp_path / "step-4"))
    with pytest.raises(ConfigError, match=rf"checkpoint.load_step=4: {tmp_path}/step-4 is damaged: .* is {cut:,} bytes, "
                                          rf"its .metadata says {size:,}. Load another"):  # fmt: skip
        check_checkpoints(tmp_path, 4, print)
    assert check_checkpoints(tmp_path, 2, print) == {"checkpoint_loaded": "step-2", "checkpoints_skipped": {}}
    with pytest.raises(ConfigError, match=r"checkpoint.load_step=3: .* has no complete step-3 \(complete: step-2, step-4\)"):
        check_checkpoints(tmp_path, 3, print)
    os.truncate(_shard(tmp_path / "step-2"), 0)
    with pytest.raises(ConfigError, match=r"every checkpoint in .* is damaged \(step-4: .*; step-2: .*\): nothing to continue"):
        check_checkpoints(tmp_path, -1, print)
    assert complete_steps(tmp_path) == [2, 4]  # a refusal moves nothing
    assert check_checkpoints(tmp_path / "none", -1, print) == {"checkpoint_loaded": None, "checkpoints_skipped": {}}
