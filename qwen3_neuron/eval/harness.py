"""Score an HF model dir with lm-eval's Python API (`simple_evaluate`, its `hf` model): lm-eval's
own results file in `<out dir>/results.json`, and the headline metrics the summary keeps. Every
task scores a generated reply without its reasoning block, as the chat command prints it."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from qwen3_neuron.eval.eval_section import EvalSettings

RESULTS_FILE = "results.json"
# where a reply's reasoning ends: lm-eval's hf model scores a generated reply from after the last one
# (a chat SFT export opens every reply with `<think>\n\n</think>\n\n`: data.thinking=empty_block)
THINK_END = "</think>"
# lm-eval's results.json sections keyed by task (or group)
PER_TASK_SECTIONS = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples")


def evaluate(
    model_dir: Path, settings: EvalSettings, out_dir: Path, device: str, manager, adapter_dir: Path | None = None
) -> dict[str, dict[str, float]]:
    """Run `settings.tasks` on `model_dir` (with the PEFT adapter `adapter_dir` on top, if any)
    on `device`; write lm-eval's results into `out_dir`; return {task: {metric: value}}."""
    import lm_eval
    import lm_eval.evaluator
    from lm_eval.utils import handle_non_serializable

    lm_eval.evaluator.get_git_commit_hash = _git_commit_hash

    model_args: dict[str, Any] = {"pretrained": str(model_dir), "dtype": "auto", "think_end_token": THINK_END}
    if adapter_dir is not None:
        model_args["peft"] = str(adapter_dir)
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=model_args,
        tasks=list(settings.tasks),
        num_fewshot=settings.num_fewshot,
        batch_size=settings.batch_size,
        limit=settings.limit,
        device=device,
        apply_chat_template=settings.apply_chat_template,
        task_manager=manager,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    merged = merge_results(json.loads((out_dir / RESULTS_FILE).read_text()) if (out_dir / RESULTS_FILE).exists() else {}, results)
    (out_dir / RESULTS_FILE).write_text(json.dumps(merged, indent=2, default=handle_non_serializable) + "\n")
    return headline_metrics(results, settings.tasks)


def _git_commit_hash() -> str | None:
    """What lm-eval records as the working dir's git commit, found as lm-eval finds it, but with
    git's own complaint outside a repository (`fatal: not a git repository`) kept off the console."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


def merge_results(earlier: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results of one model, evaluated more than once: each per-task section (results,
    configs, versions, n-shot, ...) holds every task scored, a task scored again its newest
    scores; the rest (model arguments, dates) is the newest evaluation's."""
    merged = {**earlier, **new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(earlier.get(key), dict) and key in PER_TASK_SECTIONS:
            merged[key] = {**earlier[key], **value}
    return merged


def headline_metrics(results: dict[str, Any], tasks: list[str]) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for the tasks asked for (a group: its aggregate, if it has one).
    lm-eval names a metric `metric,filter`; here it is `metric` for the unfiltered one and
    `metric/filter` otherwise: a comma would make `run.objective=eval.<task>.<metric>` a sweep."""
    headline = {}
    for task in tasks:
        scores = results["results"].get(task, {})
        headline[task] = {
            _metric_name(key): float(value)
            for key, value in scores.items()
            if "," in key and "_stderr," not in key and isinstance(value, (int, float)) and math.isfinite(value)
        }
    return headline


def _metric_name(key: str) -> str:
    metric, _, filter_name = key.partition(",")
    return metric if filter_name == "none" else f"{metric}/{filter_name}"
