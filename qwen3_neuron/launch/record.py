"""Stage 3, record: what a run dir holds besides Hydra's `.hydra/`.

- `job.yaml`: the composed config, resolved, with the device and the model=hf dir settled
  (`Plan.job`): workers rebuild from it.
- `trainer_config.json`: the final torchtitan config, for people (torchtitan's `to_dict`).
- `command.sh`: the exact torchrun command with its environment.
- `versions.json`: package versions and the project's git SHA.
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from qwen3_neuron.run_dir import FAILURE_FILE, JOB_FILE, write_json

PACKAGES = ("torch", "torchtitan", "transformers", "hydra-core", "omegaconf", "safetensors", "tokenizers")


def write_record(run_dir: Path, job: dict[str, Any], plan) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / FAILURE_FILE).unlink(missing_ok=True)  # a resumed run starts with a clean slate
    OmegaConf.save(OmegaConf.create(job), run_dir / JOB_FILE)
    (run_dir / "trainer_config.json").write_text(
        json.dumps(plan.trainer_config.to_dict(), indent=2, default=repr) + "\n"
    )
    (run_dir / "command.sh").write_text(f"#!/bin/sh\n{plan.command_line()}\n")
    write_json(run_dir / "versions.json", versions())


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
