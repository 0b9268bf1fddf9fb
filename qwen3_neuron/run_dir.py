"""The run-dir contract: the files the launcher, the workers and the reports share, and how each
is read or written. Both sides of torchrun import this module; it imports nothing of either.

    <run dir>/.lock               the launch that owns the run dir while it runs (host, pid, since);
                                  `.lock.nodeN` for node N > 0 of a multi-node job (launch.run_lock)
    <run dir>/job.yaml            the settled job (the resolved composed config); every rank reads it
    <run dir>/trainer_config.json the final torchtitan config, for people (and a refused resume's message)
    <run dir>/command.sh          the torchrun command with its environment
    <run dir>/.plan_*.<token>     local rank 0's plan or its error, and the go (`handoff`)
    <run dir>/failure.json        why a worker stopped: the user's mistake any rank found, or rank
                                  0's crash with its traceback's end; the last good checkpoint
    <run dir>/export.json         rank 0's HF export: the summary's export_dir (adapter_dir), or its error
    <run dir>/train.log           torchrun's whole output
    <run dir>/ranks/              torchrun's per-rank logs
    <run dir>/metrics.jsonl       one record per logged step (rank that torchtitan picks)
    <run dir>/peak_flops.json     the peak MFU is measured against
    <run dir>/memory_estimate.json  the plan's tensor memory estimate per rank
    <run dir>/tensor_memory.json  the tensor memory rank 0 measured while training
    <run dir>/step_memory.json    run.measure_memory: one step's peak of every live tensor (rank 0)
    <run dir>/data_stats/rank_N.json  what rank N's data pipeline read, packed, truncated, dropped
    <run dir>/what_ran/rank_N.json  what rank N's model ran: override modules, attention, compile counters
    <run dir>/data_cache/         datasets' Arrow cache of local data files (data=text|chat|mix)
    <run dir>/summary.json        how the run ended
    <run dir>/PLAN_ONLY.txt       left by a dry run or `run.show_data`: the record beside it is a
                                  plan that never trained (a launch may still use the dir)
    <run dir>/mlflow_run.json     tracking=mlflow: the run's MLflow run (store, id) and how much of
                                  metrics.jsonl it holds, kept as it is sent: a resume continues it
                                  (report.tracking, report.mlflow_tracking)
    <run dir>/wandb_run.json      tracking=wandb: the same for its W&B run (report.wandb_tracking)
    <run dir>/wandb/              tracking=wandb: W&B's own files (offline: the whole run)
    <sweep dir>/.stop_sweep       left by a job that stops the sweep: later jobs skip
    <sweep dir>/mlflow_run.json   tracking=mlflow: the sweep's parent MLflow run, its jobs' runs its children
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

JOB_FILE = "job.yaml"
COMMAND_FILE = "command.sh"
TRAINER_CONFIG_FILE = "trainer_config.json"
FAILURE_FILE = "failure.json"
EXPORT_FILE = "export.json"
LOG_FILE = "train.log"
RANKS_LOG_DIR = "ranks"
METRICS_FILE = "metrics.jsonl"
PEAK_FLOPS_FILE = "peak_flops.json"
MEMORY_ESTIMATE_FILE = "memory_estimate.json"
TENSOR_MEMORY_FILE = "tensor_memory.json"
STEP_MEMORY_FILE = "step_memory.json"
SUMMARY_FILE = "summary.json"
DATA_STATS_DIR = "data_stats"
WHAT_RAN_DIR = "what_ran"
STOP_FILE = ".stop_sweep"
LOCK_FILE = ".lock"
PLAN_ONLY_FILE = "PLAN_ONLY.txt"
MLFLOW_RUN_FILE = "mlflow_run.json"
WANDB_RUN_FILE = "wandb_run.json"


def group_replacements(lines: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for line in lines:
        target, _, change = line.removeprefix("[Override] ").partition(": ")
        grouped.setdefault(target, []).append(change)
    return grouped


def summarize_replacements(lines: list[str]) -> list[str]:
    """One line per override and kind of change, its layers counted: "36 x
    model_spec.model.layers.*.attention.inner_attention FlexAttention.Config ->
    SDPAFlexAttention.Config (qwen3_neuron.kernels.attention.sdpa.sdpa_for_flex)"."""
    counts: Counter[tuple[str, str]] = Counter()
    for target, changes in group_replacements(lines).items():
        for change in changes:
            counts[target, re.sub(r"\.\d+\.", ".*.", change)] += 1
    return [f"{n} x {change} ({target})" if n > 1 else f"{change} ({target})" for (target, change), n in counts.items()]


def write_atomically(path: Path, text: str) -> None:
    """Readers (a launcher polling, a summary after a crash) never see `path` half written: on
    a full disk it is left as it was."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)


def lock_file(node_rank: int) -> str:
    """Each node of a multi-node job holds its own lock on the run dir they share."""
    return LOCK_FILE if node_rank == 0 else f"{LOCK_FILE}.node{node_rank}"


def read_job(run_dir: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf  # the workers' only OmegaConf use: keep it off import

    return OmegaConf.to_container(OmegaConf.load(run_dir / JOB_FILE))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """One record per step, oldest first: the records of a step merged (training, then
    validation's `val_loss`); a resumed run re-logs the steps after its checkpoint: the last
    value of a field wins. A line still being written is skipped."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        by_step.setdefault(record["step"], {}).update(record)
    return [by_step[step] for step in sorted(by_step)]


def read_json(path: Path) -> dict[str, Any] | None:
    """A run-dir JSON file (summary, failure, peak), or None when it is not there."""
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path: Path, value: dict[str, Any]) -> None:
    write_atomically(path, json.dumps(value, indent=2) + "\n")


def earlier_run(run_dir: Path) -> str | None:
    """What shows that `run_dir` holds a run, finished, failed or interrupted (its summary, metrics,
    output or recorded config; a dry run's record alone is no run), or None."""
    for name in (SUMMARY_FILE, METRICS_FILE, LOG_FILE, FAILURE_FILE, JOB_FILE):
        if (run_dir / name).exists() and not (name == JOB_FILE and (run_dir / PLAN_ONLY_FILE).exists()):
            return name
    return None


def complete_steps(checkpoint_folder: Path) -> list[int]:
    """Steps with a finished DCP checkpoint (`step-N/.metadata`, written last), oldest first:
    torchtitan's own rule for which checkpoint it resumes from."""
    if not checkpoint_folder.is_dir():
        return []
    steps = [
        int(p.name.removeprefix("step-"))
        for p in checkpoint_folder.glob("step-*")
        if (p / ".metadata").exists()
    ]
    return sorted(steps)


def write_data_stats(run_dir: Path, rank: int, stats: dict[str, int]) -> None:
    folder = run_dir / DATA_STATS_DIR
    folder.mkdir(exist_ok=True)
    write_json(folder / f"rank_{rank}.json", stats)


def read_data_stats(run_dir: Path) -> dict[str, Any] | None:
    """Every rank's data counts added up, the first rows of each fate (truncated, dropped, ...)
    of all ranks in rank order, and the job's `packing_efficiency`; None when no rank wrote any
    (data=tiny, or no run)."""
    folder = run_dir / DATA_STATS_DIR
    files = sorted(folder.glob("rank_*.json"), key=lambda p: int(p.stem.removeprefix("rank_"))) if folder.is_dir() else []
    if not files:
        return None
    total: dict[str, Any] = {}
    examples: dict[str, list[str]] = {}
    for path in files:
        for name, value in json.loads(path.read_text()).items():
            if name == "examples":
                for fate, rows in value.items():
                    examples.setdefault(fate, []).extend(rows)
            else:
                total[name] = total.get(name, 0) + value
    examples = {fate: sorted(rows, key=_file_order) for fate, rows in examples.items()}
    return {**total, "examples": examples, "packing_efficiency": packing_efficiency(total)}


def _file_order(example: str) -> tuple[str, int]:
    """"/data/chats.jsonl line 12: why" -> ("/data/chats.jsonl", 12): the ranks' rows in file order."""
    placed = re.match(r"(.*?) (?:line|item) (\d+): ", example)
    return (placed[1], int(placed[2])) if placed else (example, 0)


def packing_efficiency(stats: dict[str, int]) -> float | None:
    """The share of the tokens handed out to training that are not padding."""
    tokens = stats.get("tokens")
    return (tokens - stats["padding_tokens"]) / tokens if tokens else None


def write_what_ran(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    folder = run_dir / WHAT_RAN_DIR
    folder.mkdir(exist_ok=True)
    write_json(folder / f"rank_{rank}.json", record)


def read_what_ran(run_dir: Path) -> dict[int, dict[str, Any]]:
    """{rank: its record} of every rank that wrote one (worker.what_ran)."""
    folder = run_dir / WHAT_RAN_DIR
    files = folder.glob("rank_*.json") if folder.is_dir() else []
    return {int(p.stem.removeprefix("rank_")): json.loads(p.read_text()) for p in files}
