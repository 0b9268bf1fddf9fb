"""`run.resume=<run dir>`: continue an interrupted run from its newest complete checkpoint.

The run continues with the config it recorded (`job.yaml`), in its own run dir, so torchtitan's
checkpoint manager finds its `step-N` folders there and restores model, optimizer, scheduler,
data position and step. What the resuming command line may change: `run.*` but the rank count
(the recorded launch settings stay unless the command sets them) and `training.steps`
(to train longer), `checkpoint.load_step` (which checkpoint, for this launch only), `eval.*` (what
to evaluate after training; a completed run is only evaluated: eval/completed_run.py), `tracking.*` (where
the run is logged: with the recorded store, its MLflow run goes on); anything else it
sets must equal the recorded value, or the plan refuses.
A `step-N` folder without DCP's `.metadata` (written last) was cut while saving (kill -9, a full
disk) and is never picked, by torchtitan's own rule, which `complete_steps` mirrors to say where
the run will continue: a newer one than that is named, and where no complete one is left the
resume says to start again; a complete one whose files do not match its `.metadata` is skipped
too (`worker.checkpoint_check`).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.user_paths import absolute_paths
from qwen3_neuron.run_dir import JOB_FILE, TRAINER_CONFIG_FILE, complete_steps, read_job

CHANGEABLE_ON_RESUME = ("run", "training.steps", "checkpoint.load_step", "hydra", "eval", "tracking")
# the data position is saved per data-parallel rank: a resume runs on the ranks the run trained on
KEPT_ON_RESUME = ("run.nproc_per_node", "run.nnodes")


def resumed_config(run_dir: Path, composed: Mapping[str, Any], typed_overrides: list[str]) -> dict[str, Any]:
    """The recorded config of `run_dir`, with the changes the resuming command may make."""
    if run_dir != Path(composed["run"]["resume"]).expanduser().resolve():
        raise ConfigError(f"run.resume={composed['run']['resume']} is the run dir; do not set hydra.run.dir too.")
    if not (run_dir / JOB_FILE).exists():
        raise ConfigError(f"run.resume={run_dir}: not a run dir of this project (no {JOB_FILE}).")
    recorded = read_job(run_dir)
    composed = absolute_paths(dict(composed), os.getcwd())  # as the first launch recorded its paths
    folder = checkpoint_folder(run_dir, recorded)
    complete = complete_steps(folder)
    cut = [step for step in _saved_steps(folder) if step not in complete and (not complete or step > complete[-1])]
    if not complete:
        saves = recorded.get("checkpoint", {})
        periodic = saves.get("enable") and "interval" in saves  # checkpointing=periodic's keys
        if cut:
            why = (f" Its checkpoint {folder}/step-{cut[-1]} was cut while saving (no DCP .metadata, which is "
                   "written last: the run was killed or its disk filled while writing it), and it has no complete "
                   "one before it. Start the run again: the same command without run.resume, in a new run dir.")
        elif periodic:
            why = (f" It stopped before its first checkpoint (checkpoint.interval={saves['interval']}). Start "
                   "the run again: the same command without run.resume, in a new run dir.")
        else:
            why = " Checkpoints are written with checkpointing=periodic (every checkpoint.interval steps)."
            if saves.get("last_save_in_hf"):
                why += (" It only exported its model (checkpointing=export_hf without periodic): the export holds "
                        "the weights, not the optimizer, learning-rate schedule or data position a resume continues "
                        "with. To train on from those weights: a new run with checkpointing=[from_hf,...] "
                        "checkpoint.initial_load_path=<its hf_export dir>.")
        raise ConfigError(f"run.resume={run_dir}: no complete checkpoint in {folder}: nothing to continue from.{why}")
    if cut and not _typed("checkpoint.load_step", typed_overrides):  # checkpoint.load_step: the user's pick
        print(f"[qwen3-neuron] warning: checkpoint {folder}/step-{cut[-1]} was cut while saving (no DCP .metadata, "
              "which is written last: the run was killed or its disk filled while writing it); never loaded. The "
              f"run continues from step-{complete[-1]}, the newest complete checkpoint.", file=sys.stderr)  # fmt: skip
    _refuse_changes(run_dir, recorded, composed, typed_overrides)
    resumed = copy.deepcopy(recorded)
    # run.*: the recorded launch settings (its rank count among them), and what this command sets
    typed_run = {key.split(".", 1)[1] for key in _typed_keys(typed_overrides) if key.startswith("run.")}
    resumed["run"] = {**recorded.get("run", {}), **{k: v for k, v in composed["run"].items() if k in typed_run}}
    resumed["run"]["resume"] = composed["run"]["resume"]
    for launch_only in ("dry_run", "show_data"):  # this launch's, never the recorded one's
        resumed["run"][launch_only] = composed["run"][launch_only]
    resumed["training"]["steps"] = composed["training"]["steps"] if _typed("training.steps", typed_overrides) else recorded["training"]["steps"]
    if resumed["training"]["steps"] != recorded["training"]["steps"]:  # the schedule the run was planned with
        resumed.setdefault("lr_scheduler", {})["total_steps"] = planned_schedule_end(run_dir, recorded)
    # which checkpoint: this launch's choice alone (the next resume takes the newest intact one again)
    load_step = composed["checkpoint"]["load_step"] if _typed("checkpoint.load_step", typed_overrides) else -1
    resumed.setdefault("checkpoint", {})["load_step"] = load_step
    if any(key.split(".")[0] == "eval" for key in _typed_keys(typed_overrides)):
        resumed["eval"] = composed["eval"]  # what to evaluate once training ends
    # where it is logged: `tracking=...` anew, `tracking.<key>=...` a change of the recorded choice
    tracking = [key for key in _typed_keys(typed_overrides) if key.split(".")[0] == "tracking"]
    if "tracking" in tracking:
        resumed["tracking"] = composed["tracking"]
    elif tracking:
        changed = {key.split(".", 1)[1] for key in tracking}
        resumed["tracking"] = {**recorded.get("tracking", {}), **{k: composed["tracking"].get(k) for k in changed}}
    return resumed


def planned_schedule_end(run_dir: Path, recorded: Mapping) -> int:
    """The step the recorded run's learning-rate schedule ends at: its lr_scheduler.total_steps
    (recorded, or the base config function's), else its training.steps."""
    trained = json.loads((run_dir / TRAINER_CONFIG_FILE).read_text()).get("lr_scheduler", {})
    return trained.get("total_steps") or recorded["training"]["steps"]


def schedule_rule(end: int, steps: int) -> str:
    """The learning-rate rule of a resume that trains to `steps`, in one line."""
    if steps <= end:
        return f"learning rate: the schedule planned for {end} steps"
    return (f"learning rate: steps 1-{end} keep the schedule planned for {end} steps; "
            f"steps {end + 1}-{steps} train at its step-{end} rate")  # fmt: skip


def _saved_steps(folder: Path) -> list[int]:
    """The steps of every `step-N` folder, complete or not, oldest first."""
    names = [p.name.removeprefix("step-") for p in folder.glob("step-*")] if folder.is_dir() else []
    return sorted(int(name) for name in names if name.isdigit())


def checkpoint_folder(run_dir: Path, config: Mapping) -> Path:
    return run_dir / config.get("checkpoint", {}).get("folder", "checkpoint")


def resume_step(run_dir: Path, resumed: Mapping) -> int:
    """The step a resumed config continues from: `checkpoint.load_step`, else the newest complete
    checkpoint (the plan sets a damaged one aside and names the one it loads)."""
    load_step = resumed["checkpoint"]["load_step"]
    return load_step if load_step != -1 else complete_steps(checkpoint_folder(run_dir, resumed))[-1]


def _refuse_changes(run_dir: Path, recorded: Mapping, composed: Mapping, typed_overrides: list[str]) -> None:
    for key in _typed_keys(typed_overrides):
        if key.startswith(CHANGEABLE_ON_RESUME) and key not in KEPT_ON_RESUME:
            continue
        before = OmegaConf.select(OmegaConf.create(recorded), key, default=None)
        after = OmegaConf.select(OmegaConf.create(dict(composed)), key, default=None)
        if _plain(before) != _plain(after):
            shown = repr(_plain(before)) if before is not None else _trained_value(run_dir, key)
            raise ConfigError(
                f"run.resume continues the recorded config, but this command changes '{key}' "
                f"({shown} -> {_plain(after)!r}). Only run.* (not the rank count: the data position "
                "is saved per rank), training.steps, checkpoint.load_step, eval.* and tracking.* may change."
            )


def _trained_value(run_dir: Path, key: str) -> str:
    """What the run trained with where job.yaml leaves `key` to the base config function: the
    recorded torchtitan config's value (optimizer.<name>: the first param group's)."""
    trained = OmegaConf.create(json.loads((run_dir / TRAINER_CONFIG_FILE).read_text()))
    section, _, name = key.partition(".")
    groups = trained.optimizer.get("param_groups") if section == "optimizer" else None
    value = groups[0].optimizer_kwargs.get(name) if groups else OmegaConf.select(trained, key, default=None)
    return f"{_plain(value)!r}, the base config function's default" if value is not None else "unset"


def _typed(key: str, typed_overrides: list[str]) -> bool:
    return key in _typed_keys(typed_overrides)


def _typed_keys(typed_overrides: list[str]) -> list[str]:
    """The keys (or group names) the command line set, added or deleted, as Hydra parses them."""
    return [override.key_or_group for override in OverridesParser.create().parse_overrides(typed_overrides)]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
