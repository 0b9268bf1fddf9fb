"""When the Trainium hardware tests run: they skip only where no Neuron stack is installed at all
(torch-neuronx absent: every machine but a Trainium instance). Where torch-neuronx is installed
but the device, TorchNeuron's `torch.neuron` or NKI does not work, they fail with the reason, so
that a half-installed trn2 cannot pass them by skipping."""

from __future__ import annotations

import importlib.util

import pytest

from qwen3_neuron.devices import policy as devices

INSTALLED = importlib.util.find_spec("torch_neuronx") is not None

skip_without_a_neuron_stack = pytest.mark.skipif(
    not INSTALLED, reason=f"no Neuron stack installed here: {devices.unavailable_reason('neuron')}"
)


def working_device(nki: bool = False):
    """The `neuron` device (with `nki`: and the NKI experts loadable); otherwise the calling test
    fails, naming what is missing."""
    import torch

    reason = devices.unavailable_reason("neuron")
    if reason:
        pytest.fail(f"the Neuron stack is installed but not working: {reason}", pytrace=False)
    try:
        torch.empty(1, device="neuron")
    except Exception as e:
        pytest.fail(f"torch-neuronx imports, but no tensor can be made on the Neuron device ({type(e).__name__}: {e})",
                    pytrace=False)  # fmt: skip
    if nki:
        from qwen3_neuron.kernels.moe.nki import nki_available

        ok, why = nki_available()
        if not ok:
            pytest.fail(f"the Neuron device works but the NKI experts cannot load: {why}", pytrace=False)
    return torch.device("neuron")
