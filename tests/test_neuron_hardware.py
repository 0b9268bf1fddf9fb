"""On a Trainium instance: device=neuron trains (eager and torch.compile with backend neuron).

Skips with the reason wherever torch-neuronx or a Neuron device is missing (everywhere in this
project's CI). Nothing here has been run on Trainium by this project yet.
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile-neuron"])
def test_tiny_qwen3_trains_on_two_neuron_cores(tmp_path, assets, compiled):
    run_dir = tmp_path / "run"
    result = launch(
        run_dir, "experiment=cpu_qwen3_tiny_native", "device=neuron", "run.nproc_per_node=2",
        f"compile.enable={str(compiled).lower()}", timeout=3600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 5
    assert summary["final_loss"] < summary["first_loss"] - 0.3
    assert len(summary["overrides"][devices.NEURON_ATTENTION_OVERRIDE]) == 4
