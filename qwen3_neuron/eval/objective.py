"""`run.objective=eval.<task>.<metric>`: a sweep job's value from its evaluation. The summary's
`eval` is {task: {metric: value}}; the objective names one of its values, with the direction
lm-eval gives the metric (accuracy and exact match: higher is better)."""

from __future__ import annotations

import difflib
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings

PREFIX = "eval."
# summary.json fields a job may return besides eval.<task>.<metric>
SUMMARY_OBJECTIVES = ("final_loss", "first_loss", "val_loss", "tokens_per_second", "mfu", "peak_memory_gib", "wall_seconds",
                      "reward_accuracy", "reward_margin", "val_reward_accuracy", "val_reward_margin", "reward",
                      "val_reward")  # fmt: skip
# (reward_* and val_reward_*: data=preference only; reward and val_reward: data=prompts, the last
# step's GRPO reward and the last validation's)


def flat_scores(summary: dict[str, Any]) -> dict[str, float]:
    """{"eval.<task>.<metric>": value} of a summary's evaluation (the sweep table's columns)."""
    scores = summary.get("eval") or {}
    return {f"{PREFIX}{task}.{metric}": value for task, metrics in scores.items() for metric, value in metrics.items()}


def objective_value(summary: dict[str, Any], objective: str) -> Any:
    return flat_scores(summary).get(objective) if objective.startswith(PREFIX) else summary.get(objective)


def split_objective(objective: str, settings: EvalSettings) -> tuple[str, str]:
    """(task, metric) of `eval.<task>.<metric>`, the task one of eval.tasks (a name may hold dots)."""
    name = objective.removeprefix(PREFIX)
    for task in settings.tasks:
        if name.startswith(task + ".") and name != task + ".":
            return task, name[len(task) + 1 :]
    evaluated = ", ".join(f"eval.{t}.<metric>" for t in settings.tasks) or "none: eval=none"
    raise ConfigError(
        f"run.objective={objective} names no task this run evaluates (eval.tasks: {settings.tasks}). "
        f"Evaluated objectives: {evaluated}."
    )


def check_objective(objective: str, settings: EvalSettings) -> None:
    """Before anything starts: a summary field, or eval.<task>.<metric> of an evaluated task."""
    if objective.startswith(PREFIX):
        if settings.kind == "none":
            raise ConfigError(f"run.objective={objective} needs an evaluation: add eval=lm_eval eval.tasks=[...].")
        split_objective(objective, settings)
    elif objective not in SUMMARY_OBJECTIVES:
        close = difflib.get_close_matches(objective, SUMMARY_OBJECTIVES, n=1)
        raise ConfigError(
            f"run.objective={objective!r} is not a summary field a job can return."
            + (f" Did you mean {close[0]!r}?" if close else "")
            + f" Valid: "
            f"{', '.join(SUMMARY_OBJECTIVES)}, or eval.<task>.<metric> with eval=lm_eval."
        )


def check_objective_metric(objective: str, settings: EvalSettings, manager, direction: str | None) -> None:
    """With lm-eval's registry: the metric is one the task reports (when its YAML lists them), and
    a sweeper's `direction` (Optuna's) is the one the metric needs."""
    from lm_eval.api.registry import is_higher_better

    task, metric = split_objective(objective, settings)
    config = manager.task_index[task].cfg or {}
    listed = {m["metric"]: m for m in config.get("metric_list") or [] if isinstance(m.get("metric"), str)}
    filters = [f["name"] for f in config.get("filter_list") or [] if "name" in f]
    valid = [f"{m}/{f}" for m in listed for f in filters] if filters else list(listed)
    if valid and metric not in valid:
        raise ConfigError(
            f"run.objective={objective}: {task} reports no metric {metric!r}. Valid: "
            f"{', '.join(PREFIX + task + '.' + v for v in valid)}."
        )
    base = metric.partition("/")[0]
    higher = listed.get(base, {}).get("higher_is_better", is_higher_better(base))
    wanted = {True: "maximize", False: "minimize"}.get(higher)
    if direction and wanted and str(direction).lower().rsplit(".", 1)[-1] != wanted:
        raise ConfigError(
            f"run.objective={objective}: {'higher' if higher else 'lower'} is better for {base}, but the "
            f"sweeper would {direction}. Set hydra.sweeper.direction={wanted}."
        )
