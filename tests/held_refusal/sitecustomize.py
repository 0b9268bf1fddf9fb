"""On PYTHONPATH for a launch (tests/test_bad_inputs.py): local rank 0 holds still right after
handing the launcher its plan's refusal, as a busy machine may deschedule it there, so that the
launcher's stop of the workers lands while rank 0 is still ending."""

import time

from qwen3_neuron.handoff import Handoff

HOLD_SECONDS = 3  # the launcher stops the workers within its 0.02 s poll of the refusal

_plan_failed = Handoff.plan_failed


def plan_failed(self, run_dir, label, message):
    _plan_failed(self, run_dir, label, message)
    time.sleep(HOLD_SECONDS)


Handoff.plan_failed = plan_failed
