"""Integration: model=moe trains on two CPU ranks with torchtitan's experts, the blockwise kernel
and a user's own kernel, and compiled (torch.compile, torchtitan's per-block compile).

All are experiment=cpu_qwen3_tiny_moe (tiny MoE, 2 ranks, 5 steps) with its experts swapped or
compiled: the blockwise run is the experiment as it is, conftest.py's `moe_experiment_run`, which
tests/test_experiments.py asserts on too. Which modules ran is what the workers recorded
(summary.json's `overrides`, `compiled`: worker/what_ran.py), not what the plan said."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl, trained

pytestmark = pytest.mark.integration

EXPERIMENT = "experiment=cpu_qwen3_tiny_moe"
STEPS = 5  # the experiment's
BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
EXPERTS = [f"layers.{i}.moe.routed_experts.inner_experts" for i in range(2)]  # the tiny MoE's two layers


def summary_of(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses(run_dir):
    return [record["loss"] for record in read_jsonl(run_dir / "metrics.jsonl")]


def assert_tracks(curve: list[float], reference: list[float]) -> None:
    """Same seed, data and weights; the experts' bf16 matmuls in another order. Step 1 is one
    forward of the same weights: rounding only. Later steps follow AdamW, whose first updates are
    about lr x sign(gradient), so rounding-sized gradient differences move weights by up to 2 x lr
    and the losses apart by a few 1e-3 (2.3e-3 at step 3 measured on an AVX-512 host)."""
    assert len(curve) == len(reference) == STEPS and curve[-1] < curve[0] - 0.3
    assert curve[0] == pytest.approx(reference[0], abs=5e-4)
    assert curve == pytest.approx(reference, abs=5e-3)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, assets):
    """torchtitan's own experts."""
    return trained(tmp_path_factory.mktemp("moe-none") / "run", EXPERIMENT, "kernels=none")


@pytest.mark.numerics
def test_blockwise_tracks_torchtitans_experts_step_for_step(moe_experiment_run, reference_run):
    run_dir = moe_experiment_run  # kernels=blockwise, kernels.block_size=32
    assert_tracks(losses(run_dir), losses(reference_run))
    # every rank's model ran the blockwise experts in both layers
    assert summary_of(run_dir)["overrides"][BLOCKWISE] == dict.fromkeys(
        EXPERTS, "qwen3_neuron.kernels.moe.blockwise.BlockwiseGroupedExperts"
    )
    assert BLOCKWISE not in summary_of(reference_run)["overrides"]  # the reference ran torchtitan's experts


@pytest.mark.numerics
def test_the_example_user_kernel_trains(tmp_path, reference_run):
    run_dir = trained(tmp_path / "run", EXPERIMENT, "kernels=none", "kernels.overrides=[examples.my_moe.my_experts]")
    assert_tracks(losses(run_dir), losses(reference_run))
    assert summary_of(run_dir)["overrides"]["examples.my_moe.my_experts"] == dict.fromkeys(
        EXPERTS, "examples.my_moe.LoopExperts"
    )


@pytest.mark.numerics
def test_compiled_blockwise_trains_as_eager_does(tmp_path, moe_experiment_run):
    """compile.enable=true: torchtitan compiles each block (fullgraph) with aot_eager, the graph
    capture and AOT autograd split a Neuron compile goes through, then runs the same aten ops as
    eager; so the losses are eager's (a stale attention mask once moved step 2 by 2e-2)."""
    run_dir = trained(tmp_path / "run", EXPERIMENT, "compile.enable=true", "compile.backend=aot_eager")
    assert losses(run_dir) == pytest.approx(losses(moe_experiment_run), rel=1e-5)
    summary = summary_of(run_dir)
    compiled = summary["compiled"]  # torch._dynamo's own counters, in each worker
    assert compiled["backend"] == "aot_eager" and compiled["ranks_with_graphs"] == 2
    assert compiled["graphs"] >= 1 and compiled["compile_seconds"] > 0
    assert compiled["recompiles"] == 0, compiled["recompile_reasons"]  # one static shape: nothing recompiles
    assert summary["overrides"][BLOCKWISE] == dict.fromkeys(
        EXPERTS, "qwen3_neuron.kernels.moe.blockwise.BlockwiseGroupedExperts"
    )  # the compiled blocks hold the blockwise experts
    assert summary_of(moe_experiment_run)["compiled"] is None  # eager: nothing compiled
