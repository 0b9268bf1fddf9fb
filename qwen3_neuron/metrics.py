"""torchtitan's MetricsProcessor, also writing each logged step to `<run dir>/metrics.jsonl`.

The records come from the metrics dict torchtitan hands to its own loggers (TensorBoard/W&B), so
they are the numbers torchtitan printed, not text parsed back out of a log. Only the rank that
torchtitan picks for metrics writes the file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.metrics import BaseLogger, MetricsProcessor, _get_metrics_rank
from torchtitan.config.override import derive, override

METRICS_FILE = "metrics.jsonl"

# torchtitan metric name -> metrics.jsonl field
_FIELDS = {
    "loss_metrics/global_avg_loss": "loss",
    "loss_metrics/global_max_loss": "max_loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "tps_per_device",
    "tflops": "tflops_per_device",
    "memory/max_reserved(GiB)": "peak_memory_gib",
}


class JsonlLogger(BaseLogger):
    """One JSON record per logged step, flushed at once so a killed run keeps its history."""

    def __init__(self, path: str, world_size: int, non_data_parallel_size: int):
        self._file = open(path, "a", encoding="utf-8")
        # torchtitan's tps is per device: the job's tokens/s is tps x data-parallel ranks.
        self._data_parallel_ranks = world_size // non_data_parallel_size
        self._start = time.time()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record: dict[str, Any] = {"step": step}
        record.update({name: float(metrics[key]) for key, name in _FIELDS.items() if key in metrics})
        if "tps_per_device" in record:
            record["tokens_per_second"] = record["tps_per_device"] * self._data_parallel_ranks
        record["elapsed_seconds"] = time.time() - self._start
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
        metrics_rank = _get_metrics_rank(
            parallel_dims=parallel_dims, pp_schedule=kwargs.get("pp_schedule", "1F1B")
        )
        if torch.distributed.get_rank() == metrics_rank:
            jsonl = JsonlLogger(
                os.path.join(dump_folder, METRICS_FILE),
                world_size=parallel_dims.world_size,
                non_data_parallel_size=parallel_dims.non_data_parallel_size,
            )
            self.logger = _Both(self.logger, jsonl)


@override(target=MetricsProcessor.Config, description="metrics.jsonl in the run dir")
def run_dir_metrics(config: MetricsProcessor.Config) -> RunDirMetricsProcessor.Config:
    return derive(config, RunDirMetricsProcessor.Config)
