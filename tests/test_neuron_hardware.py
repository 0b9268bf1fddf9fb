"""On a Trainium instance: device=neuron trains (eager and torch.compile with backend neuron), and a
second compiled run takes every NEFF from device.cache_dir instead of compiling.

What ran is what the workers recorded (summary.json's `attention`, `compiled`: worker/what_ran.py);
NEFF reuse is what TorchNeuron's own logger reports with TORCH_NEURONX_LOG_LEVEL=2 (INFO): a
"[NEFF_CACHE] Cache MISS" line for each graph it had to compile, "Cache HIT" for each it loaded
(torch-neuronx's csrc/core/neuron_logging.h; not yet run by this project). Skips only where no
Neuron stack is installed (tests/neuron_stack.py); a half-working one fails with the reason.
docs/trainium.md lists what to run first on a trn2 instance, in order.
"""

from __future__ import annotations

import json

import pytest
from conftest import launch
from neuron_stack import skip_without_a_neuron_stack, working_device

pytestmark = [pytest.mark.integration, skip_without_a_neuron_stack]

NEURON_ATTENTION = "qwen3_neuron.kernels.attention.neuron.NeuronSDPAAttention"
LAYERS = 4  # the tiny Qwen3's
CACHE_LOG = {"miss": "[NEFF_CACHE] Cache MISS", "hit": "[NEFF_CACHE] Cache HIT", "store": "[NEFF_CACHE] Storing NEFF"}


@pytest.fixture(scope="module")
def neuron_device():
    return working_device()


def train_tiny(run_dir, cache_dir, compiled: bool) -> dict:
    result = launch(
        run_dir, "experiment=cpu_qwen3_tiny_native", "device=neuron", "run.nproc_per_node=2",
        f"compile.enable={str(compiled).lower()}", f"device.cache_dir={cache_dir}", timeout=3600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


def neff_cache_events(run_dir) -> dict[str, int]:
    """How often TorchNeuron's logger reported each NEFF cache event in the run's output."""
    text = (run_dir / "train.log").read_text(errors="replace")
    return {event: text.count(marker) for event, marker in CACHE_LOG.items()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile-neuron"])
def test_tiny_qwen3_trains_on_two_neuron_cores(tmp_path, neuron_device, compiled):
    summary = train_tiny(tmp_path / "run", tmp_path / "neff", compiled)
    assert summary["status"] == "completed" and summary["steps"] == 5
    assert summary["final_loss"] < summary["first_loss"] - 0.3
    assert summary["attention"] == {NEURON_ATTENTION: LAYERS}  # every worker's model, every layer
    if compiled:
        assert summary["compiled"]["backend"] == "neuron" and summary["compiled"]["ranks_with_graphs"] == 2
        assert summary["compiled"]["recompiles"] == 0, summary["compiled"]["recompile_reasons"]
    else:
        assert summary["compiled"] is None


def test_a_second_compiled_run_reuses_every_neff_from_the_cache(tmp_path, neuron_device, monkeypatch):
    """device.cache_dir is TORCH_NEURONX_NEFF_CACHE_DIR: the first run compiles and stores its
    graphs there (misses), the same job again finds every one (hits, no miss) and trains to the
    same losses. A run that compiled again would log a miss, whatever file names it wrote."""
    monkeypatch.setenv("TORCH_NEURONX_LOG_LEVEL", "2")  # INFO: TorchNeuron logs its NEFF cache lookups
    cache_dir = tmp_path / "neff"
    first = train_tiny(tmp_path / "first", cache_dir, compiled=True)
    filled = neff_cache_events(tmp_path / "first")
    assert filled["miss"] > 0 and filled["store"] > 0, f"TorchNeuron logged no NEFF compile: {filled}"
    second = train_tiny(tmp_path / "second", cache_dir, compiled=True)
    reused = neff_cache_events(tmp_path / "second")
    assert reused["miss"] == 0 and reused["hit"] >= filled["store"], f"first run {filled}, second run {reused}"
    assert second["compiled"]["graphs"] == first["compiled"]["graphs"]  # Dynamo captured the same graphs
    losses = (first["first_loss"], first["final_loss"])
    assert (second["first_loss"], second["final_loss"]) == pytest.approx(losses, rel=1e-2)
