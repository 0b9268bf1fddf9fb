"""Integration: model=moe trains on two CPU ranks with torchtitan's experts, the blockwise kernel
and a user's own kernel.

All three are experiment=cpu_qwen3_tiny_moe (tiny MoE, 2 ranks, 5 steps) with its experts swapped:
the blockwise run is the experiment as it is, conftest.py's `moe_experiment_run`, which
tests/test_experiments.py asserts on too."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl, trained

pytestmark = pytest.mark.integration

EXPERIMENT = "experiment=cpu_qwen3_tiny_moe"
STEPS = 5  # the experiment's


def losses(run_dir):
    return [record["loss"] for record in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, assets):
    """torchtitan's own experts."""
    return trained(tmp_path_factory.mktemp("moe-none") / "run", EXPERIMENT, "kernels=none")


def test_blockwise_tracks_torchtitans_experts_step_for_step(moe_experiment_run, reference_run):
    run_dir = moe_experiment_run  # kernels=blockwise, kernels.block_size=32
    reference, blockwise = losses(reference_run), losses(run_dir)
    assert len(reference) == len(blockwise) == STEPS and blockwise[-1] < blockwise[0] - 0.3
    # same seed, same data, the same math in another order: float rounding only
    assert blockwise == pytest.approx(reference, abs=2e-3)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["overrides"]["qwen3_neuron.kernels.moe.blockwise.blockwise_experts"]) == 2
    assert "qwen3_neuron.kernels.moe.blockwise.blockwise_experts" not in json.loads(
        (reference_run / "summary.json").read_text()
    )["overrides"]  # the reference really ran torchtitan's experts


def test_the_example_user_kernel_trains(tmp_path, reference_run):
    run_dir = trained(tmp_path / "run", EXPERIMENT, "kernels=none", "kernels.overrides=[examples.my_moe.my_experts]")
    assert losses(run_dir) == pytest.approx(losses(reference_run), abs=2e-3)
    assert "examples.my_moe.my_experts" in json.loads((run_dir / "summary.json").read_text())["overrides"]
