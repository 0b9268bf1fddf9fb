"""`run.resume=<run dir>` with new `eval.*` of a run that completed: evaluate, never retrain.

An interrupted run resumes as before (training to its end, then the evaluation it now names); a
completed one has nothing left to train, and may have no checkpoint to resume from at all (an HF
export is its last save), so its evaluation runs on its export at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings
from qwen3_neuron.fields import apply_fields
from qwen3_neuron.run_dir import SUMMARY_FILE, read_json


def rescore_settings(run_dir: Path, composed: dict[str, Any], typed_overrides: list[str]) -> EvalSettings | None:
    """The new evaluation of a completed run when the command sets `eval.*` (and `run.*` only
    besides); None when the run did not complete or the command changes nothing of `eval`."""
    summary = read_json(run_dir / SUMMARY_FILE) or {}
    keys = [o.key_or_group for o in OverridesParser.create().parse_overrides(typed_overrides)]
    if summary.get("status") != "completed" or not any(key.split(".")[0] == "eval" for key in keys):
        return None
    others = [key for key in keys if key.split(".")[0] not in ("eval", "run", "hydra")]
    if others:
        raise ConfigError(
            f"run.resume={run_dir}: the run completed; a resume may only evaluate it again (eval.*), "
            f"but this command also sets '{others[0]}'. Train a new run for that."
        )
    settings = apply_fields(EvalSettings(), composed.get("eval") or {}, "eval")
    if settings.kind == "none":
        raise ConfigError(f"run.resume={run_dir}: the run completed; add eval=lm_eval eval.tasks=[...] to evaluate it.")
    return settings
