"""Integration: model=moe trains on two CPU ranks with torchtitan's experts, the blockwise kernel
and a user's own kernel."""

from __future__ import annotations

import json

import pytest
from conftest import launch, read_jsonl

pytestmark = pytest.mark.integration


def losses(run_dir):
    return [record["loss"] for record in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, assets):
    run_dir = tmp_path_factory.mktemp("moe-none") / "run"
    result = launch(run_dir, "model=moe", "kernels=none", "training.steps=10")
    assert result.returncode == 0, result.stdout[-3000:]
    return run_dir


def test_blockwise_tracks_torchtitans_experts_for_10_steps(tmp_path, reference_run):
    run_dir = tmp_path / "run"
    result = launch(run_dir, "model=moe", "kernels=blockwise", "kernels.block_size=32", "training.steps=10")
    assert result.returncode == 0, result.stdout[-3000:]
    reference, blockwise = losses(reference_run), losses(run_dir)
    assert len(blockwise) == 10 and blockwise[-1] < blockwise[0] - 0.3
    # same seed, same data, the same math in another order: float rounding only
    assert blockwise == pytest.approx(reference, abs=2e-3)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["overrides"]["qwen3_neuron.kernels.moe.blockwise.blockwise_experts"]) == 2


def test_the_example_user_kernel_trains(tmp_path, reference_run):
    run_dir = tmp_path / "run"
    result = launch(run_dir, "model=moe", "kernels.overrides=[examples.my_moe.my_experts]", "training.steps=10")
    assert result.returncode == 0, result.stdout[-3000:]
    assert losses(run_dir) == pytest.approx(losses(reference_run), abs=2e-3)
    assert "examples.my_moe.my_experts" in json.loads((run_dir / "summary.json").read_text())["overrides"]
