"""run.measure_memory: one training step under torch's own tracker of every live tensor.

`torch.distributed._tools.mem_tracker.MemTracker` is a TorchDispatchMode: it sees every tensor
an op creates (temporaries included: the logits chunks, log-softmax outputs, their gradients,
FSDP's all-gathered parameters, the optimizer's working buffers) and attributes it to a category
(parameters, buffers, gradients, activations, temporaries, optimizer states, other). Its peak is
the tensor memory a step really needs, the figure the plan's estimate is held against. Parameters,
their gradients, the optimizer states and any other tensors held across steps (the DPO frozen
reference) are registered as external, so the peak counts them too.

One step is measured (the second: optimizer states exist by then, as in every later step; the
first when the run has one step); the dispatch mode's Python per op slows that step several
times, so it is opt-in and the step's time is left out of nothing else. On CUDA the allocator's
own `max_memory_allocated` / `max_memory_reserved` of the whole run are recorded beside it.
Only rank 0 writes `<run dir>/step_memory.json`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from qwen3_neuron.run_dir import STEP_MEMORY_FILE, write_json

GIB = 2**30
# MemTracker's categories -> the names the estimate and summary.json use
CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer",
    "Other": "other",
}


class StepMemory:
    """Wraps the trainer's `train_step`: the chosen step runs under MemTracker."""

    def __init__(self, trainer, measured_step: int, external: list[torch.Tensor]):
        self.trainer, self.measured_step, self.external = trainer, measured_step, external
        self._train_step = trainer.train_step
        self.calls = 0
        self.peak: dict[str, int] | None = None

    def train_step(self, data_iterator) -> None:
        self.calls += 1
        if self.calls != self.measured_step:
            return self._train_step(data_iterator)
        self.trainer.train_step = self._train_step  # later steps run untouched
        tracker = _StepTracker()
        tracker.track_external(*self.trainer.model_parts, *self.trainer.optimizers.optimizers, *self.external)
        with tracker:
            self._train_step(data_iterator)
        self.peak = _device_peak(tracker.get_tracker_snapshot("peak"), self.trainer.device)

    def record(self) -> dict | None:
        """The measured peak by category (GiB); CUDA's allocator peaks of the run too."""
        record: dict = {}
        if self.peak is not None:
            record = {
                "tracked_peak_gib": self.peak.get("Total", 0) / GIB,
                "step": self.measured_step,
                "method": "torch.distributed._tools.mem_tracker.MemTracker, peak of one step",
                "by_category_gib": {CATEGORIES.get(k, k): v / GIB for k, v in self.peak.items() if k != "Total"},
            }
        if self.trainer.device.type == "cuda":
            record["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(self.trainer.device) / GIB
            record["max_memory_reserved_gib"] = torch.cuda.max_memory_reserved(self.trainer.device) / GIB
        return record or None


def measure_one_step(trainer, steps: int, external: list[torch.Tensor] = ()) -> StepMemory:
    """Install the tracker on `trainer` (after any other seam that replaces `train_step`)."""
    meter = StepMemory(trainer, measured_step=2 if steps >= 2 else 1, external=list(external))
    trainer.train_step = meter.train_step
    return meter


def write_step_memory(meter: StepMemory, run_dir: Path) -> None:
    record = meter.record()
    if record is not None and int(os.environ.get("RANK", "0")) == 0:
        write_json(run_dir / STEP_MEMORY_FILE, record)


def _step_tracker_class():
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):
        """MemTracker, letting a module run forward again within the step from outside the model:
        torchtitan's chunked loss calls `lm_head` once per chunk, DPO runs the model twice. Only
        the per-module snapshots (not used here) lose those calls; the peak counts every tensor."""

        def _pre_fw_hook(self, module, inputs) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                return
            super()._pre_fw_hook(module, inputs)

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            for parameter in module.parameters():  # a frozen weight (LoRA's base) takes no gradient hook
                if not parameter.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(parameter, (_NO_HOOK, _NO_HOOK))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return StepTracker


class _NoHook:
    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _StepTracker():  # noqa: N802  (torch.distributed._tools is imported when a step is measured)
    return _step_tracker_class()()


def _device_peak(snapshot: dict, device: torch.device) -> dict[str, int]:
    """The peak snapshot of the trainer's device (a CPU run: the cpu entry)."""
    for snapshot_device, categories in snapshot.items():
        if snapshot_device.type == device.type:
            return categories
    return {"Total": 0}
