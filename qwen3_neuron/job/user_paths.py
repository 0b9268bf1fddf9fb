"""The files and dirs a run reads that a command line may name relative to where it is typed.

The launcher makes each absolute once, when it settles the job (`Job.settled`), and job.yaml
records them so: the workers, a resume from another directory or shell, and an export or an
evaluation later read what the first launch read (`run.python_path` is recorded alike). A
relative path that names nothing here is left as typed, for the check that refuses it to name
it as the user wrote it (and a Hub id such as Qwen/Qwen3-0.6B is no path here). Paths relative
to the run dir (hf.export_dir, checkpoint.folder) are the run dir's, not the launch's.
"""

from __future__ import annotations

import copy
import glob
import os
from typing import Any

# dotted keys of the composed config; data=mix's `data.sources[i].files` too
USER_PATHS = (
    "data.files",
    "data.val_files",
    "model.hf_model",
    "checkpoint.initial_load_path",
    "hf_assets_path",
    "dataloader.dataset_path",
    "validator.dataloader.dataset_path",
    "eval.include_path",
)


def absolute_paths(composed: dict[str, Any], launch_dir: str) -> dict[str, Any]:
    """`composed` with every relative path of `USER_PATHS` that names something in `launch_dir`
    made absolute (a glob: one that matches there); the rest as it was."""
    settled = copy.deepcopy(composed)
    for key in USER_PATHS:
        *sections, name = key.split(".")
        section = settled
        for part in sections:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and section.get(name):
            section[name] = _absolute(section[name], launch_dir)
    for source in (settled.get("data") or {}).get("sources") or []:
        if isinstance(source, dict) and source.get("files"):
            source["files"] = _absolute(source["files"], launch_dir)
    return settled


def _absolute(value: str | list, launch_dir: str) -> str | list:
    if isinstance(value, list):
        return [_absolute(item, launch_dir) for item in value]
    if not isinstance(value, str):
        return value
    path = os.path.expanduser(value)
    if os.path.isabs(path):
        return path
    here = os.path.join(launch_dir, path)
    found = glob.glob(here, recursive=True) if glob.has_magic(path) else os.path.exists(here)
    return os.path.normpath(here) if found else value
