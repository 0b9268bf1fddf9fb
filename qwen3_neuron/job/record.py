"""Stage 5, record: what a run dir holds besides Hydra's `.hydra/`. The launcher writes the job
before torchrun starts (`record_job`); whichever process made the plan writes the rest
(`record_plan`: local rank 0 of the workers, or the launcher for a dry run).

- `job.yaml`: the job (`job.job.Job`), settled: its composed config, resolved, with the
  device, the model=hf dir and the NEFF cache as the launcher settled them; every rank reads it.
- `command.sh`: the exact torchrun command with its environment.
- `trainer_config.json`: the final torchtitan config, for people (torchtitan's `to_dict`).
- `versions.json`: package versions and the project's git SHA.
- `memory_estimate.json`: the plan's tensor memory estimate per rank.
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from qwen3_neuron.hf_io.export import exports_hf
from qwen3_neuron.handoff import PlannedRun
from qwen3_neuron.run_dir import (
    COMMAND_FILE,
    EXPORT_FILE,
    FAILURE_FILE,
    JOB_FILE,
    MEMORY_ESTIMATE_FILE,
    TRAINER_CONFIG_FILE,
    write_json,
)  # fmt: skip

# torch-neuronx: which Neuron SDK's static-shape rules a neuron plan applied (None elsewhere)
PACKAGES = (
    "torch", "torch-neuronx", "torchtitan", "transformers", "hydra-core", "omegaconf", "safetensors", "tokenizers",
)  # fmt: skip


def record_job(run_dir: Path, job, command_line: str) -> None:
    """The settled `job` and the torchrun command that runs it (`WorkerLaunch.command_line`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(job.composed), run_dir / JOB_FILE)
    (run_dir / COMMAND_FILE).write_text(f"#!/bin/sh\n{command_line}\n")


def record_plan(plan, run_dir: Path, messages: list[str]) -> PlannedRun:
    """Write the plan's record; returns what the launcher runs and reports with."""
    for earlier in (FAILURE_FILE, EXPORT_FILE):  # a resumed run starts with a clean slate
        (run_dir / earlier).unlink(missing_ok=True)
    (run_dir / TRAINER_CONFIG_FILE).write_text(
        json.dumps(plan.trainer_config.to_dict(), indent=2, default=repr) + "\n"
    )
    write_json(run_dir / "versions.json", versions())
    write_json(run_dir / MEMORY_ESTIMATE_FILE, plan.memory.to_json())
    config = plan.trainer_config
    return PlannedRun(
        steps=config.training.steps,
        world_size=plan.world_size,
        parameters=plan.parameters,
        replacements=plan.replacements,
        messages=messages,
        vocab_size=config.model_spec.model.vocab_size,
        weights_loaded=weights_were_loaded(config),
        dtype=training_dtype(config),
        exports_hf=exports_hf(config),
    )


def weights_were_loaded(trainer_config) -> bool:
    """True when the run starts from initial weights (HF or DCP) rather than a random init."""
    checkpoint = trainer_config.checkpoint
    return bool(checkpoint.enable and (checkpoint.initial_load_in_hf or checkpoint.initial_load_path))


def training_dtype(trainer_config) -> str:
    """The dtype the model's matmuls run in: `training.dtype` if bfloat16, else FSDP's
    `mixed_precision_param` (torchtitan 0.3.0's qwen3 `parallelize` applies FSDP at every data
    parallel degree, 1 included, so its param dtype is the compute dtype)."""
    training = trainer_config.training
    return "bfloat16" if training.dtype == "bfloat16" else training.mixed_precision_param


def versions() -> dict[str, Any]:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["git_sha"] = _git("rev-parse", "HEAD")
    found["git_dirty"] = bool(_git("status", "--porcelain")) if found["git_sha"] else None
    return found


def _git(*args: str) -> str | None:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
