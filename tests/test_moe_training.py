"""Integration: model=moe trains with the blockwise kernel and a user's own kernel, step for step as
each other in float32, and compiled (torch.compile, torchtitan's per-block compile) on two CPU ranks.

All are experiment=cpu_qwen3_tiny_moe (tiny MoE, 5 steps) with its experts swapped or compiled: the
compiled run compares with the experiment as it is (2 ranks, the blockwise kernel in bf16),
conftest.py's `moe_experiment_run`, which tests/test_experiments.py asserts on too. Which modules ran
is what the workers recorded (summary.json's `overrides`, `compiled`: worker/what_ran.py), not what
the plan said."""

from __future__ import annotations

import json
import math

import pytest
from conftest import read_jsonl, trained

pytestmark = pytest.mark.integration

EXPERIMENT = "experiment=cpu_qwen3_tiny_moe"
STEPS, TOKENS = 5, 4 * 64  # the experiment's steps; the kernels' comparison's tokens a step (FLOAT32)
BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
MY_EXPERTS = "examples.my_moe.my_experts"
EXPERTS = [f"layers.{i}.moe.routed_experts.inner_experts" for i in range(2)]  # the tiny MoE's two layers
# The kernels' comparison: every matmul in float32, the parameters FSDP gathers (this CPU's bf16 units
# would make them bf16) and the experts' (bf16 in torchtitan's and the kernels' defaults, float32 through
# the factories' keyword arguments); every token to all 8 experts, a continuous routing
# (tests/test_parallelism.py says why); one rank, 4 rows of 64 tokens, what the kernels need (the
# experiment's own run has the blockwise kernel on two ranks).
FLOAT32 = ("training.mixed_precision_param=float32", "kernels=none", "model.top_k=8", "run.nproc_per_node=1",
           "training.local_batch_size=4", "training.seq_len=64")  # fmt: skip
FLOAT32_REFERENCE = f"override.imports=[[{MY_EXPERTS},{{compute_dtype:float32}}]]"
# blocks of 48: each expert's 256 rows fill 5 and a sixth with 32 rows of padding
FLOAT32_BLOCKWISE = f"override.imports=[[{BLOCKWISE},{{block_size:48,compute_dtype:float32}}]]"


def summary_of(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses(run_dir):
    return [record["loss"] for record in read_jsonl(run_dir / "metrics.jsonl")]


def tolerance(steps: int) -> dict[str, float]:
    """Two float32 kernels differ in the order of their sums only: tests/test_parallelism.py's bound
    (u = 2^-24, LAMBDA = 4) for TOKENS = 256 token losses below 8 each and sums of squares over up to
    2048 x 256 entries: loss 3.5e-5 at step 1 and 7.9e-5 at step 5, grad norm 1.1e-4 and 1.2e-4
    relative. Measured: 4.8e-7 (1 ulp) and 0 at most; 1.8e-4 and 2.8e-4 with the reference's
    experts in bf16, 1.9e-4 in the loss with the blockwise kernel's."""
    u, lam, loss, largest = 2.0**-24, 4, 8.0, 2048 * 256
    return dict(
        loss=2 * lam * math.sqrt(steps * TOKENS / 3) * u * loss,
        grad_norm=lam * math.sqrt(largest / 3) * u + 2 * lam * math.sqrt(steps * TOKENS) * u,
    )


def assert_tracks(run_dir, reference) -> None:
    """Step for step, the loss and the grad norm of `reference`, within `tolerance`; and it learns."""
    ran, expected = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    print(f"{run_dir}: {[(r['loss'], r['grad_norm']) for r in ran]}")  # the numbers behind a failure
    assert len(ran) == len(expected) == STEPS and ran[-1]["loss"] < ran[0]["loss"] - 0.3
    first, every = tolerance(1), tolerance(STEPS)
    assert ran[0]["loss"] == pytest.approx(expected[0]["loss"], abs=first["loss"])
    assert ran[0]["grad_norm"] == pytest.approx(expected[0]["grad_norm"], rel=first["grad_norm"])
    assert [r["loss"] for r in ran] == pytest.approx([r["loss"] for r in expected], abs=every["loss"])
    assert [r["grad_norm"] for r in ran] == pytest.approx([r["grad_norm"] for r in expected], rel=every["grad_norm"])


@pytest.fixture(scope="module")
def float32_reference(tmp_path_factory, assets):
    """The example user kernel (examples/my_moe.py's LoopExperts: a loop over experts) at float32."""
    return trained(tmp_path_factory.mktemp("moe-float32") / "run", EXPERIMENT, *FLOAT32, FLOAT32_REFERENCE)


@pytest.mark.numerics
def test_blockwise_tracks_the_float32_reference_step_for_step(tmp_path, float32_reference):
    run_dir = trained(tmp_path / "run", EXPERIMENT, *FLOAT32, FLOAT32_BLOCKWISE)
    assert_tracks(run_dir, float32_reference)
    # the worker ran the blockwise experts in both layers, their factory given block_size and compute_dtype
    assert summary_of(run_dir)["overrides"][BLOCKWISE] == dict.fromkeys(
        EXPERTS, "qwen3_neuron.kernels.moe.blockwise.BlockwiseGroupedExperts"
    )
    applied = "BlockwiseGroupedExperts.Config with block_size=48, compute_dtype='float32'"  # torchtitan's line
    assert (run_dir / "train.log").read_text().count(applied) == 2
    assert BLOCKWISE not in summary_of(float32_reference)["overrides"]


@pytest.mark.numerics
def test_the_example_user_kernel_trains_with_its_factorys_keyword_argument(float32_reference):
    """The example's factory took compute_dtype=float32 from override.imports (torchtitan's line in
    the worker's log), and the worker ran its experts in both layers."""
    assert summary_of(float32_reference)["overrides"][MY_EXPERTS] == dict.fromkeys(
        EXPERTS, "examples.my_moe.LoopExperts"
    )
    applied = "GroupedExperts.Config -> LoopExperts.Config with compute_dtype='float32'"  # torchtitan's line
    assert (float32_reference / "train.log").read_text().count(applied) == 2
    assert losses(float32_reference)[-1] < losses(float32_reference)[0] - 0.3


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
