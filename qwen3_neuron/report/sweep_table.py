"""Stage 8 for a multirun: one table and one plot over every job of a sweep.

    python -m qwen3_neuron.report.sweep_table multirun/2026-12-02/14-03-07-123456

writes, into the sweep dir:
- `summary.csv`: one row per job: the job number, the overrides whose values differ between
  jobs, then `status, steps, first_loss, final_loss, val_loss, tokens_per_second,
  packing_efficiency, mfu, peak_memory_gib, wall_seconds`, data=preference jobs' reward_accuracy,
  reward_margin and val_reward_accuracy (and nll_loss, log_odds_ratio, kl of the trainers reporting
  them), data=prompts jobs' first_reward, reward and val_reward, an
  `eval.<task>.<metric>` column per lm-eval score (eval=lm_eval), `error`, exactly as in the job's summary.json, and the job's run dir;
- `summary.md`: the same table for people (rounded, MFU in %), plus Optuna's best trial when the
  sweep was an Optuna study;
- `loss.png`: every job's loss curve from its metrics.jsonl (a data=prompts job's: its reward,
  GRPO's surrogate loss says little), labelled by its overrides (a failed job's curve dashed).

At the end of `launch.py -m ...` the SweepReport Hydra callback (qwen3_neuron.report.hydra_callbacks)
does the same; this command rebuilds it for an existing sweep dir.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from qwen3_neuron.eval.objective import PREFIX as EVAL_PREFIX
from qwen3_neuron.eval.objective import flat_scores
from qwen3_neuron.run_dir import STOP_FILE, SUMMARY_FILE, read_metrics

CSV_FILE = "summary.csv"
MARKDOWN_FILE = "summary.md"
PLOT_FILE = "loss.png"
OPTUNA_RESULTS = "optimization_results.yaml"  # hydra-optuna-sweeper's, in the sweep dir

COLUMNS = (
    "status", "steps", "first_loss", "final_loss", "val_loss", "tokens_per_second",
    "packing_efficiency", "mfu", "peak_memory_gib", "wall_seconds", "error",
)  # fmt: skip
# data=preference jobs (ORPO's and SimPO's nll_loss, ORPO's log_odds_ratio, KTO's kl where they ran)
PREFERENCE_COLUMNS = ("reward_accuracy", "reward_margin", "val_reward_accuracy", "nll_loss", "log_odds_ratio", "kl")
GRPO_COLUMNS = ("first_reward", "reward", "val_reward")  # data=prompts jobs


@dataclass
class Job:
    name: str
    """The job's dir under the sweep dir (Hydra's job number)."""

    run_dir: Path
    overrides: dict[str, str]
    summary: dict[str, Any]
    points: list[tuple[int, float]] = field(default_factory=list)
    """(step, loss) per training step; a data=prompts job's (step, reward): `curve` says which."""
    curve: str = "loss"

    @property
    def failed(self) -> bool:
        return self.summary.get("status") != "completed"


@dataclass
class SweepTable:
    sweep_dir: Path
    jobs: list[Job]
    varying: list[str]
    """Override keys whose values differ between jobs (all of them for a one-job sweep)."""

    columns: tuple[str, ...] = COLUMNS
    """COLUMNS, with one `eval.<task>.<metric>` column per score any job has (eval=lm_eval)."""

    @property
    def failed(self) -> list[Job]:
        return [job for job in self.jobs if job.failed]


def write_report(sweep_dir: Path | str) -> SweepTable:
    """Read every job of the sweep, write summary.csv, summary.md and loss.png."""
    sweep_dir = Path(sweep_dir)
    jobs = collect_jobs(sweep_dir)
    report = SweepTable(sweep_dir, jobs, varying_keys(jobs), table_columns(jobs))
    _write_atomically(sweep_dir / CSV_FILE, render_csv(report))
    _write_atomically(sweep_dir / MARKDOWN_FILE, render_markdown(report))
    plot_losses(report, sweep_dir / PLOT_FILE)
    return report


def collect_jobs(sweep_dir: Path) -> list[Job]:
    dirs = [d for d in sweep_dir.iterdir() if d.is_dir() and ((d / ".hydra").is_dir() or (d / SUMMARY_FILE).exists())]
    return [_read_job(d) for d in sorted(dirs, key=_job_order)]


def table_columns(jobs: list[Job]) -> tuple[str, ...]:
    scores = sorted({name for job in jobs for name in flat_scores(job.summary)})
    preference = [c for c in (*PREFERENCE_COLUMNS, *GRPO_COLUMNS) if any(job.summary.get(c) is not None for job in jobs)]
    return (*COLUMNS[:-1], *preference, *scores, COLUMNS[-1])  # the error stays last


def _job_order(run_dir: Path) -> tuple:
    return (0, int(run_dir.name), "") if run_dir.name.isdigit() else (1, 0, run_dir.name)


def _read_job(run_dir: Path) -> Job:
    summary_path = run_dir / SUMMARY_FILE
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
    else:  # the launcher was stopped before it could write one, or the job is still running
        summary = {"status": "unknown", "error": f"no {SUMMARY_FILE} in the job's dir"}
    summary.update(flat_scores(summary))  # eval.<task>.<metric>: a column each
    return Job(run_dir.name, run_dir, read_overrides(run_dir), summary, *_read_curve(run_dir))


def read_overrides(run_dir: Path) -> dict[str, str]:
    """The job's command-line overrides (Hydra's .hydra/overrides.yaml) as {key: value}."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    parsed = OverridesParser.create().parse_overrides([str(item) for item in yaml.safe_load(path.read_text()) or []])
    return {
        override.key_or_group: "(deleted)" if override.is_delete() else override.get_value_element_as_str()
        for override in parsed
    }


def varying_keys(jobs: list[Job]) -> list[str]:
    keys: list[str] = []
    for job in jobs:
        keys += [key for key in job.overrides if key not in keys]
    if len(jobs) < 2:
        return keys
    return [key for key in keys if len({job.overrides.get(key, "") for job in jobs}) > 1]


def _read_curve(run_dir: Path) -> tuple[list[tuple[int, float]], str]:
    steps = [record for record in read_metrics(run_dir) if "loss" in record]
    curve = "reward" if any("reward" in record for record in steps) else "loss"
    return [(record["step"], record[curve]) for record in steps if curve in record], curve


# ---- the table -------------------------------------------------------------------------------


def header(report: SweepTable) -> list[str]:
    return ["job", *report.varying, *report.columns, "run_dir"]


def render_csv(report: SweepTable) -> str:
    """Values exactly as in each summary.json (floats in full), empty for null."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header(report))
    for job in report.jobs:
        values = [job.summary.get(column) for column in report.columns]
        writer.writerow(
            [job.name, *(job.overrides.get(k, "") for k in report.varying)]
            + ["" if v is None else v for v in values]
            + [_relative(job.run_dir, report.sweep_dir)]
        )  # fmt: skip
    return out.getvalue()


def render_markdown(report: SweepTable) -> str:
    columns = header(report)[:-1]  # the run dir is the job number here
    lines = [
        f"# Sweep {report.sweep_dir}",
        "",
        f"{len(report.jobs)} jobs, {len(report.jobs) - len(report.failed)} completed, {len(report.failed)} failed.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---:" if c in _NUMERIC or c.startswith(EVAL_PREFIX) else "---" for c in columns) + "|",
    ]
    for job in report.jobs:
        cells = [job.name, *(job.overrides.get(k, "") for k in report.varying)]
        cells += [_format(column, job.summary.get(column)) for column in report.columns]
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    stop = report.sweep_dir / STOP_FILE
    if stop.exists():
        lines += ["", f"The sweep stopped early: {stop.read_text().strip()}"]
    best = _optuna_best(report.sweep_dir)
    if best:
        lines += ["", f"Optuna best value: {best.get('best_value')} with {best.get('best_params')}"]
    lines += ["", f"Loss curves: {PLOT_FILE}. Full values: {CSV_FILE}."]
    return "\n".join(lines) + "\n"


_NUMERIC = {"steps", "first_loss", "final_loss", "val_loss", "tokens_per_second", "packing_efficiency", "mfu",
            "peak_memory_gib", "wall_seconds", *PREFERENCE_COLUMNS, *GRPO_COLUMNS}  # fmt: skip


def _format(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column == "error":
        text = str(value)
        return text if len(text) <= 100 else text[:97] + "..."
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if column == "mfu":
        return f"{100 * value:.3g}%"
    if column == "tokens_per_second":
        return f"{value:,.0f}"
    if column in ("first_loss", "final_loss", "val_loss", "packing_efficiency", *PREFERENCE_COLUMNS, *GRPO_COLUMNS):
        return f"{value:.4f}"
    if column == "peak_memory_gib" or column.startswith(EVAL_PREFIX):
        return f"{value:.3f}"
    if column == "wall_seconds":
        return f"{value:.1f}"
    return str(value)


def _optuna_best(sweep_dir: Path) -> dict | None:
    path = sweep_dir / OPTUNA_RESULTS
    return yaml.safe_load(path.read_text()) if path.exists() else None


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


# ---- the plot --------------------------------------------------------------------------------


def plot_losses(report: SweepTable, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    figure = Figure(figsize=(9, 5.5), layout="constrained")
    axes = figure.subplots()
    plotted = 0
    # what tells the curves apart (a sweep's first job alone: its name; its keys are in the table)
    legend_keys = report.varying if len(report.jobs) > 1 else []
    for job in report.jobs:
        if not job.points:
            continue
        steps, values = zip(*job.points)
        label = job_label(job, legend_keys) + (f" ({job.summary.get('status')})" if job.failed else "")
        axes.plot(steps, values, marker="o", markersize=3, linestyle="--" if job.failed else "-", label=label)
        plotted += 1
    axes.set_xlabel("step")
    axes.set_ylabel(" / ".join(sorted({job.curve for job in report.jobs if job.points}, reverse=True)) or "loss")
    axes.set_title(f"{report.sweep_dir.name}: {plotted} of {len(report.jobs)} jobs logged a step", fontsize="medium")
    axes.grid(alpha=0.3)
    if plotted:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0) if plotted > 8 else None)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    figure.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def job_label(job: Job, keys: list[str]) -> str:
    """"#1 optimizer.lr=0.0007661, ...": a searched float to 4 significant digits, so a legend of
    Optuna's draws fits beside the curves (the table keeps every digit)."""
    overrides = ", ".join(f"{k}={_short(job.overrides.get(k, ''))}" for k in keys)
    return f"#{job.name} {overrides}".strip()


def _short(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}" if len(value) > 8 and not value.isdigit() else value


def _write_atomically(path: Path, text: str) -> None:
    """Jobs of a parallel launcher may rebuild the report at the same time: never a torn file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m qwen3_neuron.report.sweep_table",
        description="Rebuild summary.csv, summary.md and loss.png of a sweep dir.",
    )
    parser.add_argument("sweep_dir", type=Path, help="a multirun dir (holding one dir per job)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a directory")
    report = write_report(args.sweep_dir)
    print((args.sweep_dir / MARKDOWN_FILE).read_text(), end="")
    print(f"wrote {', '.join(str(args.sweep_dir / f) for f in (CSV_FILE, MARKDOWN_FILE, PLOT_FILE))}")
    if not report.jobs:
        parser.exit(1, f"no job dirs found in {args.sweep_dir}\n")


if __name__ == "__main__":
    main()
