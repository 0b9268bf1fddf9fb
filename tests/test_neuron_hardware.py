"""On a Trainium instance: device=neuron trains (eager and torch.compile with backend neuron), and a
compiled run leaves its NEFFs in device.cache_dir, where a second run finds them.

Skips with the reason wherever torch-neuronx or a Neuron device is missing (everywhere in this
project's CI). Nothing here has been run on Trainium by this project yet. The README's Trainium
section lists what to run first on a trn2 instance, in order.
"""

from __future__ import annotations

import json

import pytest
from conftest import launch

from qwen3_neuron.devices import policy as devices

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        devices.unavailable_reason("neuron") is not None,
        reason=f"no Neuron device here: {devices.unavailable_reason('neuron')}",
    ),
]


def train_tiny(run_dir, cache_dir, compiled: bool) -> dict:
    result = launch(
        run_dir, "experiment=cpu_qwen3_tiny_native", "device=neuron", "run.nproc_per_node=2",
        f"compile.enable={str(compiled).lower()}", f"device.cache_dir={cache_dir}", timeout=3600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


def neffs(cache_dir) -> set[str]:
    return {str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*.neff")}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile-neuron"])
def test_tiny_qwen3_trains_on_two_neuron_cores(tmp_path, assets, compiled):
    summary = train_tiny(tmp_path / "run", tmp_path / "neff", compiled)
    assert summary["status"] == "completed" and summary["steps"] == 5
    assert summary["final_loss"] < summary["first_loss"] - 0.3
    assert len(summary["overrides"][devices.NEURON_ATTENTION_OVERRIDE]) == 4


def test_a_second_compiled_run_reuses_the_neff_cache(tmp_path, assets):
    """device.cache_dir is TORCH_NEURONX_NEFF_CACHE_DIR: the first run fills it, the same job again
    compiles nothing new (no NEFF added) and trains to the same losses."""
    cache_dir = tmp_path / "neff"
    first = train_tiny(tmp_path / "first", cache_dir, compiled=True)
    compiled = neffs(cache_dir)
    assert compiled, f"no NEFF in {cache_dir}"
    second = train_tiny(tmp_path / "second", cache_dir, compiled=True)
    assert neffs(cache_dir) == compiled
    losses = (first["first_loss"], first["final_loss"])
    assert (second["first_loss"], second["final_loss"]) == pytest.approx(losses, rel=1e-2)
