"""tracking=mlflow's system metrics, by MLflow's names (`system/...`), beside the run's own.

MLflow's own monitor (`SystemMetricsMonitor`, what `mlflow.enable_system_metrics_logging` starts)
samples in a thread of the launcher every `tracking.interval_seconds` (MLflow's
MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL wins): the node's CPU and memory, its network, and an
NVIDIA or AMD GPU's figures where their library is installed (nvidia-ml-py). Here its disk figures
are the run dir's filesystem (MLflow's own read `/`), and two kinds are added:

- each rank's memory: `system/rank_<N>/memory_rss_megabytes`, the resident memory of the worker
  process of rank N (torchrun's children; on a GPU or NeuronCore, the host's side of it);
- device=neuron: `neuron-monitor`'s (AWS's Neuron tools) NeuronCore utilization
  (`system/neuroncore_<i>_utilization_percentage`) and the Neuron device memory in use
  (`system/neuron_device_memory_usage_megabytes`); where it is not installed, one line says so.

A GPU run without nvidia-ml-py says so in one line too. The monitor stops with the run (its
status leaves RUNNING) or at `finish`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

import psutil
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from qwen3_neuron.parent_death import child_dies_with_this_process

NEURON_MONITOR = "/opt/aws/neuron/bin/neuron-monitor"  # where aws-neuronx-tools installs it


class SystemMetrics:
    """MLflow's monitor on a run, with what this module adds; `finish` stops it all."""

    def __init__(self, monitor: SystemMetricsMonitor, neuron: NeuronCores | None):
        self._monitor, self._neuron = monitor, neuron

    def finish(self) -> None:
        self._monitor.finish()  # its last samples logged
        if self._neuron is not None:
            self._neuron.close()


def start_system_metrics(uri: str, run_id: str, run_dir: Path, job: Mapping[str, Any], workers_pid: int,
                         interval_seconds: float) -> SystemMetrics:  # fmt: skip
    """Sampling starts now, into `run_id` of `uri`, its steps after any the run has (a resume)."""
    logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)  # a store that fails: the writer says it
    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_seconds, resume_logging=True, tracking_uri=uri)
    monitor.monitors = [RunDirDisk(run_dir) if isinstance(m, DiskMonitor) else m for m in monitor.monitors]
    monitor.monitors.append(RankMemory(workers_pid))
    device = (job.get("device") or {}).get("type")
    if device == "cuda" and not any(type(m).__name__ in ("GPUMonitor", "ROCMMonitor") for m in monitor.monitors):
        _say("no GPU figures among the system metrics: MLflow's GPU monitor needs nvidia-ml-py "
             "(pip install nvidia-ml-py)")
    neuron = None
    if device == "neuron":
        command = shutil.which("neuron-monitor") or (NEURON_MONITOR if os.access(NEURON_MONITOR, os.X_OK) else None)
        if command is None:
            _say("no NeuronCore figures among the system metrics: neuron-monitor is not installed (AWS's "
                 f"aws-neuronx-tools package puts it in {Path(NEURON_MONITOR).parent})")  # fmt: skip
        else:
            neuron = NeuronCores(command, interval_seconds)
            monitor.monitors.append(neuron)
    monitor.start()
    return SystemMetrics(monitor, neuron)


def neuron_figures(report: Mapping[str, Any]) -> dict[str, float]:
    """One neuron-monitor report (its JSON line) as system metrics: each NeuronCore's utilization
    (percent) and the Neuron device memory the runtimes use (MB), over every runtime it reports."""
    figures: dict[str, float] = {}
    device_bytes = None
    for runtime in report.get("neuron_runtime_data") or []:
        groups = runtime.get("report") or {}
        cores = (groups.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        for index, core in cores.items():
            figures[f"neuroncore_{index}_utilization_percentage"] = float(core["neuroncore_utilization"])
        used = ((groups.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}).get("neuron_device")
        if used is not None:
            device_bytes = (device_bytes or 0) + used
    if device_bytes is not None:
        figures["neuron_device_memory_usage_megabytes"] = device_bytes / 1e6
    return figures


class RunDirDisk(DiskMonitor):
    """MLflow's disk figures, of the run dir's filesystem (the one a full disk stops training on)."""

    def __init__(self, run_dir: Path):
        super().__init__()
        self._run_dir = str(run_dir)

    def collect_metrics(self):
        usage = psutil.disk_usage(self._run_dir)
        self._metrics["disk_usage_percentage"].append(usage.percent)
        self._metrics["disk_usage_megabytes"].append(usage.used / 1e6)
        self._metrics["disk_available_megabytes"].append(usage.free / 1e6)


class RankMemory(BaseMetricsMonitor):
    """Each rank's resident memory, the highest sample of the period. torchrun's children are the
    ranks: exec'd ones carry torchrun's RANK variable; a CPU job's ranks, forked from its agent
    (`worker.forked_torchrun`) in local-rank order, share the agent's command line and are named by
    that order (node 0's local ranks are the global ones)."""

    def __init__(self, workers_pid: int):
        super().__init__()
        self._workers_pid = workers_pid

    def collect_metrics(self):
        try:
            torchrun = psutil.Process(self._workers_pid)
            agent = torchrun.cmdline()
            children = sorted(torchrun.children(), key=lambda p: (p.create_time(), p.pid))
        except psutil.Error:  # torchrun has exited
            return
        forked = 0
        for child in children:
            try:
                rank = child.environ().get("RANK")
                if rank is None and child.cmdline() == agent:
                    rank, forked = str(forked), forked + 1
                rss = child.memory_info().rss
            except psutil.Error:  # gone meanwhile
                continue
            if rank is not None:
                self._metrics[f"rank_{rank}/memory_rss_megabytes"].append(rss / 1e6)

    def aggregate_metrics(self):
        return {name: round(max(values), 1) for name, values in self._metrics.items()}


class NeuronCores(BaseMetricsMonitor):
    """neuron-monitor running beside the run; its latest report is the sample."""

    def __init__(self, command: str, interval_seconds: float):
        super().__init__()
        config = {"period": f"{max(1, round(interval_seconds))}s", "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"}]}]}  # fmt: skip
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
        self._config = f.name
        self._latest: dict[str, Any] = {}
        self._process = subprocess.Popen([command, "-c", self._config], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True,
                                         preexec_fn=child_dies_with_this_process())  # fmt: skip
        threading.Thread(target=self._read, name="neuron-monitor", daemon=True).start()

    def _read(self):
        for line in self._process.stdout:
            try:
                self._latest = json.loads(line)
            except ValueError:
                continue

    def collect_metrics(self):
        for name, value in neuron_figures(self._latest).items():
            self._metrics[name].append(value)

    def aggregate_metrics(self):
        return {name: round(sum(values) / len(values), 1) for name, values in self._metrics.items()}

    def close(self):
        self._process.terminate()
        Path(self._config).unlink(missing_ok=True)


def _say(line: str) -> None:
    print(f"[qwen3-neuron] MLflow: {line}", file=sys.stderr, flush=True)
