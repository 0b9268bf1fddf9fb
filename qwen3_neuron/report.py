"""Stage 6, report: `summary.json` from the run's `metrics.jsonl` and how the job ended."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from qwen3_neuron.metrics import METRICS_FILE
from qwen3_neuron.record import FAILURE_FILE

SUMMARY_FILE = "summary.json"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """One record per step; a resumed run re-logs the steps after its checkpoint: the last wins."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]


def summarize(run_dir: Path, status: str, wall_seconds: float, **extra: Any) -> dict[str, Any]:
    records = read_metrics(run_dir)
    # Step 1 carries start-up (compile, first allocations): throughput is the median after it.
    steady = [r["tokens_per_second"] for r in records[1:] if "tokens_per_second" in r]
    peaks = [r["peak_memory_gib"] for r in records if "peak_memory_gib" in r]
    failure_file = run_dir / FAILURE_FILE
    failure = json.loads(failure_file.read_text()) if failure_file.exists() else {}
    return {
        "status": status,
        "steps": records[-1]["step"] if records else 0,
        "first_loss": records[0]["loss"] if records else None,
        "final_loss": records[-1]["loss"] if records else None,
        "tokens_per_second": statistics.median(steady) if steady else None,
        "mfu": None,
        "peak_memory_gib": max(peaks) if peaks else None,
        "wall_seconds": round(wall_seconds, 3),
        **failure,
        **extra,
    }


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
