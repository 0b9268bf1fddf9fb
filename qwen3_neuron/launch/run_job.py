"""One job, as Hydra hands it to launch.py: settle -> torchrun -> plan -> record -> train -> export -> report.

The job is settled here (`Job.settled`: the device, model=hf's dir, the NEFF cache, the
framework's own checks) and written (`job.yaml`, `command.sh`); torchrun starts at once, its
local rank 0 makes and records the plan from job.yaml once it has imported torchtitan, and every
rank builds only then (`handoff.Handoff`, `worker.rank0_plan`). This process never imports torchtitan for such a
run (an HF export is global rank 0's, after training). A plan that fails stops the workers and
removes what this launch wrote (a resumed run's earlier job.yaml and logs are put back), so a
config error leaves what it always did. Dry runs and `run.show_data` plan here and start nothing.
With tracking=mlflow|wandb this process is the job's one writer to the store: it follows
metrics.jsonl from when the workers build until the job's end (`report.tracking`).

A single run and each job of a sweep go through `run_job`, which returns the job's `JobOutcome`
(`report.outcome`). It never exits the process: Hydra's job-end callbacks and log flushing run
after it, and launch.py exits with `launch_exit_code` of the outcomes, for single runs and sweeps
alike.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qwen3_neuron.errors import ConfigError, DataError, RunDirInUse, user_error_label
from qwen3_neuron.process_exit import exit_without_teardown
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.record import record_job, record_plan
from qwen3_neuron.job.torchrun import WorkerLaunch, compile_cache_line, worker_launch
from qwen3_neuron.job.trainer_keys import check_trainer_keys
from qwen3_neuron.launch import slurm
from qwen3_neuron.launch.console import quiet_console
from qwen3_neuron.launch.workers_failed import WorkersFailed, workers_failed
from qwen3_neuron.launch.hydra_setup import register_resolvers
from qwen3_neuron.launch.process import LaunchResult, Torchrun
from qwen3_neuron.launch.progress import Progress
from qwen3_neuron.launch.resume import planned_schedule_end, resume_step, resumed_config, schedule_rule
from qwen3_neuron.launch.run_lock import RunDirLock
from qwen3_neuron.handoff import Handoff, PlannedRun
from qwen3_neuron.report.loss_check import check_first_loss
from qwen3_neuron.report.outcome import JobOutcome
from qwen3_neuron.report.peak_flops import peak_for_run, write_run_dir_peak
from qwen3_neuron.report.summary import summarize, summary_lines, sweep_job_value, sweep_stop_reason, write_summary
from qwen3_neuron.report.job_tracking import job_tracking, track_run
from qwen3_neuron.report.tracking import LiveTracking
from qwen3_neuron.run_dir import (
    COMMAND_FILE,
    EXPORT_FILE,
    JOB_FILE,
    LOCK_FILE,
    LOG_FILE,
    METRICS_FILE,
    PLAN_ONLY_FILE,
    RANKS_LOG_DIR,
    SUMMARY_FILE,
    TRAINER_CONFIG_FILE,
    earlier_run,
    read_job,
    read_json,
    summarize_replacements,
)

if TYPE_CHECKING:
    from qwen3_neuron.job.plan import Plan

CONFIG_ERROR_EXIT = 2


def run_job(cfg: DictConfig) -> JobOutcome:
    """One run, or one job of a sweep, from the config Hydra composed."""
    register_resolvers()  # a SLURM job resolves the config in a process of its own
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a user's kernel module beside them imports
    hydra_config = HydraConfig.get()
    hydra_job = _HydraJob(
        run_dir=Path(hydra_config.runtime.output_dir).resolve(),
        single_run=hydra_config.mode == RunMode.RUN,
        label="" if hydra_config.mode == RunMode.RUN else f"#{hydra_config.job.num}",
        sweep_dir=None if hydra_config.mode == RunMode.RUN else Path(hydra_config.sweep.dir).resolve(),
        cfg=cfg,
    )
    stopped_by = hydra_job.sweep_dir and sweep_stop_reason(hydra_job.sweep_dir)
    if stopped_by:
        summary = summarize(hydra_job.run_dir, "skipped", 0.0, error=f"not run: {stopped_by}")
        write_summary(hydra_job.run_dir, summary)
        return JobOutcome(1, single_run=False, summary=summary)
    try:  # before anything in the run dir is read or written: a live launch there owns it
        lock = RunDirLock.take(hydra_job.run_dir, _node_rank(cfg))
    except RunDirInUse as e:
        print(f"Run dir in use: {e}", file=sys.stderr)
        return JobOutcome(CONFIG_ERROR_EXIT, hydra_job.single_run)  # its owner's dir: nothing written, nothing removed
    try:
        refusal = _new_run_refusal(cfg, hydra_job.run_dir)
        if refusal:  # the earlier run's dir: nothing written, nothing removed
            print(f"Config error: {refusal}", file=sys.stderr)
            return JobOutcome(CONFIG_ERROR_EXIT, hydra_job.single_run)
        outcome = _run_job_in(cfg, hydra_job, hydra_config)
    finally:
        lock.release()
    plan_only = OmegaConf.select(cfg, "run.dry_run") or OmegaConf.select(cfg, "run.show_data")
    if plan_only and _sweeper_direction(hydra_config) is not None:  # Optuna: no trial would give it a value
        print("[qwen3-neuron] an Optuna search with run.dry_run=true or run.show_data stops after its first "
              "trial (above): nothing trains, so no trial gives Optuna a value to search on. Without -m a "
              "dry run shows one config's plan.", file=sys.stderr)  # fmt: skip
        exit_without_teardown(outcome.exit_code)  # before Optuna's end, which raises without a value
    return outcome


def _new_run_refusal(cfg: DictConfig, run_dir: Path) -> str | None:
    """Why a new run may not start in `run_dir`: it holds a run already, which only its resume
    may continue (node 0 asks; the other nodes of a job join the dir node 0 starts)."""
    if OmegaConf.select(cfg, "run.resume") is not None or _node_rank(cfg) > 0:
        return None
    evidence = earlier_run(run_dir)
    if evidence is None:
        return None
    summary = read_json(run_dir / SUMMARY_FILE) or {}
    ended = f"{summary['status']} after {summary.get('steps')} steps" if "status" in summary else "it has no summary: interrupted or still starting"
    return (
        f"run dir {run_dir} holds a run already ({evidence}; {ended}); a new run never writes into "
        f"another's dir. To continue or extend that run: run.resume={run_dir} (training.steps=N "
        "trains on to step N). For a new run: leave hydra.run.dir unset, or name a dir of its own."
    )


def _node_rank(cfg: DictConfig) -> int:
    """This node's rank (a SLURM task's from its environment): each node locks the run dir apart."""
    try:
        return int(slurm.with_node_settings({"run": OmegaConf.to_container(cfg.run, resolve=True)})["run"]["node_rank"])
    except (ConfigError, OmegaConfBaseException, KeyError, TypeError, ValueError):
        return 0  # a bad value: the job's settings name it, holding node 0's lock meanwhile


def _run_job_in(cfg: DictConfig, hydra_job: _HydraJob, hydra_config) -> JobOutcome:
    """The job, once it owns its run dir."""
    workers = None
    try:
        composed = OmegaConf.to_container(cfg, resolve=True)
        if composed["run"]["resume"]:
            rescored = _rescore_completed(hydra_job.run_dir, composed, list(hydra_config.overrides.task))
            if rescored is not None:  # a completed run, evaluated again: nothing trains
                return JobOutcome(rescored, hydra_job.single_run)
            composed = resumed_config(hydra_job.run_dir, composed, list(hydra_config.overrides.task))
            step, steps = resume_step(hydra_job.run_dir, composed), composed["training"]["steps"]
            if step >= steps:  # the run dir, its summary included, stays as it is
                print(f"[qwen3-neuron] run.resume: nothing left to train: its checkpoint step-{step} is at "
                      f"training.steps={steps} (training.steps=N trains on to step N)")  # fmt: skip
                return JobOutcome(0, hydra_job.single_run)
            end = composed.get("lr_scheduler", {}).get("total_steps") or planned_schedule_end(hydra_job.run_dir, read_job(hydra_job.run_dir))
            print(f"[qwen3-neuron] run.resume: training on to step {steps}; {schedule_rule(end, steps)}")
        parsed = Job.parse(slurm.with_node_settings(composed))  # SLURM: this node's rank and rendezvous
        check_trainer_keys(parsed.composed, parsed.settings)  # torchtitan's sections: typos need no torchtitan
        job = parsed.settled()  # once, for every worker: no torchtitan needed, named before anything starts
        launch = worker_launch(job, hydra_job.run_dir)
        if job.settings.run.dry_run or job.settings.run.show_data:  # nothing trains: planned here, nothing started
            return _plan_only(job, launch, parsed.settings.device.cache_dir, hydra_job)
        evaluation = _evaluation(job, _sweeper_direction(hydra_config))
        # local rank 0 plans from job.yaml; a refusal puts back what the run dir held
        workers = _Workers(job, launch, hydra_job.run_dir)
        planned = workers.wait_for_plan()  # local rank 0's plan
    except BaseException as e:  # waiting workers never outlive a launch that cannot go on
        crashed = isinstance(e, WorkersFailed)
        if workers is not None:
            workers.discard(keep_logs=crashed)  # a crash's message points at train.log
        stop_on_failure = OmegaConf.select(cfg, "run.stop_on_failure") is True
        if crashed:
            return hydra_job.failed_before_training(e, stop_on_failure)
        if not isinstance(e, (ConfigError, DataError, OmegaConfBaseException)):
            raise
        return hydra_job.config_error(e, stop_on_failure)
    return hydra_job.train(job, planned, workers, evaluation)


def _evaluation(job: Job, direction: str | None):
    """eval=lm_eval: lm-eval's task registry with the run's tasks checked (names, cached data,
    the objective's metric and direction) and an export planned; None for eval=none. Seconds
    (lm-eval indexes its task YAMLs): only runs that evaluate pay them, kept for the evaluation."""
    settings = job.settings
    if settings.eval.kind == "none":
        return None
    from qwen3_neuron.eval.objective import PREFIX, check_objective_metric
    from qwen3_neuron.eval.run import check_export_planned, prepare

    check_export_planned(job.composed)
    manager = prepare(settings.eval, job.device)
    if settings.run.objective.startswith(PREFIX):
        check_objective_metric(settings.run.objective, settings.eval, manager, direction)
    return manager


def _rescore_completed(run_dir: Path, composed: dict, typed_overrides: list[str]) -> int | None:
    """run.resume of a completed run with new eval.*: its exit code once evaluated; else None."""
    from qwen3_neuron.eval.completed_run import rescore_settings
    from qwen3_neuron.eval.run import evaluation_device, local_device, rescore

    settings = rescore_settings(run_dir, composed, typed_overrides)
    if settings is None:
        return None
    device = evaluation_device(settings, local_device())
    return rescore(run_dir, settings, read_json(run_dir / SUMMARY_FILE), device, bool(composed["run"]["verbose"]))


def _sweeper_direction(hydra_config) -> str | None:
    """Optuna's hydra.sweeper.direction (the basic sweeper has none)."""
    direction = OmegaConf.select(hydra_config, "sweeper.direction", default=None)
    return str(direction) if direction is not None and hydra_config.mode != RunMode.RUN else None


def _plan_only(job: Job, launch: WorkerLaunch, requested_cache: str | None, hydra_job: _HydraJob) -> JobOutcome:
    """A dry run or `run.show_data` of the settled `job`: the plan, made and recorded here
    (importing torchtitan). `requested_cache`: device.cache_dir as the user set it."""
    from qwen3_neuron.job.checks.torchtitan_api import check_torchtitan_api

    settings = job.settings
    check_torchtitan_api(settings.model.kind)  # before the plan's modules import those APIs
    from qwen3_neuron.job.plan import make_plan  # imports torchtitan (seconds)

    quiet_console(settings.run.verbose)
    plan = make_plan(job, hydra_job.run_dir, launch.nproc_per_node)
    _evaluation(job, None)
    record_job(hydra_job.run_dir, job, launch.command_line())
    record_plan(plan, hydra_job.run_dir, [])  # its warnings: printed as it made them
    what = "run.dry_run=true" if settings.run.dry_run else f"run.show_data={settings.run.show_data}"
    (hydra_job.run_dir / PLAN_ONLY_FILE).write_text(
        f"{what}: the plan recorded here (job.yaml, trainer_config.json, command.sh) never trained. "
        "A launch pointed at this dir may use it.\n"
    )
    if settings.run.dry_run:
        _print_plan(plan, launch, compile_cache_line(requested_cache, launch), hydra_job.run_dir, settings.run.verbose)
        if plan.refusal:  # the record stays: the plan is what the user asked to see
            print(f"Config error: {plan.refusal}\n(a dry run: the plan above; a launch would stop here)", file=sys.stderr)
            return JobOutcome(CONFIG_ERROR_EXIT, hydra_job.single_run)
    else:
        _show_data(plan, settings.run.show_data)
    return JobOutcome(0, hydra_job.single_run)


class _Workers:
    """This node's torchrun, started before the plan: its local rank 0 plans the job recorded in
    job.yaml and the other ranks wait (`handoff.Handoff`)."""

    def __init__(self, job: Job, launch: WorkerLaunch, run_dir: Path):
        """The settled `job` recorded, then torchrun, with its local rank 0 to plan it: before
        any torchtitan import here."""
        self.launch, self.run_dir = launch, run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        # what a resumed run's dir already holds: the progress line skips it, a discard puts it back
        metrics, log = run_dir / METRICS_FILE, run_dir / LOG_FILE
        self.earlier_metrics_bytes = metrics.stat().st_size if metrics.exists() else 0
        self._earlier_log_bytes = log.stat().st_size if log.exists() else None
        self._earlier_rank_logs = _rank_logs(run_dir)
        self._earlier_record = {name: _read_bytes(run_dir / name) for name in (JOB_FILE, COMMAND_FILE)}
        record_job(run_dir, job, launch.command_line())
        self.handoff = Handoff(uuid.uuid4().hex, os.getpid())
        env = {**launch.env, **self.handoff.to_env()}
        self.torchrun = Torchrun(launch.command, env, run_dir, echo=job.settings.run.verbose)

    def wait_for_plan(self) -> PlannedRun:
        """Local rank 0's plan, its warnings printed here; its config error raised here."""
        planned = self.handoff.wait_for_plan(self.run_dir, alive=lambda: self.torchrun.process.poll() is None)
        if isinstance(planned, tuple):
            label, message = planned
            raise DataError(message) if label == "Data error" else ConfigError(message)
        if planned is None:  # local rank 0 crashed while planning (a bug), or a worker was killed
            raise workers_failed(self.run_dir, self.torchrun.wait(), self.torchrun.echo)
        for message in planned.messages:
            print(message, file=sys.stderr)
        return planned

    def go(self, progress: Progress | None) -> LaunchResult:
        """Let the workers build (the run dir holds what they read: peak_flops.json), wait for
        torchrun to exit; the plan files go with it."""
        (self.run_dir / PLAN_ONLY_FILE).unlink(missing_ok=True)  # a dry run's record, now replaced by this run's
        self.handoff.let_workers_build(self.run_dir)
        try:
            return self.torchrun.wait(progress)
        finally:
            self.handoff.remove_files(self.run_dir)

    def discard(self, keep_logs: bool = False) -> None:
        """The plan failed: stop the workers and remove what this launch wrote (a resumed run's
        earlier job.yaml, command.sh, train.log and rank logs stay as they were), its logs too
        unless `keep_logs`."""
        self.torchrun.stop()
        self.handoff.remove_files(self.run_dir)
        for name, earlier in self._earlier_record.items():  # a resume's record, or none
            if earlier is None:
                (self.run_dir / name).unlink(missing_ok=True)
            else:
                (self.run_dir / name).write_bytes(earlier)
        if keep_logs:
            return
        log = self.run_dir / LOG_FILE
        if self._earlier_log_bytes is None:
            log.unlink(missing_ok=True)
        else:
            os.truncate(log, self._earlier_log_bytes)
        for path in sorted(_rank_logs(self.run_dir) - self._earlier_rank_logs):  # parents first
            shutil.rmtree(path, ignore_errors=True)


def _read_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _rank_logs(run_dir: Path) -> set[Path]:
    """The rank-log dir and what it holds, two levels down: torchrun makes one folder per launch
    there (per node of a multi-node job: `node<N>/`)."""
    ranks = run_dir / RANKS_LOG_DIR
    if not ranks.is_dir():
        return set()
    return {ranks, *ranks.glob("*"), *ranks.glob("*/*")}


class _HydraJob:
    """This job as Hydra runs it: its run dir, and its place in a sweep (if it is in one)."""

    def __init__(self, run_dir: Path, single_run: bool, label: str, sweep_dir: Path | None, cfg: DictConfig):
        self.run_dir, self.single_run, self.label, self.sweep_dir = run_dir, single_run, label, sweep_dir
        self.cfg = cfg
        self.tracking: LiveTracking | None = None  # tracking=mlflow|wandb: the writer, while the job trains

    def track(self, summary: dict) -> None:
        """tracking=mlflow|wandb: the job's outcome in its tracked run, once its summary is written
        (a job that never trained: its run made now, the config Hydra composed standing in for a
        job.yaml this launch did not keep)."""
        if self.tracking is not None:
            self.tracking.finish(summary)
            return
        composed = None
        if not (self.run_dir / JOB_FILE).exists():
            try:
                composed = OmegaConf.to_container(self.cfg, resolve=True)
            except OmegaConfBaseException:
                composed = OmegaConf.to_container(self.cfg)
        track_run(self.run_dir, summary, composed, self.sweep_dir)

    def config_error(self, error: Exception, stop_on_failure: bool) -> JobOutcome:
        print(f"{user_error_label(error) or 'Config error'}: {error}", file=sys.stderr)
        if self.single_run:
            _discard_hydra_only_dir(self.run_dir)
            return JobOutcome(CONFIG_ERROR_EXIT, single_run=True)
        # a sweep job: its dir stays, with a summary the sweep table reads
        summary = summarize(self.run_dir, "failed", 0.0, error=f"config error: {error}", exit_code=CONFIG_ERROR_EXIT)
        write_summary(self.run_dir, summary)
        self.track(summary)
        value = sweep_job_value(
            summary, "final_loss", stop_on_failure=stop_on_failure, sweep_dir=self.sweep_dir, job=self.label
        )
        return JobOutcome(CONFIG_ERROR_EXIT, single_run=False, objective=value, summary=summary)

    def failed_before_training(self, failure: WorkersFailed, stop_on_failure: bool) -> JobOutcome:
        """The workers stopped before their plan was made, not for a mistake of the user's (a
        crash): said, and the run dir kept with their logs."""
        print(failure.message, file=sys.stderr)
        summary = summarize(self.run_dir, "failed", 0.0, exit_code=failure.exit_code)
        write_summary(self.run_dir, summary)
        self.track(summary)
        value = None
        if not self.single_run:
            value = sweep_job_value(
                summary, "final_loss", stop_on_failure=stop_on_failure, sweep_dir=self.sweep_dir, job=self.label
            )
        return JobOutcome(failure.exit_code, self.single_run, value, summary)

    def train(self, job: Job, planned: PlannedRun, workers: _Workers, evaluation) -> JobOutcome:
        """`job`: settled; `workers`: waiting for go once their plan is made; `evaluation`:
        lm-eval's checked task registry (eval=lm_eval), or None."""
        settings, launch = job.settings, workers.launch
        run = settings.run
        if planned.checkpoint.get("checkpoint_loaded"):
            print(f"[qwen3-neuron] continuing from checkpoint {planned.checkpoint['checkpoint_loaded']} of {self.run_dir}")
            from qwen3_neuron.eval.run import set_aside_earlier_scores  # no lm-eval import

            aside = set_aside_earlier_scores(self.run_dir, read_json(self.run_dir / SUMMARY_FILE))
            if aside:
                print(f"[qwen3-neuron] the earlier model's scores moved to {aside}")
        # before any worker builds: their metrics compute MFU against it
        write_run_dir_peak(self.run_dir, peak_for_run(job.device, planned.dtype, launch.env), planned.world_size)
        if run.node_rank == 0:  # the job's one writer: node 0's launcher follows metrics.jsonl while it trains
            self.tracking = job_tracking(self.run_dir, job.composed, self.sweep_dir, workers.torchrun.process.pid)
            if self.tracking is not None:
                self.tracking.start()
        progress = None
        if not run.verbose:
            progress = Progress(
                self.run_dir / METRICS_FILE, planned.steps, self.label, earlier_bytes=workers.earlier_metrics_bytes
            )
        start = time.time()
        result = workers.go(progress)
        if run.node_rank > 0:  # multi-node: node 0 exports, checks and writes the job's summary
            print(f"[qwen3-neuron] node {run.node_rank}: torchrun exited {result.returncode}; node 0 reports the job")
            return JobOutcome(result.returncode, self.single_run)
        status = "interrupted" if result.interrupted_by else ("completed" if result.returncode == 0 else "failed")
        exit_code, extra = result.returncode, {}
        if status == "failed":
            failure = workers_failed(self.run_dir, result, run.verbose)
            print(failure.message, file=sys.stderr)
            exit_code = failure.exit_code
        if result.interrupted_by:
            extra["error"] = f"interrupted by {result.interrupted_by}"
        elif status == "failed" and result.log_error:  # a full disk: rank 0's failure.json is missing too
            extra["error"] = f"{result.log_error}; the end of the workers' output is printed above"
        if status == "completed" and planned.exports_hf:  # global rank 0 exported once training ended
            export = read_json(self.run_dir / EXPORT_FILE) or {"error": f"export failed: rank 0 wrote no {EXPORT_FILE}"}
            if "error" in export:
                status, exit_code, extra["error"] = "failed", 1, export["error"]
            else:
                extra.update(export)
        summary = summarize(
            self.run_dir, status, time.time() - start,
            exit_code=exit_code, planned_overrides=planned.replacements_by_override(), **planned.parameters,
            **planned.checkpoint, **extra,
        )  # fmt: skip
        mode = settings.hf.first_loss_check
        resumed = bool(planned.checkpoint.get("checkpoint_loaded"))  # step 1 was judged by the launch that trained it
        verdict = check_first_loss(
            summary["first_loss"], planned.vocab_size, planned.weights_loaded, mode,
            warn=(lambda m: None) if resumed else (lambda m: print(m, file=sys.stderr)),
        )  # fmt: skip
        if verdict.fails(mode) and not resumed:
            exit_code = exit_code or 1
            summary.update(status="failed", exit_code=exit_code, error=summary["error"] or verdict.message)
        summary.update(verdict.summary_fields(mode))  # first_loss, random_init_loss_reference, first_loss_check
        write_summary(self.run_dir, summary)
        if evaluation is not None and summary["status"] == "completed":  # the run is on record first
            from qwen3_neuron.eval.run import evaluate_run, evaluation_device

            device = evaluation_device(settings.eval, job.device)
            summary.update(evaluate_run(self.run_dir, settings.eval, summary, device, evaluation, run.verbose))
            exit_code = exit_code or (1 if summary["eval_error"] else 0)
            summary["exit_code"] = exit_code  # the job's, as a sweep that ran elsewhere reads it back
            write_summary(self.run_dir, summary)
        for line in [*summary_lines(summary), f"run dir: {self.run_dir} (every figure: summary.json)"]:
            print(f"[qwen3-neuron] {line}")
        self.track(summary)  # its line last: where the tracked run is
        code = exit_code or (1 if summary["status"] != "completed" else 0)
        value = None
        if not self.single_run:
            value = sweep_job_value(
                summary, run.objective, stop_on_failure=run.stop_on_failure, sweep_dir=self.sweep_dir, job=self.label
            )
        return JobOutcome(code, self.single_run, value, summary)


def _print_plan(plan: Plan, launch: WorkerLaunch, compile_cache: str | None, run_dir: Path, verbose: bool) -> None:
    """The plan, one line per fact; the memory verdict last (what a launch would be refused for)."""
    from qwen3_neuron.job.checks.layout import resolve_degrees  # torchtitan: imported by the plan already
    from qwen3_neuron.job.plan import starting_weights

    config = plan.trainer_config
    if verbose:
        full = config.to_dict()
        spec = full["model_spec"]
        full["model_spec"] = f"{spec['name']} {spec['flavor']} (full model config: trainer_config.json)"
        print(json.dumps(full, indent=2, default=repr))

    def say(line: str) -> None:
        print(f"[qwen3-neuron] {line}")

    counts, training, settings = plan.parameters, config.training, plan.settings
    trainable = counts["trainable_parameters"]
    say(f"model: {config.model_spec.name} {config.model_spec.flavor} (model={settings.model.kind}), "
        f"{counts['total_parameters']:,} parameters, "
        + ("all trainable" if trainable == counts["total_parameters"] else f"{trainable:,} trainable"))  # fmt: skip
    say(f"weights: {starting_weights(config)}")
    degrees = resolve_degrees(config.parallelism, plan.world_size)
    layout = ", ".join(
        f"{name} {getattr(degrees, name)}" for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
        if getattr(degrees, name) > 1
    )  # fmt: skip
    say(f"device: {plan.device}, world size {plan.world_size}" + (f" ({layout})" if layout else ""))
    validation = f", validated every {config.validator.freq} steps" if config.validator.enable else ""
    say(f"training: {training.steps} steps of {training.local_batch_size} x {training.seq_len} tokens per rank, "
        f"data={settings.data.kind}, trainer={settings.trainer.name}{validation}")  # fmt: skip
    for line in summarize_replacements(plan.replacements):
        say(f"override: {line}")
    for line in (compile_cache, plan.static_shapes):
        if line:
            say(line)
    for line in tool_lines(config, settings):
        say(line)
    for note in plan.notes:
        say(f"note: {note}")
    say(f"command: {launch.command_line()}")
    shown = "" if verbose else "; run.verbose=true prints it too"
    say(f"dry run: nothing started; the full config: {run_dir / TRAINER_CONFIG_FILE}{shown}")
    for note in plan.memory.notes:  # what the estimate assumed (the attention kernel, the optimizer)
        say(f"memory: {note}")
    say(plan.memory.line())


def tool_lines(config, settings) -> list[str]:
    """grpo.tools / grpo.environment: what the policy may call, how often and for how long, and each
    tool's schema as the prompts carry it."""
    sources = [s for s in getattr(config.dataloader, "sources", ()) if getattr(s, "tools", None)]
    if settings.data.kind != "prompts" or not sources:
        return []
    grpo, schemas = settings.grpo, sources[0].tools
    names = ", ".join(schema["function"]["name"] for schema in schemas)
    environment = f"; {grpo.environment}: one instance per rollout" if grpo.environment else ""
    return [f"tools: {names}, at most {grpo.max_tool_calling_iterations} rounds of calls a completion "
            f"(grpo.max_tool_calling_iterations), {grpo.tool_timeout_s:g} s a call (grpo.tool_timeout_s)"
            f"{environment}; every prompt carries their schemas:",
            *(f"tool schema: {json.dumps(schema)}" for schema in schemas)]  # fmt: skip


def _show_data(plan: Plan, count: int) -> None:
    """run.show_data=N: rank 0's first N packed samples, in this process; nothing trains."""
    from qwen3_neuron.data.preview import show_samples
    from qwen3_neuron.job.checks.layout import resolve_degrees  # torchtitan: imported when needed only

    config = plan.trainer_config
    degrees = resolve_degrees(config.parallelism, plan.world_size)
    print(show_samples(config, count, dp_world_size=degrees.dp_replicate * degrees.dp_shard))
    print(f"[qwen3-neuron] run.show_data={count}: rank 0's first {count} samples shown; nothing trained")


def _discard_hydra_only_dir(run_dir: Path) -> None:
    """A config error leaves nothing behind: drop the run dir Hydra made for this launch."""
    if not run_dir.exists():
        return
    if {p.name for p in run_dir.iterdir() if not p.name.startswith(LOCK_FILE)} - {".hydra", "launch.log"}:
        return  # more than Hydra wrote (this launch's lock, released after, goes with the dir)
    shutil.rmtree(run_dir)
    if not any(run_dir.parent.iterdir()):
        run_dir.parent.rmdir()  # the date folder, if this launch made it
