"""What live tracking costs a training step: the same run untracked, tracked, and tracked to a store that is down.

    .venv/bin/python bench/tracking_overhead.py [--steps 20] [--repeats 3] [--interval 1]

The default tiny Qwen3 on 2 CPU ranks, launched in turn (untracked, tracked=mlflow to a local
sqlite store, tracked=mlflow to http://127.0.0.1:<a port nothing listens on>; again, ...), the
launcher sending every `--interval` seconds (1: five times the default cadence). Per launch: the
median step time from metrics.jsonl (steps 2 on: step 1 carries start-up) and the launch's wall
time; then each mode's median over the repeats and its ratio to untracked.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("untracked", "sqlite", "closed port")


def closed_port() -> int:
    with socket.socket() as probe:  # bound, never listening: connections are refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tracking(mode: str, store: str, interval: float) -> list[str]:
    if mode == "untracked":
        return []
    uri = store if mode == "sqlite" else f"http://127.0.0.1:{closed_port()}"
    return ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.interval_seconds={interval}"]


def launch(run_dir: Path, overrides: list[str], steps: int) -> tuple[float, float, str]:
    """(median step seconds, launch wall seconds, what the launch said about MLflow)."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", f"training.steps={steps}",
         "metrics.enable_tensorboard=false", *overrides],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    elapsed = [json.loads(line)["elapsed_seconds"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if '"loss"' in line]  # fmt: skip
    said = [line for line in (result.stdout + result.stderr).splitlines() if "MLflow" in line]
    return statistics.median(b - a for a, b in zip(elapsed[1:], elapsed[2:])), wall, " | ".join(said)[:120]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        store = f"sqlite:///{scratch}/mlflow.db"
        from mlflow.tracking import MlflowClient  # the store made once: no run pays for its tables

        MlflowClient(store).create_experiment("qwen3-neuron", artifact_location=f"{scratch}/artifacts")
        for repeat in range(args.repeats):
            for mode in MODES:
                run_dir = Path(scratch) / f"{mode.replace(' ', '_')}-{repeat}"
                step, wall, said = launch(run_dir, tracking(mode, store, args.interval), args.steps)
                results[mode].append((step, wall))
                print(f"repeat {repeat} {mode:<11} step {step * 1000:7.1f} ms  launch {wall:6.1f} s  {said}", flush=True)
    for index, name in ((0, "step ms"), (1, "launch s")):
        medians = {mode: statistics.median(r[index] for r in results[mode]) for mode in MODES}
        scale = 1000 if index == 0 else 1
        print(f"{name:<9}" + "  ".join(f"{mode} {medians[mode] * scale:8.1f}" for mode in MODES)
              + "  ratios to untracked: " + "  ".join(
                  f"{mode} {medians[mode] / medians['untracked']:.3f}" for mode in MODES[1:]))  # fmt: skip


if __name__ == "__main__":
    main()
