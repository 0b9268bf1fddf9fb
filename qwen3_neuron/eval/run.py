"""lm-eval on what a run exported, in the launcher once the workers have exited (or on its own:
`python -m qwen3_neuron.eval`). The launcher holds the run dir and the export then, and nothing
an evaluation does can reach the training: the run and its export are final before it starts,
and a failure or an interrupt is recorded as `eval_error` beside a `completed` status."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings
from qwen3_neuron.eval.harness import evaluate
from qwen3_neuron.eval.task_checks import check_tasks, task_manager
from qwen3_neuron.run_dir import SUMMARY_FILE, write_json

EVAL_DIR = "eval"  # <run dir>/eval/: lm-eval's results.json, eval.log
LOG_FILE = "eval.log"


def evaluation_device(settings: EvalSettings, run_device: str) -> str:
    """eval.device, else the run's device where Transformers runs there (cuda), else cpu."""
    return settings.device or ("cuda" if run_device == "cuda" else "cpu")


def local_device() -> str:
    """The device of a run evaluated after the fact: cuda where this machine has it, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_export_planned(composed: dict[str, Any]) -> None:
    """eval=lm_eval scores the HF export: the run must write one."""
    checkpoint = composed.get("checkpoint") or {}
    if not (checkpoint.get("enable") and checkpoint.get("last_save_in_hf")):
        raise ConfigError(
            "eval=lm_eval scores the run's HF export, and this run writes none: add checkpointing=export_hf "
            "(with checkpointing=from_hf: checkpointing=[from_hf,export_hf])."
        )


def prepare(settings: EvalSettings, run_device: str):
    """The checked task registry (lm-eval's TaskManager), before anything trains; the plan line."""
    manager = task_manager(settings)
    check_tasks(settings, manager)
    print(
        f"[qwen3-neuron] evaluation: lm-eval on {evaluation_device(settings, run_device)}, "
        f"tasks {', '.join(settings.tasks)}" + (" (chat template)" if settings.apply_chat_template else ""),
        flush=True,
    )
    return manager


def model_to_evaluate(fields: dict[str, Any]) -> tuple[Path, Path | None]:
    """(model dir, PEFT adapter or None) from the summary's export fields: the merged export, or
    a LoRA adapter alone on the base it names (finetune.merge_export=false)."""
    if fields.get("export_dir"):
        return Path(fields["export_dir"]), None
    if fields.get("adapter_dir"):
        adapter = Path(fields["adapter_dir"])
        base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
        return Path(base), adapter
    raise ConfigError("the run has no HF export to evaluate (its summary names no export_dir or adapter_dir).")


def evaluate_run(
    run_dir: Path, settings: EvalSettings, fields: dict[str, Any], device: str, manager, verbose: bool
) -> dict[str, Any]:
    """The summary's `eval` ({task: {metric: value}}) and `eval_seconds`, or its `eval_error`."""
    out_dir = run_dir / EVAL_DIR
    out_dir.mkdir(exist_ok=True)
    start = time.time()
    print(f"[qwen3-neuron] evaluating with lm-eval on {device}: {', '.join(settings.tasks)} ...", flush=True)
    try:
        model_dir, adapter = model_to_evaluate(fields)
        with _quiet(out_dir / LOG_FILE, verbose):
            scores = evaluate(model_dir, settings, out_dir, device, manager, adapter)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - whatever fails, the run and its export stay
        error = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        print(f"[qwen3-neuron] evaluation failed: {error} (the run and its export are kept; log: "
              f"{out_dir / LOG_FILE})", file=sys.stderr, flush=True)  # fmt: skip
        return {"eval": fields.get("eval"), "eval_error": f"evaluation failed: {error}"[:1000]}
    seconds = round(time.time() - start, 3)
    shown = "; ".join(f"{task} {m} {v:.4g}" for task, metrics in scores.items() for m, v in metrics.items())
    print(f"[qwen3-neuron] evaluation done in {seconds:.0f} s: {shown}", flush=True)
    # the tasks scored before stay beside these (a task scored again: its new scores)
    return {"eval": {**(fields.get("eval") or {}), **scores}, "eval_seconds": seconds, "eval_error": None}


def set_aside_earlier_scores(run_dir: Path, earlier_summary: dict[str, Any] | None) -> Path | None:
    """A completed run trained on (extended): the scores of its earlier model move to
    `eval/step-N/` (N: the step that model ended at; its summary's scores in scores.json), so
    that nothing in `eval/` or summary.json's `eval` looks like the new model's."""
    out_dir = run_dir / EVAL_DIR
    current = [p for p in out_dir.iterdir() if not p.name.startswith("step-")] if out_dir.is_dir() else []
    scores = (earlier_summary or {}).get("eval")
    if not current and not scores:
        return None
    aside = out_dir / f"step-{(earlier_summary or {}).get('steps')}"
    aside.mkdir(parents=True, exist_ok=True)
    for path in current:
        path.rename(aside / path.name)
    if scores:
        write_json(aside / "scores.json", scores)
    return aside


def rescore(run_dir: Path, settings: EvalSettings, summary: dict[str, Any], device: str, verbose: bool = False) -> int:
    """Evaluate a completed run again (other tasks, other settings), training nothing: its
    `eval/` and summary.json are updated. The exit code: 0, or 1 when the evaluation failed."""
    if summary.get("status") != "completed":
        raise ConfigError(
            f"{run_dir} did not complete (status {summary.get('status')}): there is no trained model to evaluate."
        )
    model_to_evaluate(summary)  # it has an export
    manager = prepare(settings, device)
    result = evaluate_run(run_dir, settings, summary, device, manager, verbose)
    write_json(run_dir / SUMMARY_FILE, {**summary, **result})
    return 1 if result["eval_error"] else 0


@contextlib.contextmanager
def _quiet(log_file: Path, verbose: bool):
    """lm-eval's log and progress bars go to `log_file` unless run.verbose (as train.log does)."""
    if verbose:
        yield
        return
    lm_eval_log = logging.getLogger("lm_eval")  # else Hydra's console handler on the root logger shows it
    with open(log_file, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        lm_eval_log.addHandler(handler)
        lm_eval_log.propagate = False
        try:
            yield
        finally:
            lm_eval_log.removeHandler(handler)
            lm_eval_log.propagate = True
