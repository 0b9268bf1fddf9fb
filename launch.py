"""The entrypoint: compose -> plan -> record -> launch -> report.

    python launch.py model=native training.steps=50
    python launch.py -m optimizer.lr=1e-3,3e-4
    python launch.py run.dry_run=true

Hydra runs here only; workers rebuild their config from the run dir (qwen3_neuron.train).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qwen3_neuron import compose, slurm
from qwen3_neuron.export import ExportError, export_after_training
from qwen3_neuron.fields import ConfigError
from qwen3_neuron.hydra_callbacks import sweep_exit_code
from qwen3_neuron.launcher import run_torchrun
from qwen3_neuron.loss_check import check_run
from qwen3_neuron.metrics import METRICS_FILE
from qwen3_neuron.peak_flops import peak_for_plan, write_run_dir_peak
from qwen3_neuron.plan import make_plan
from qwen3_neuron.progress import Progress
from qwen3_neuron.record import write_record
from qwen3_neuron.report import summarize, sweep_job_value, sweep_stop_reason, write_summary
from qwen3_neuron.resume import resumed_config

compose.register()
sys.path.insert(0, os.getcwd())  # as `python -m` does: a user's kernel module beside them imports


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """A single run exits with its status; a sweep job returns its objective to the sweeper
    (None when it failed: recorded, and the sweep goes on unless run.stop_on_failure)."""
    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir).resolve()
    single_run = hydra_config.mode == RunMode.RUN
    label = "" if single_run else f"#{hydra_config.job.num}"  # Hydra printed its overrides just above
    sweep_dir = None if single_run else Path(hydra_config.sweep.dir).resolve()
    stopped_by = sweep_dir and sweep_stop_reason(sweep_dir)
    if stopped_by:
        write_summary(run_dir, summarize(run_dir, "skipped", 0.0, error=f"not run: {stopped_by}"))
        return None
    try:
        composed = OmegaConf.to_container(cfg, resolve=True)
        if composed["run"]["resume"]:
            composed = resumed_config(run_dir, composed, list(hydra_config.overrides.task))
        composed = slurm.with_node_settings(composed)  # SLURM: this node's rank and rendezvous
        plan = make_plan(composed, run_dir)
    except (ConfigError, OmegaConfBaseException) as e:
        print(f"Config error: {e}", file=sys.stderr)
        if single_run:
            _discard_hydra_only_dir(run_dir)
            sys.exit(2)
        # a sweep job: its dir stays, with a summary the sweep table reads
        summary = summarize(run_dir, "failed", 0.0, error=f"config error: {e}", exit_code=2)
        write_summary(run_dir, summary)
        stop = OmegaConf.select(cfg, "run.stop_on_failure", default=False) is True
        return sweep_job_value(summary, "final_loss", stop_on_failure=stop, sweep_dir=sweep_dir, job=label)

    write_record(run_dir, {**composed, "device": {"type": plan.device}}, plan)
    run = plan.settings.run
    if run.dry_run:
        _print_plan(plan, run_dir)
        return None

    write_run_dir_peak(run_dir, peak_for_plan(plan), ranks=plan.world_size)
    progress = None if run.verbose else Progress(run_dir / METRICS_FILE, plan.trainer_config.training.steps, label)
    start = time.time()
    result = run_torchrun(plan.command, plan.env, run_dir, progress=progress)
    if run.node_rank > 0:  # multi-node: node 0 exports, checks and writes the job's summary
        print(f"[qwen3-neuron] node {run.node_rank}: torchrun exited {result.returncode}; node 0 reports the job")
        if single_run:
            sys.exit(result.returncode)
        return None
    status = "interrupted" if result.interrupted_by else ("completed" if result.returncode == 0 else "failed")
    exit_code, extra = result.returncode, {}
    if result.interrupted_by:
        extra["error"] = f"interrupted by {result.interrupted_by}"
    if status == "completed":  # every rank has finished writing: the HF save is complete
        try:
            export_dir = export_after_training(plan.trainer_config, run_dir, plan.settings.hf.export_dir)
            extra["export_dir"] = str(export_dir) if export_dir else None
        except ExportError as e:
            print(f"[qwen3-neuron] export failed: {e}", file=sys.stderr)
            status, exit_code, extra["error"] = "failed", 1, f"export failed: {e}"
    summary = summarize(
        run_dir, status, time.time() - start,
        exit_code=exit_code, overrides=plan.replacements_by_override(), **extra,
    )  # fmt: skip
    mode = plan.settings.hf.first_loss_check
    verdict = check_run(summary["first_loss"], plan.trainer_config, mode, warn=lambda m: print(m, file=sys.stderr))
    if verdict.fails(mode):
        exit_code = exit_code or 1
        summary.update(status="failed", exit_code=exit_code, error=summary["error"] or verdict.message)
    summary.update(verdict.summary_fields(mode))  # first_loss, random_init_loss_reference, first_loss_check
    write_summary(run_dir, summary)
    print(f"[qwen3-neuron] {_one_line(summary)}\n[qwen3-neuron] run dir: {run_dir}")
    if single_run:
        sys.exit(exit_code or (1 if summary["status"] != "completed" else 0))
    return sweep_job_value(summary, run.objective, stop_on_failure=run.stop_on_failure, sweep_dir=sweep_dir, job=label)


def _one_line(summary: dict) -> str:
    shown = {k: v for k, v in summary.items() if k != "overrides" and v is not None}
    return f"{summary['status']}: {json.dumps(shown)}"


def _print_plan(plan, run_dir: Path) -> None:
    config = plan.trainer_config.to_dict()
    spec = config["model_spec"]
    config["model_spec"] = f"{spec['name']} {spec['flavor']} (full model config: trainer_config.json)"
    print(json.dumps(config, indent=2, default=repr))
    print(f"\n[qwen3-neuron] device: {plan.device}, world size {plan.world_size}")
    for line in plan.replacements:
        print(f"[qwen3-neuron] {line}")
    for note in plan.notes:
        print(f"[qwen3-neuron] note: {note}")
    print(f"[qwen3-neuron] command: {plan.command_line()}")
    print(f"[qwen3-neuron] dry run: nothing started; record in {run_dir}")


def _discard_hydra_only_dir(run_dir: Path) -> None:
    """A config error leaves nothing behind: drop the run dir Hydra made for this launch."""
    if not run_dir.exists() or {p.name for p in run_dir.iterdir()} - {".hydra", "launch.log"}:
        return
    shutil.rmtree(run_dir)
    if not any(run_dir.parent.iterdir()):
        run_dir.parent.rmdir()  # the date folder, if this launch made it


if __name__ == "__main__":
    main()
    sys.exit(sweep_exit_code())  # reached after a multirun only: 1 if any job failed
