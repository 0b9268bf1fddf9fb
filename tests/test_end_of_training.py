"""A run ends when its slowest rank does: torchtitan's fixed 2 s sleep at the end of `train()` is
taken out of its trainer module, and every other use of `time` there is untouched."""

from __future__ import annotations

import inspect
import time

import torchtitan.trainer as trainer_module

from qwen3_neuron.worker.end_of_training import skip_the_closing_sleep


def test_the_closing_sleep_of_torchtitans_train_is_skipped_and_nothing_else(monkeypatch):
    assert "time.sleep(2)" in inspect.getsource(trainer_module.Trainer.train)  # what is skipped
    monkeypatch.setattr(trainer_module, "time", trainer_module.time)  # restored after the test
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)

    skip_the_closing_sleep()
    skip_the_closing_sleep()
    trainer_module.time.sleep(2)
    trainer_module.time.sleep(0.5)

    assert slept == [0.5]
    assert trainer_module.time.perf_counter is time.perf_counter
    assert trainer_module.time.monotonic is time.monotonic
