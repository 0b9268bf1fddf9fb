"""Which lm-eval tasks a run names, checked before anything trains: every name is in lm-eval's
registry (with the project's own tasks and `eval.include_path`), and every Hub data set a task
reads is in the local HF cache (runs are offline; lm-eval would otherwise try to download).

lm-eval's full registry takes seconds to index (about 7 s of CPU: ~15,000 task YAMLs), so the
launcher builds it once, only when a run evaluates, and only when a task is not the project's
own or in `eval.include_path` (those index in a tenth of a second)."""

from __future__ import annotations

import difflib
from pathlib import Path

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings

PROJECT_TASKS = Path(__file__).with_name("tasks")  # tiny_chat_answer: what the CPU tests score
# `dataset_path` values that name a datasets builder over local files, not a Hub data set
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas", "imagefolder", "audiofolder"}


def include_paths(settings: EvalSettings) -> list[str]:
    extra = settings.include_path
    return [str(PROJECT_TASKS), *([extra] if isinstance(extra, str) else (extra or []))]


def task_manager(settings: EvalSettings):
    """lm-eval's TaskManager over the project's tasks and `eval.include_path`, and over lm-eval's
    own too only when a named task is not among those (indexing them is what takes seconds)."""
    from lm_eval.tasks import TaskManager

    for path in include_paths(settings)[1:]:
        if not Path(path).is_dir():
            raise ConfigError(f"eval.include_path: {path} is not a folder (lm-eval task YAMLs go in one).")
    local = TaskManager(include_path=include_paths(settings), include_defaults=False)
    if settings.tasks and all(name in local.task_index for name in settings.tasks):
        return local
    return TaskManager(include_path=include_paths(settings))


def check_tasks(settings: EvalSettings, manager) -> None:
    """ConfigError for an unknown task name (with close matches) or a task whose Hub data set is
    not in the local HF cache (with the command that fetches it)."""
    if not settings.tasks:
        raise ConfigError(
            "eval=lm_eval needs eval.tasks: a list of lm-eval task names, e.g. eval.tasks=[tiny_chat_answer]."
        )
    for name in settings.tasks:
        if name not in manager.task_index:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3, cutoff=0.75)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ConfigError(
                f"eval.tasks: unknown lm-eval task {name!r}.{hint} `lm-eval ls tasks` lists the "
                f"{len(manager.all_tasks):,} known; your own task YAMLs go in eval.include_path."
            )
        for repo_id in sorted(_hub_datasets(manager, name)):
            _check_cached(repo_id, name)


def _hub_datasets(manager, name: str, seen: set[str] | None = None) -> set[str]:
    """The Hub data sets task, group or tag `name` reads, from the registry's YAMLs."""
    seen = seen if seen is not None else set()
    if name in seen or name not in manager.task_index:
        return set()
    seen.add(name)
    entry = manager.task_index[name]
    config = entry.cfg or {}
    found = set()
    path = config.get("dataset_path")
    if (
        isinstance(path, str)
        and path not in LOCAL_BUILDERS
        and not Path(path).exists()
        and "custom_dataset" not in config
    ):
        found.add(path)
    if entry.kind.name == "GROUP":  # a group lists its tasks (names, or inline configs)
        members = [m if isinstance(m, str) else m.get("task") for m in config.get("task") or []]
    elif entry.kind.name == "TAG":  # a tag: the tasks carrying it
        members = [task for task, other in manager.task_index.items() if name in other.tags]
    else:
        members = []
    for member in filter(None, members):
        found |= _hub_datasets(manager, member, seen)
    return found


def _check_cached(repo_id: str, task: str) -> None:
    from huggingface_hub.constants import HF_HUB_CACHE

    if not (Path(HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}").is_dir():
        raise ConfigError(
            f"eval.tasks: {task} reads {repo_id}, which is not in the local HF cache ({HF_HUB_CACHE}), "
            f"and runs are offline. Download it once with network: `hf download {repo_id} --repo-type dataset`"
        )
