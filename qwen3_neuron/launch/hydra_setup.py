"""Stage 1 support: what Hydra needs before it composes `conf/`.

- `torchtitan_sections`: a node holding every Trainer.Config section, each opened to any key, so
  `training.steps=20` works without a `+` and every key reaches `fields.apply_fields`, which
  checks it against torchtitan's dataclasses and names the closest valid keys on a typo. The
  framework's `run` and `hf` sections start there from their settings' defaults
  (`job.settings`, one docstring per key): no YAML restates them.
- the `${assets:...}` resolver: paths of the project's tiny generated assets.
- the `${tokenizer_dir:...}` resolver: `hf_assets_path`'s default, the HF dir that
  checkpointing=from_hf loads when it has a tokenizer (its weights were trained with it), else
  the tiny tokenizer.
- the `${bundled_chat_validation:...}` resolver: data=chat's default validation set, the bundled
  conversations' own, only while the training rows are the bundled ones and no
  `data.val_fraction` is set: a user's own data is validated on what they name, never on ours.
- the `${resume_or:...}` resolver: the run dir is `run.resume` when resuming, else a new one.
- the `${new_run_only:...}` resolver: Hydra writes its record of a launch (`.hydra/`) for a new
  run only. A resume, refused or not, or a launch into a run dir that has a record already (one
  refused because another launch owns the dir too: Hydra writes before the job can look) leaves
  the first launch's record as it was (the sweep report reads a job's overrides there);
  `job.yaml` records what a resume changes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from qwen3_neuron.assets import build as assets
from qwen3_neuron.job.settings import SECTIONS, HFSettings, RunSettings

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Trainer.Config's sections: its fields with a default factory, `model_spec` aside. Written out so
# that Hydra composes without importing torchtitan (seconds before a typo could be reported);
# tests/test_config.py holds the list equal to torchtitan's own.
TRAINER_SECTIONS = (
    "profiler", "metrics", "tokenizer", "dataloader", "optimizer", "lr_scheduler", "training",
    "parallelism", "checkpoint", "activation_checkpoint", "compile", "comm", "validator", "debug",
    "override", "loss",
)  # fmt: skip


def register() -> None:
    """Idempotent; call before Hydra composes (launch.py, tests using the compose API)."""
    ConfigStore.instance().store(name="torchtitan_sections", node=_open_sections())
    register_resolvers()


def experiment_without_plus(argv: list[str]) -> list[str]:
    """`+experiment=NAME` (the form before `experiment` was in the defaults list) as
    `experiment=NAME`: Hydra refuses to add a group the defaults list already has."""
    return [arg[1:] if arg.startswith("+experiment=") else arg for arg in argv]


def register_resolvers() -> None:
    """The resolvers alone: what a process that resolves an already composed config needs."""
    OmegaConf.register_new_resolver("assets", _asset, replace=True)
    OmegaConf.register_new_resolver("resume_or", _resume_or, replace=True)
    OmegaConf.register_new_resolver("new_run_only", _new_run_only, replace=True)
    OmegaConf.register_new_resolver("tokenizer_dir", _tokenizer_dir, replace=True)
    OmegaConf.register_new_resolver("bundled_chat_validation", _bundled_chat_validation, replace=True)


def _open_sections():
    names = [*TRAINER_SECTIONS, *SECTIONS]
    defaults = {"run": dataclasses.asdict(RunSettings()), "hf": dataclasses.asdict(HFSettings())}
    node = OmegaConf.create({name: defaults.get(name, {}) for name in names})
    for name in names:
        OmegaConf.set_struct(node[name], False)
    return node


def _asset(name: str) -> str:
    if name == "dataset_name":
        return assets.DATASET_NAME
    return str(getattr(assets.asset_paths(), name))  # a dir, or a file (text_train_file, chat_train_file, ...)


def _bundled_chat_validation(files, val_fraction: float) -> str | None:
    if val_fraction or files != _asset("chat_train_file"):
        return None
    return _asset("chat_validation_file")


# What torchtitan's HuggingFaceTokenizer opens: tokenizer.json, or a BPE's vocab.json + merges.txt.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


def _tokenizer_dir(initial_load_path: str | None, initial_load_in_hf: bool | None) -> str:
    if initial_load_in_hf and initial_load_path:
        load_dir = Path(initial_load_path).expanduser()
        if any((load_dir / name).is_file() for name in TOKENIZER_FILES):
            return str(load_dir)
    return _asset("tokenizer_dir")


def _resume_or(resume: str | None, new_dir: str) -> str:
    return new_dir if resume is None else str(Path(resume).expanduser().resolve())


def _new_run_only(resume: str | None, run_dir: str, value: str) -> str | None:
    return value if resume is None and not (Path(run_dir) / value).exists() else None
