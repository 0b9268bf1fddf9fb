"""Score an existing run (its HF export) or any HF model dir with lm-eval, training nothing:

    python -m qwen3_neuron.eval <run dir | HF dir> eval.tasks=[tiny_chat_answer] eval.apply_chat_template=true

Keys as after training (`eval.tasks`, `eval.limit`, `eval.num_fewshot`, `eval.batch_size`,
`eval.apply_chat_template`, `eval.include_path`, `eval.device`). A run dir gets lm-eval's
results in `eval/results.json` and its summary.json's `eval` (or `eval_error`); an HF dir that
is not a run dir is only printed ({task: {metric: value}} as JSON), nothing written beside it.
Exit code 2 for bad input, 1 when the evaluation failed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings
from qwen3_neuron.eval.run import evaluate_run, evaluation_device, local_device, prepare, rescore
from qwen3_neuron.fields import apply_fields
from qwen3_neuron.run_dir import SUMMARY_FILE, read_json


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0]).resolve()
    try:
        settings = _settings(argv[1:])
        summary = read_json(target / SUMMARY_FILE)
        if summary is None and not (target / "config.json").exists():
            raise ConfigError(
                f"{target} is neither a run dir (no {SUMMARY_FILE}) nor an HF model dir (no config.json)."
            )
        fields = summary if summary is not None else {"export_dir": str(target)}
        device = evaluation_device(settings, local_device())
        if summary is not None:
            return rescore(target, settings, summary, device)
        manager = prepare(settings, device)
    except (ConfigError, OmegaConfBaseException) as e:
        print(f"Config error: {e}", file=sys.stderr)
        return 2
    # a plain HF dir: lm-eval's results go to a scratch dir, the scores to stdout
    with tempfile.TemporaryDirectory() as scratch:
        result = evaluate_run(Path(scratch), settings, fields, device, manager, verbose=False)
    print(json.dumps(result["eval"]))
    return 1 if result["eval_error"] else 0


def _settings(overrides: list[str]) -> EvalSettings:
    """`eval.*` overrides (Hydra's dotted syntax, as on launch.py's command line)."""
    stray = [o for o in overrides if not o.startswith("eval.")]
    if stray:
        raise ConfigError(f"{stray[0]}: only eval.* keys are read here (e.g. eval.tasks=[tiny_chat_answer]).")
    values = OmegaConf.to_container(OmegaConf.from_dotlist(overrides)).get("eval", {})
    return apply_fields(EvalSettings(kind="lm_eval"), values, "eval")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
