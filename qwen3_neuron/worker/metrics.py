"""torchtitan's MetricsProcessor, also writing each logged step to `<run dir>/metrics.jsonl`.

The records come from the metrics dict torchtitan hands to its own loggers (TensorBoard/W&B), so
they are the numbers torchtitan printed, not text parsed back out of a log. Only the rank that
torchtitan picks for metrics writes the file.

MFU: torchtitan divides by a peak from its own GPU table (A100's for any device it does not
know, a CPU included). Here the peak is the one the launcher measured for this device, dtype and
thread count (`peak_flops.json` in the run dir, see qwen3_neuron.report.peak_flops), so the MFU that
torchtitan prints, logs to TensorBoard and that metrics.jsonl records is against that peak.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchtitan.components.metrics import BaseLogger, MetricsProcessor, _get_metrics_rank
from torchtitan.config.override import derive, override
from torchtitan.tools.logging import logger

from qwen3_neuron.run_dir import METRICS_FILE, PEAK_FLOPS_FILE, read_json

# torchtitan metric name -> metrics.jsonl field
_FIELDS = {
    "loss_metrics/global_avg_loss": "loss",
    "loss_metrics/global_max_loss": "max_loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "tps_per_device",
    "tflops": "tflops_per_device",
    "memory/max_reserved(GiB)": "peak_memory_gib",
    "time_metrics/data_loading(%)": "data_loading_pct",  # share of the logged interval spent waiting for data
    "data/rows_not_trained": "rows_not_trained",  # share of the rows this rank read that were dropped or skipped
}


_VALIDATION_LOSS = "validation_metrics/loss"


_PREFERENCE = "preference/"  # data=preference: the trainer's metrics (trainers.preference_step), val_ prefixed when held out
_VALIDATION_PREFERENCE = "validation_metrics/preference/"
_GRPO = "grpo/"  # data=prompts: the GRPO metrics (trainers.grpo), val_ prefixed when held out
_VALIDATION_GRPO = "validation_metrics/grpo/"


def validation_record(metrics: dict[str, Any], step: int) -> dict[str, Any]:
    """torchtitan's Validator result as its own record of the step (`read_metrics` merges the
    records of one step): the mean loss per label token over the validation batches, and its
    perplexity (data=preference: the mean DPO loss over the held-out pairs, and their rewards;
    data=prompts: the rewards of completions to the held-out prompts, no loss)."""
    grpo = {f"val_{key[len(_VALIDATION_GRPO):]}": float(value) for key, value in metrics.items()
            if key.startswith(_VALIDATION_GRPO)}  # fmt: skip
    if grpo:
        return {"step": step, **grpo}
    loss = float(metrics[_VALIDATION_LOSS])
    preference = {f"val_{key[len(_VALIDATION_PREFERENCE):]}": float(value) for key, value in metrics.items()
                  if key.startswith(_VALIDATION_PREFERENCE) and not key.endswith("/loss")}  # fmt: skip
    if preference:
        return {"step": step, "val_loss": loss, **preference}
    perplexity = math.exp(loss) if loss < 700 else math.inf  # exp overflows a float past ~709
    return {"step": step, "val_loss": loss, "val_perplexity": perplexity}


def _step_fields(metrics: dict[str, Any]) -> dict[str, float]:
    """The objective's own metrics of a step (DPO's, GRPO's), under their names without prefix."""
    return {key[len(prefix):]: float(value) for key, value in metrics.items() for prefix in (_PREFERENCE, _GRPO)
            if key.startswith(prefix) and not key.endswith("/loss")}  # fmt: skip


def _preference_line(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{key} {value:.4f}" for key, value in _step_fields(metrics).items())


class JsonlLogger(BaseLogger):
    """One JSON record per logged step, flushed at once so a killed run keeps its history."""

    def __init__(self, path: str, world_size: int):
        self._file = open(path, "a", encoding="utf-8")
        # torchtitan's tps is per device (the tokens of one data-parallel replica / its
        # non-data-parallel devices), so the job's tokens/s is tps x every rank.
        self._world_size = world_size
        self._start = time.time()
        self.flops_per_token: int | None = None  # set by the processor once the model is built

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if _VALIDATION_LOSS in metrics:
            self._write(validation_record(metrics, step))
            return
        record: dict[str, Any] = {"step": step}
        record.update({name: float(metrics[key]) for key, name in _FIELDS.items() if key in metrics})
        record.update(_step_fields(metrics))
        if "tps_per_device" in record:
            record["tokens_per_second"] = record["tps_per_device"] * self._world_size
        if self.flops_per_token:
            record["flops_per_token"] = self.flops_per_token
        mfu_percent = metrics.get("mfu(%)")
        if mfu_percent is not None and math.isfinite(mfu_percent):
            record["mfu"] = float(mfu_percent) / 100  # a fraction of the measured peak
        record["elapsed_seconds"] = time.time() - self._start
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _Both(BaseLogger):
    def __init__(self, *loggers: BaseLogger):
        self._loggers = loggers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for each in self._loggers:
            each.log(metrics, step)

    def close(self) -> None:
        for each in self._loggers:
            each.close()


class RunDirMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def __init__(self, config: Config, *, parallel_dims, dump_folder: str = "./outputs", **kwargs):
        super().__init__(config, parallel_dims=parallel_dims, dump_folder=dump_folder, **kwargs)
        self._jsonl: JsonlLogger | None = None
        metrics_rank = _get_metrics_rank(
            parallel_dims=parallel_dims, pp_schedule=kwargs.get("pp_schedule", "1F1B")
        )
        if torch.distributed.get_rank() == metrics_rank:
            self._jsonl = JsonlLogger(os.path.join(dump_folder, METRICS_FILE), world_size=parallel_dims.world_size)
            self.logger = _Both(self.logger, self._jsonl)
        # replace the peak torchtitan took from its GPU table (see the module docstring)
        peak = read_json(Path(dump_folder) / PEAK_FLOPS_FILE)
        self.gpu_peak_flops = peak["flops_per_second"] if peak else math.nan
        if peak:
            logger.info(
                f"[qwen3-neuron] MFU against {peak['flops_per_second']:.4g} FLOP/s per rank "
                f"({peak['source']}: {peak['device_name']}, {peak['dtype']}); torchtitan's "
                "'Peak FLOPS used for computing MFU' line below is its GPU table's and is not used"
            )

    step_metrics = None  # data=preference: () -> the step's objective metrics (trainers.preference_step), on every rank
    data_stats = None  # data=text|chat|mix|preference: () -> this rank's data counts (PackedDataLoader)

    def log(self, step: int, *args, **kwargs) -> None:
        if self._jsonl is not None:
            self._jsonl.flops_per_token = self.num_flops_per_token  # known once the model is built
        if self.step_metrics is not None:
            kwargs["extra_metrics"] = {**(kwargs.get("extra_metrics") or {}), **self.step_metrics()}
            logger.info("[qwen3-neuron objective] step %d: %s", step, _preference_line(kwargs["extra_metrics"]))
        stats = self.data_stats() if self.data_stats is not None else None
        if stats and stats["rows"]:
            not_trained = (stats["dropped"] + stats["skipped"]) / stats["rows"]
            kwargs["extra_metrics"] = {**(kwargs.get("extra_metrics") or {}), "data/rows_not_trained": not_trained}
        super().log(step, *args, **kwargs)


@override(target=MetricsProcessor.Config, description="metrics.jsonl in the run dir")
def run_dir_metrics(config: MetricsProcessor.Config) -> RunDirMetricsProcessor.Config:
    return derive(config, RunDirMetricsProcessor.Config)
