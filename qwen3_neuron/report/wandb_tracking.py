"""tracking=wandb: each run in Weights & Biases, while it trains, through the W&B client.

`WandbRun` is W&B's side of the launcher's writer (report.tracking), as `MLflowRun` is MLflow's:
the W&B run starts when the workers start, with the resolved job as its config, in the project
`tracking.experiment`; every `metrics.jsonl` record goes in with its step as the x axis (the
`step` metric: a step that a resume trains again is logged again, as MLflow keeps both); when the
job ends, its summary's figures, status and error in the run's summary (`tracking.log_model=true`:
the HF export and a LoRA run's adapter as a `model` artifact), and the run ends, failed unless it
completed. A sweep is one W&B group, its jobs the group's runs; the run's id is kept in the run
dir's `wandb_run.json` with how much of metrics.jsonl it holds: a resume continues the same run.
W&B's own files are in the run dir's `wandb/` (WANDB_MODE=offline: the whole run, for `wandb
sync`); its own system metrics are on unless `tracking.system_metrics=false`. W&B's variables
(WANDB_MODE, WANDB_ENTITY, WANDB_API_KEY, WANDB_BASE_URL) work as usual.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

from qwen3_neuron.eval.objective import objective_value
from qwen3_neuron.job.settings import TrackingSettings
from qwen3_neuron.run_dir import WANDB_RUN_FILE, read_json, write_json

SUMMARY_FIELDS = ("status", "error", "steps", "final_loss", "tokens_per_second", "mfu", "peak_memory_gib",
                  "wall_seconds", "export_dir", "adapter_dir")  # fmt: skip
MODEL_FOLDERS = {"export_dir": "hf_export", "adapter_dir": "peft_adapter"}  # tracking.log_model


class WandbRun:
    """The W&B run of the job in `run_dir` (report.tracking.TrackedRun): the one its
    `wandb_run.json` names (a resume), else a new one (a sweep job: in the sweep's group).
    `live`: the job trains (W&B samples the system meanwhile)."""

    label = "W&B"

    def __init__(self, settings: TrackingSettings, run_dir: Path, job: Mapping[str, Any], sweep_dir: Path | None,
                 live: bool = True):  # fmt: skip
        self.settings, self.run_dir, self.job, self.sweep_dir, self.live = settings, run_dir, job, sweep_dir, live
        mode = os.environ.get("WANDB_MODE", "online")
        self.store = f"W&B ({mode}, project {settings.experiment})"
        self.offset = 0
        self._run = None
        self._record: dict[str, Any] = {}

    def open(self) -> None:
        import wandb

        record = read_json(self.run_dir / WANDB_RUN_FILE) or {}
        if record.get("project") != self.settings.experiment:  # a new run (W&B names it), or moved to another project
            record = {"run_id": None, "project": self.settings.experiment, "metrics_bytes": 0}
        group = "/".join(self.sweep_dir.parts[-2:]) if self.sweep_dir else None
        name = self.settings.run_name or "/".join(self.run_dir.parts[-2:])
        if group is not None:
            name = f"{self.settings.run_name or group}/{self.run_dir.name}"
        stats = self.live and self.settings.system_metrics  # W&B's own system metrics, while the job trains
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=not stats)
        self._run = wandb.init(project=self.settings.experiment, name=name, group=group, config=dict(self.job),
                               id=record["run_id"], resume="allow", dir=str(self.run_dir),
                               settings=settings)  # fmt: skip
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")  # the run's steps, as logged (a resume's again)
        record["run_id"] = self._run.id
        self._record, self.offset = record, record["metrics_bytes"]
        write_json(self.run_dir / WANDB_RUN_FILE, record)

    def send(self, records: list[dict[str, Any]], offset: int) -> None:
        for record in records:
            self._run.log({name: value for name, value in record.items()
                           if isinstance(value, (int, float)) and not isinstance(value, bool)})  # fmt: skip
        self._record["metrics_bytes"] = self.offset = offset
        write_json(self.run_dir / WANDB_RUN_FILE, self._record)

    def close(self, summary: dict[str, Any]) -> None:
        import wandb

        run = self._run
        run.summary.update({key: summary[key] for key in SUMMARY_FIELDS if summary.get(key) is not None})
        objective = (self.job.get("run") or {}).get("objective", "final_loss")
        value = objective_value(summary, objective) if summary.get("status") == "completed" else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            run.summary["objective"] = value
        if self.settings.log_model and any(summary.get(field) for field in MODEL_FOLDERS):
            artifact = wandb.Artifact(f"model-{run.id}", type="model")
            for field, folder in MODEL_FOLDERS.items():
                if summary.get(field):
                    artifact.add_dir(summary[field], name=folder)
            run.log_artifact(artifact)
        where = f"offline in {Path(run.dir).parent} (wandb sync uploads it)" if run.offline else run.url
        run.finish(exit_code=0 if summary.get("status") == "completed" else 1)
        print(f"[qwen3-neuron] W&B: run {run.id} of project '{self.settings.experiment}': {where}", flush=True)
