"""Stage 8, report: `summary.json` from the run's `metrics.jsonl` and how the job ended; what a
sweep job hands back to Hydra's sweeper."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import JobFailed
from qwen3_neuron.eval.objective import objective_value
from qwen3_neuron.run_dir import (
    FAILURE_FILE,
    LOG_FILE,
    MEMORY_ESTIMATE_FILE,
    STEP_MEMORY_FILE,
    PEAK_FLOPS_FILE,
    STOP_FILE,
    SUMMARY_FILE,
    TENSOR_MEMORY_FILE,
    read_data_stats,
    read_json,
    read_metrics,
    read_what_ran,
    write_json,
)  # fmt: skip

_RANK_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]: ?)+")  # torchrun's, once per layer of tee
_ROOT_CAUSE = re.compile(r"Root Cause.*?\brank\s*:\s*(?P<rank>\d+).*?error_file:\s*(?P<error_file>\S+)", re.S)


def summarize(run_dir: Path, status: str, wall_seconds: float, **extra: Any) -> dict[str, Any]:
    logged = read_metrics(run_dir)
    records = [r for r in logged if "loss" in r]  # training steps (validation may log between them)
    validations = [r for r in logged if "val_loss" in r or "val_reward" in r]  # data=prompts: no loss held out
    # Step 1 carries start-up (compile, first allocations): throughput is the median after it.
    steady = [r["tokens_per_second"] for r in records[1:] if "tokens_per_second" in r]
    peaks = [r["peak_memory_gib"] for r in records if "peak_memory_gib" in r]
    waits = [r["data_loading_pct"] for r in records[1:] if "data_loading_pct" in r]
    tokens_per_second = statistics.median(steady) if steady else None
    flops_per_token = records[-1].get("flops_per_token") if records else None
    peak = read_json(run_dir / PEAK_FLOPS_FILE)
    failure = read_json(run_dir / FAILURE_FILE) or {}
    data_stats = read_data_stats(run_dir)
    summary = {
        "status": status,
        "steps": records[-1]["step"] if records else 0,
        "first_loss": records[0]["loss"] if records else None,
        "final_loss": records[-1]["loss"] if records else None,
        # torchtitan's Validator (data.val_files / data.val_fraction): the last validation
        "val_loss": validations[-1].get("val_loss") if validations else None,
        "val_perplexity": validations[-1].get("val_perplexity") if validations else None,
        "val_step": validations[-1]["step"] if validations else None,
        # data=preference: the DPO rewards of the last step's pairs, and of the last validation's
        **_preference(records[-1] if records else {}, validations[-1] if validations else {}),
        # trainer=reward_model: TRL's accuracy, margin, mean reward of the last step's pairs and last validation's
        **_reward_model(records[-1] if records else {}, validations[-1] if validations else {}),
        # data=prompts: the GRPO reward of the first and the last step's completions, and of the last validation's
        **_grpo([r for r in records if "reward" in r], validations[-1] if validations else {}),
        # data=text|chat|mix: what the ranks read and packed, and every overlong document's fate
        "data_stats": data_stats,
        # of the tokens trained on, the share that is not padding (data_stats'; the sweep table's column)
        "packing_efficiency": data_stats["packing_efficiency"] if data_stats else None,
        "tokens_per_second": tokens_per_second,
        # torchtitan's share of step time spent waiting for the next batch, %, median after step 1
        "data_wait_pct": statistics.median(waits) if waits else None,
        "mfu": _mfu(flops_per_token, tokens_per_second, peak),
        "peak_memory_gib": max(peaks) if peaks else None,
        # the plan's estimate per rank and what rank 0 measured (qwen3_neuron.job.checks.memory)
        "memory_estimate_gib": (read_json(run_dir / MEMORY_ESTIMATE_FILE) or {}).get("per_rank_gib"),
        "tensor_memory_gib": (read_json(run_dir / TENSOR_MEMORY_FILE) or {}).get("tensor_memory_gib"),
        # run.measure_memory: one step's peak of every live tensor (MemTracker), by category
        **_step_memory(read_json(run_dir / STEP_MEMORY_FILE) or {}),
        "wall_seconds": round(wall_seconds, 3),
        "error": None,
        "flops_per_token": flops_per_token,
        "peak_flops_per_rank": peak["flops_per_second"] if peak else None,
        "peak_flops_source": peak["source"] if peak else None,
        "ranks": peak["ranks"] if peak else None,
        **what_ran(run_dir),
        **{key: failure[key] for key in ("error", "last_checkpoint", "user_error") if key in failure},
        **extra,
    }
    if status == "failed" and not summary["error"]:  # no failure.json: not a Python error on rank 0
        summary["error"] = crash_error(run_dir, summary.get("exit_code"))
    return summary


def what_ran(run_dir: Path) -> dict[str, Any]:
    """What the workers recorded they ran (worker/what_ran.py), every rank's together:
    `overrides` {override: {module fqn: class}} and `attention` {class: layers} over the ranks'
    modules (pipeline stages hold different layers); `compiled`, with compile.enable=true: the
    backend, the most graphs, frames, recompiles and compile seconds of any rank, and how many
    ranks captured a graph at all. None where no rank wrote a record."""
    records = read_what_ran(run_dir).values()
    if not records:
        return {"overrides": None, "attention": None, "compiled": None}
    overrides: dict[str, dict[str, str]] = {}
    attention: dict[str, str] = {}
    for record in records:
        for name, modules in record["overrides"].items():
            overrides.setdefault(name, {}).update(modules)
        attention.update(record["attention"])
    compiled = [record["compiled"] for record in records if record["compiled"]]
    merged = None
    if compiled:
        counts = ("graphs", "frames_compiled", "recompiles", "compile_seconds")
        most = max(compiled, key=lambda c: c["recompiles"])
        merged = {
            "backend": compiled[0]["backend"],
            **{key: max(c[key] for c in compiled) for key in counts},
            "recompile_reasons": most["recompile_reasons"],
            "ranks_with_graphs": sum(1 for c in compiled if c["graphs"]),
        }
    return {
        "overrides": overrides,
        "attention": dict(Counter(attention.values())),
        "compiled": merged,
    }


PREFERENCE_FIELDS = ("reward_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected")
# the objectives' own, under TRL's names: ORPO's and SimPO's NLL, ORPO's odds ratio, KTO's KL estimate
OBJECTIVE_FIELDS = ("nll_loss", "log_odds_ratio", "log_odds_chosen", "kl")


def _step_memory(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("tracked_peak_gib", "max_memory_allocated_gib", "max_memory_reserved_gib")
    fields = {key: record[key] for key in keys if key in record}
    if "by_category_gib" in record:
        fields["tracked_peak_by_category_gib"] = record["by_category_gib"]
        fields["tracked_step"] = record["step"]
    return fields


def _preference(last: dict[str, Any], validation: dict[str, Any]) -> dict[str, Any]:
    """The preference trainers' rewards (KTO's too: no accuracy, a reward only of the kinds a step
    had), and their objective's own figures where it has them."""
    if "pairs" not in last and "units" not in last:  # not a preference trainer's step (KTO's: units)
        return {}
    own = [name for name in OBJECTIVE_FIELDS if name in last]
    return {**{name: last.get(name) for name in (*PREFERENCE_FIELDS, *own)},
            **{f"val_{name}": validation.get(f"val_{name}") for name in (*PREFERENCE_FIELDS, *own)}}  # fmt: skip


REWARD_MODEL_FIELDS = ("accuracy", "margin", "mean_reward")  # TRL RewardTrainer's names


def _reward_model(last: dict[str, Any], validation: dict[str, Any]) -> dict[str, Any]:
    if "accuracy" not in last:
        return {}
    return {**{name: last.get(name) for name in REWARD_MODEL_FIELDS},
            **{f"val_{name}": validation.get(f"val_{name}") for name in REWARD_MODEL_FIELDS}}  # fmt: skip


NO_SIGNAL = ("every group's completions scored alike, so every advantage was 0 and the reward taught the policy "
             "nothing; more completions per prompt (grpo.num_generations), a higher grpo.temperature or a reward "
             "that gives partial credit spreads the scores")  # fmt: skip


def without_signal(record: dict[str, Any]) -> bool:
    """A GRPO step in which every group's completions scored alike (TRL's frac_reward_zero_std of 1)."""
    return record.get("frac_reward_zero_std") == 1.0


GRPO_FIELDS = {"reward": "reward", "completion_mean_length": "completions/mean_length",
               "completion_clipped_ratio": "completions/clipped_ratio"}  # summary field: metrics.jsonl's


def _grpo(steps: list[dict[str, Any]], validation: dict[str, Any]) -> dict[str, Any]:
    if not steps:
        return {}
    return {"first_reward": steps[0]["reward"], **{field: steps[-1].get(name) for field, name in GRPO_FIELDS.items()},
            "val_reward": validation.get("val_reward"), "no_signal_steps": sum(map(without_signal, steps)),
            **_tools(steps)}  # fmt: skip


# summary field: metrics.jsonl's, of the last step (grpo.tools / grpo.environment)
TOOL_FIELDS = {"tool_call_frequency": "tools/call_frequency", "tool_failure_frequency": "tools/failure_frequency",
               "tool_turns_per_completion": "tools/turns_per_completion", "tool_calls": "tools/run_calls",
               "tool_failures": "tools/run_failures", "tool_timeouts": "tools/run_timeouts"}  # fmt: skip


def _tools(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A run with tools: how often the policy called them at its first step and its last, how
    often a call failed, its turns per completion; the run's calls, failures and timeouts."""
    if "tools/call_frequency" not in steps[-1]:
        return {}
    return {"first_tool_call_frequency": steps[0].get("tools/call_frequency"),
            **{field: steps[-1].get(name) for field, name in TOOL_FIELDS.items()}}  # fmt: skip


def _tool_line(summary: dict[str, Any]) -> str:
    calls, failures, timeouts = (int(summary[key] or 0) for key in ("tool_calls", "tool_failures", "tool_timeouts"))
    return (f"grpo tools: {summary['first_tool_call_frequency']:.2f} -> {summary['tool_call_frequency']:.2f} calls per "
            f"completion, {summary['tool_failure_frequency']:.0%} of the last step's failed, "
            f"{summary['tool_turns_per_completion']:.2f} turns per completion; the run made {calls:,} calls, "
            f"{failures:,} failed, {timeouts:,} of them past grpo.tool_timeout_s")


def _mfu(flops_per_token: float | None, tokens_per_second: float | None, peak: dict | None) -> float | None:
    """Model FLOPs utilisation, a fraction: the job's model FLOP/s over the peak of all its ranks
    (per device the same as torchtitan's: flops/token x per-device tokens/s / per-device peak)."""
    if not (flops_per_token and tokens_per_second and peak):
        return None
    return flops_per_token * tokens_per_second / (peak["flops_per_second"] * peak["ranks"])


def crash_error(run_dir: Path, exit_code: int | None = None) -> str:
    """The exception that ended the job: the root cause torchrun names (its error file, written
    by torchtitan's @record), else the first traceback in train.log."""
    log = run_dir / LOG_FILE
    text = log.read_text(errors="replace") if log.exists() else ""
    root = _ROOT_CAUSE.search(text)
    if root:
        message = _error_file_message(Path(root.group("error_file")))
        if message:
            return f"rank {root.group('rank')}: {message}"
    return exception_line(text) or f"exit code {exit_code}; see {LOG_FILE}"


def _error_file_message(path: Path) -> str | None:
    try:
        message = json.loads(path.read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    message = message.get("message") if isinstance(message, dict) else message
    return str(message)[:500] if message else None


def exception_line(text: str) -> str | None:
    """`SomeError: message` of the first Python traceback in a log."""
    in_traceback = False
    for line in text.splitlines():
        line = _RANK_PREFIX.sub("", line)
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and line.strip() and not line[0].isspace():
            return line.strip()[:500]
    return None


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """How the run ended, for the screen: a few labelled lines (summary.json has every figure)."""
    lines = [f"{summary['status']}: {summary['steps']} steps in {summary['wall_seconds']:.1f} s"]
    if summary["first_loss"] is not None:
        lines[0] += f"; loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}"
    if summary.get("val_loss") is not None:
        lines[0] += f" (validation {summary['val_loss']:.4f} at step {summary['val_step']})"
    if summary.get("checkpoint_loaded"):
        lines[0] += f"; continued from checkpoint {summary['checkpoint_loaded']}"
    if summary.get("reward_accuracy") is not None:  # data=preference
        lines.append(f"preference: reward accuracy {summary['reward_accuracy']:.2f}, margin {summary['reward_margin']:.3f}")
        if summary.get("val_reward_accuracy") is not None:
            lines[-1] += (f" (validation: accuracy {summary['val_reward_accuracy']:.2f}, "
                          f"margin {summary['val_reward_margin']:.3f})")  # fmt: skip
    elif summary.get("kl") is not None:  # trainer=kto: no accuracy (its completions are not paired)
        margin = summary.get("reward_margin")  # a step with both kinds of completion
        said = f"preference: kl {summary['kl']:.4f}"
        lines.append(said if margin is None else f"{said}, reward margin {margin:.3f}")
    if summary.get("accuracy") is not None:  # trainer=reward_model
        lines.append(f"reward model: accuracy {summary['accuracy']:.2f}, margin {summary['margin']:.3f}")
        if summary.get("val_accuracy") is not None:
            lines[-1] += (f" (held-out pairs: accuracy {summary['val_accuracy']:.2f}, "
                          f"margin {summary['val_margin']:.3f})")  # fmt: skip
    if summary.get("reward") is not None:  # data=prompts
        lines.append(f"grpo: reward {summary['first_reward']:.4f} -> {summary['reward']:.4f}; completions "
                     f"{summary['completion_mean_length']:.1f} tokens on average, "
                     f"{summary['completion_clipped_ratio']:.0%} cut at grpo.max_completion_length")  # fmt: skip
        if summary.get("val_reward") is not None:
            lines[-1] += f"; held-out prompts: reward {summary['val_reward']:.4f} at step {summary['val_step']}"
        if summary.get("tool_call_frequency") is not None:
            lines.append(_tool_line(summary))
        if summary.get("no_signal_steps"):
            lines.append(f"grpo: {summary['no_signal_steps']} of {summary['steps']} steps without a learning signal: "
                         f"{NO_SIGNAL}")  # fmt: skip
    speed = []
    if summary.get("tokens_per_second") is not None:
        speed.append(f"{summary['tokens_per_second']:,.0f} tok/s")
    if summary.get("mfu") is not None:
        speed.append(f"mfu {100 * summary['mfu']:.2f}%")
    memory = [f"{label} {summary[key]:.3g} GiB" for key, label in
              (("peak_memory_gib", "peak"), ("tensor_memory_gib", "tensors"), ("tracked_peak_gib", "tracked step peak"),
               ("max_memory_allocated_gib", "max allocated"), ("memory_estimate_gib", "estimate"))
              if summary.get(key) is not None]  # fmt: skip
    if speed or memory:
        lines.append("speed: " + (", ".join(speed) or "-") + "; memory per rank: " + (", ".join(memory) or "-"))
    categories = summary.get("tracked_peak_by_category_gib")
    if categories:  # run.measure_memory
        shown = ", ".join(f"{name} {gib:.3g}" for name, gib in categories.items() if gib >= 0.0005)
        ratio = ""
        if summary.get("memory_estimate_gib"):
            ratio = f"; estimate / tracked {summary['memory_estimate_gib'] / summary['tracked_peak_gib']:.2f}"
        lines.append(f"memory of step {summary['tracked_step']} at its peak (every live tensor, GiB): {shown}{ratio}")
    if summary.get("data_stats"):
        lines += data_lines(summary["data_stats"])
    compiled = summary.get("compiled")
    if compiled:  # what torch.compile did in the workers: a recompile per step shows here
        lines.append(f"compiled ({compiled['backend']}): {compiled['graphs']} graph(s) on {compiled['ranks_with_graphs']} "
                     f"rank(s), {compiled['recompiles']} recompile(s), {compiled['compile_seconds']:.1f} s compiling")  # fmt: skip
    for key, label in (("export_dir", "HF export"), ("adapter_dir", "PEFT adapter"), ("error", "error")):
        if key == "error" and summary.get("user_error"):
            continue  # the user's mistake (Data error, Reward error, ...): said once, when the workers stopped
        if summary.get(key):
            lines.append(f"{label}: {summary[key]}")
    scores = [f"{task} {metric} {value:.4g}" for task, metrics in (summary.get("eval") or {}).items()
              for metric, value in metrics.items()]  # fmt: skip
    if scores:
        lines.append(f"lm-eval ({summary['eval_seconds']:.0f} s): " + "; ".join(scores))
    if summary.get("eval_error"):
        lines.append(f"eval error (the run and its export are kept): {summary['eval_error']}")
    return lines


WARN_NOT_TRAINED = 0.01  # a share of rows dropped or skipped above this is a warning at the end of a run
# what each fate of a row means, for the user
FATES = {
    "dropped": "too long for training.seq_len or nothing left to train",
    "skipped": "cannot be read as the data kind's row",
    "truncated": "kept, cut to training.seq_len",
    "split": "kept, run on across samples",
}


def data_lines(stats: dict[str, Any]) -> list[str]:
    """Every row read, by what happened to it (all ranks), the first of each fate with where and
    why, and a warning when more than 1 % of them are not trained."""
    rows, dropped, skipped = stats.get("rows", 0), stats.get("dropped", 0), stats.get("skipped", 0)
    line = (f"data: {rows:,} rows read: {rows - dropped - skipped:,} kept ({stats.get('truncated', 0):,} of them "
            f"truncated), {dropped:,} dropped, {skipped:,} skipped")  # fmt: skip
    if stats.get("packing_efficiency") is not None:
        line += (f"; packing efficiency {stats['packing_efficiency']:.4f} (the share of tokens that is not padding); "
                 f"{stats.get('buffered_documents', 0):,} documents read but not trained on (still buffered)")  # fmt: skip
    lines = [line]
    went_round = bool(stats.get("pass_rows")) and rows > stats["pass_rows"]
    if went_round:  # rows read again: say so, with how often
        lines.append(f"data: went round: {stats['pass_rows']:,} rows, {rows / stats['pass_rows']:.2f} passes over "
                     "them (each pass reshuffled)")  # fmt: skip
    if rows and (dropped + skipped) / rows > WARN_NOT_TRAINED:
        lines.append(f"data: warning: {100 * (dropped + skipped) / rows:.1f} % of the rows read are not trained "
                     f"(above {100 * WARN_NOT_TRAINED:.0f} %); data.max_dropped sets the share that stops a run")  # fmt: skip
    for fate, meaning in FATES.items():
        if stats.get(fate):
            lines.append(f"  {fate} {stats[fate]:,} ({meaning}):")
            shown = (stats.get("examples") or {}).get(fate, [])[:EXAMPLES_SHOWN]
            lines += [f"    {row}" for row in shown]
            if len(shown) == EXAMPLES_SHOWN and stats[fate] > len(shown):  # fewer: every row of it is named
                again = " (a row read on each pass counts each time)" if went_round else ""
                lines.append(f"    and {stats[fate] - len(shown):,} more{again}")
    return lines


EXAMPLES_SHOWN = 5  # rows named per fate at the end of a run (summary.json's data_stats has each rank's first)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, whole or not at all; a full disk is said, and the job's outcome stands."""
    try:
        write_json(run_dir / SUMMARY_FILE, summary)
    except OSError as e:
        print(f"[qwen3-neuron] {run_dir / SUMMARY_FILE} could not be written: {e.strerror}", file=sys.stderr)


def sweep_job_value(
    summary: dict[str, Any], objective: str, *, stop_on_failure: bool, sweep_dir: Path | None = None, job: str = ""
) -> float | None:
    """What a multirun job returns to Hydra's sweeper: the objective of a completed job; None for
    a failed one, which the basic sweeper ignores and Optuna marks FAIL (its value is not a
    number), never scores. An interrupted job, or with run.stop_on_failure=true a failed one,
    stops the sweep: it leaves a note in the sweep dir that makes the jobs after it skip (Hydra
    launches a whole batch before it looks at results) and raises JobFailed."""
    status = summary["status"]
    if status == "interrupted" or (status != "completed" and stop_on_failure):
        reason = f"job {job} {status}: {summary.get('error') or 'see its run dir'}".replace("  ", " ")
        if sweep_dir is not None:
            (sweep_dir / STOP_FILE).write_text(reason + "\n")
        raise JobFailed(reason)
    value = objective_value(summary, objective) if status == "completed" else None
    return float(value) if value is not None and math.isfinite(value) else None


def sweep_stop_reason(sweep_dir: Path) -> str | None:
    """Why an earlier job stopped this sweep, if one did."""
    path = sweep_dir / STOP_FILE
    return path.read_text().strip() if path.exists() else None
