"""The hardware tests skip only where no Neuron stack is installed: with torch-neuronx importable
but no working device (a half-installed trn2), they fail with the reason (tests/neuron_stack.py)."""

from __future__ import annotations

import importlib
import sys

import neuron_stack
import pytest


@pytest.mark.skipif(neuron_stack.INSTALLED, reason="torch-neuronx is installed here: the hardware tests run for real")
def test_a_half_installed_neuron_stack_fails_them_saying_why(tmp_path, monkeypatch):
    (tmp_path / "torch_neuronx").mkdir()
    (tmp_path / "torch_neuronx" / "__init__.py").write_text("")  # imports, registers no torch.neuron
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    try:
        assert importlib.reload(neuron_stack).INSTALLED  # so the tests run, and do not skip
        with pytest.raises(pytest.fail.Exception, match="installed but not working: .*did not register torch.neuron"):
            neuron_stack.working_device()
    finally:
        sys.modules.pop("torch_neuronx", None)
        monkeypatch.undo()
        importlib.reload(neuron_stack)
