"""Shared fixtures: the project's own tiny assets, Hydra composition, launch.py in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from qwen3_neuron.assets.build import build_assets
from qwen3_neuron.config import hydra_setup as project_compose

REPO = Path(__file__).resolve().parents[1]
os.environ["HF_HUB_OFFLINE"] = "1"
project_compose.register()


@pytest.fixture(scope="session")
def assets():
    """Built once into the user's asset cache (deterministic, reused across runs)."""
    return build_assets()


def compose_config(*overrides: str) -> dict:
    """The composed config, as launch.py would get it, through Hydra's compose API."""
    with initialize_config_dir(config_dir=str(project_compose.CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def launch(run_dir: Path | None, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`python launch.py ...` with its run dir pinned to `run_dir` (None: Hydra's choice)."""
    pinned = [f"hydra.run.dir={run_dir}"] if run_dir else []
    return subprocess.run(
        [sys.executable, str(REPO / "launch.py"), *pinned, *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
