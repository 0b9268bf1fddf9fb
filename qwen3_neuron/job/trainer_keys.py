"""torchtitan's `Trainer.Config` keys and their types, known without importing torchtitan
(seconds): the launcher refuses a misspelled key of one of torchtitan's own sections
(`training.stpes=3`) and a value of the wrong type (`optimizer.lr=fast`) before torchrun starts,
with the message the plan's `fields.apply_fields` gives for it.

`trainer_keys.json` holds, per torchtitan version (the installed one read from its package
metadata, which is cheap), the tree of fields, each with its type (`fields.hint_text`: a class
of torchtitan's own there is any value, left to the plan), of the base config of each config function
`conf/model/` names, and of the packed data loader that a packed data kind puts in `dataloader`
(and in `validator.dataloader` with a validation set). What it does not know is left to the plan:
a torchtitan version it has no schema for (said once per launch), another config function, a
node with `_target_` (another class). The plan, which imports torchtitan anyway, compares the
schema it used with the installed classes and says when they disagree
(`schema_disagreement`). `python -m qwen3_neuron.job.trainer_keys` writes the installed
version's schema from its classes; tests/test_config.py holds it equal to them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.fields import check_type, hint_from_text, key_tree, unknown_key_message
from qwen3_neuron.job.settings import FRAMEWORK_OWNED, OPTIMIZER_SHORTHANDS, PACKED_KINDS, SECTIONS, Settings

KEYS_FILE = Path(__file__).with_name("trainer_keys.json")

# The base configs the model groups name, as `<model.module>:<model.config_fn>`.
BASE_CONFIGS = ("qwen3:qwen3_32b", "transformers_modeling_backend:transformers_modeling_backend_full")

# Where a torchtitan may be installed from: upstream's package, AWS's fork (which installs the
# same `torchtitan` import package).
DISTRIBUTIONS = ("torchtitan", "torchtitan-neuron")


def check_trainer_keys(composed: Mapping[str, Any], settings: Settings) -> None:
    """Refuse a key torchtitan's sections do not have, or a value of the wrong type, as the plan
    would (ConfigError)."""
    tree = _tree_for(settings)
    if tree is None:
        return
    for section, values in composed.items():
        if section in SECTIONS or section in FRAMEWORK_OWNED:
            continue  # the framework's own sections; the plan names the owned fields' keys
        if section == "optimizer" and isinstance(values, Mapping):
            for key, hint in OPTIMIZER_SHORTHANDS.items():
                if key in values:
                    check_type(values[key], hint, f"optimizer.{key}")
            values = {k: v for k, v in values.items() if k not in OPTIMIZER_SHORTHANDS}
        _check(tree, {section: values}, "")


def schema_disagreement(settings: Settings) -> str | None:
    """What the launcher's schema for this job says that the installed torchtitan's classes do
    not (imports torchtitan: the plan's); None when they agree or there is no schema to check."""
    schema, name = _schema(), _base_config_name(settings)
    if schema is None or name not in schema["configs"]:
        return None
    real = _base_config_keys(name)
    recorded = schema["configs"][name]
    if settings.data.kind in PACKED_KINDS:
        real, recorded = {**real, "dataloader": _packed_keys()}, {**recorded, "dataloader": schema["packed_dataloader"]}
    recorded_keys, real_keys = _dotted(recorded), _dotted(real)
    if recorded_keys == real_keys:
        return None
    differences = [
        f"{label}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
        for label, keys in (("only in the file", sorted(recorded_keys - real_keys)),
                            ("only in torchtitan", sorted(real_keys - recorded_keys))) if keys
    ]  # fmt: skip
    return (
        f"{KEYS_FILE.name}'s keys of torchtitan {installed_torchtitan()} for {name} are not the installed "
        f"classes' ({'; '.join(differences)}): the launcher may refuse a valid key, or leave a misspelled one "
        "to this plan. Rewrite them: python -m qwen3_neuron.job.trainer_keys"
    )


def installed_torchtitan() -> str | None:
    """The installed torchtitan's version (upstream's or AWS's fork), from package metadata."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _tree_for(settings: Settings) -> dict | None:
    schema = _schema()
    tree = schema["configs"].get(_base_config_name(settings)) if schema else None
    if tree is None:
        return None
    data = settings.data
    if data.kind in PACKED_KINDS:  # job.loader_configs.apply_data swaps these in before the YAML applies
        packed = schema["packed_dataloader"]
        tree = {**tree, "dataloader": packed}
        if data.val_files or data.val_fraction:
            tree["validator"] = {**tree["validator"], "dataloader": packed}
    return tree


def _base_config_name(settings: Settings) -> str:
    return f"{settings.model.module}:{settings.model.config_fn}"


def _check(tree: dict, values: Mapping[str, Any], path: str) -> None:
    if "_target_" in values:
        return  # another config class: the plan checks its keys
    for key, value in values.items():
        key_path = f"{path}.{key}" if path else key
        if key not in tree:
            raise ConfigError(unknown_key_message(key_path, key, tree))
        below = tree[key]
        if not isinstance(below, dict):
            check_type(value, hint_from_text(below), key_path)
        elif isinstance(value, Mapping):
            _check(below, value, key_path)


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    """Every key as a dotted path, a value's with its type (`training.steps (int)`)."""
    keys = set()
    for key, below in tree.items():
        if isinstance(below, dict):
            keys |= {prefix + key, *_dotted(below, f"{prefix}{key}.")}
        else:
            keys.add(f"{prefix}{key} ({below})")
    return keys


@cache
def _schema() -> dict[str, Any] | None:
    """The file's schema for the installed torchtitan; without one, said once per process."""
    installed = installed_torchtitan()
    schemas = json.loads(KEYS_FILE.read_text())
    if installed in schemas:
        return schemas[installed]
    print(
        f"[qwen3-neuron] note: {KEYS_FILE.name} has no keys of torchtitan {installed or '(none installed)'} (it has "
        f"{', '.join(sorted(schemas))}): a misspelled key of torchtitan's sections is found by the plan, in "
        "torchrun's local rank 0, instead of before torchrun starts (python -m qwen3_neuron.job.trainer_keys "
        "writes them)",
        file=sys.stderr,
    )
    return None


def _base_config_keys(name: str) -> dict[str, Any]:
    from qwen3_neuron.job.trainer_config import base_config  # imports torchtitan

    tree = key_tree(base_config(*name.split(":")))
    return {key: "Any" if key in FRAMEWORK_OWNED else keys for key, keys in tree.items()}  # the plan names them


def _packed_keys() -> dict[str, Any]:
    from qwen3_neuron.data.loader import PackedDataLoader  # imports torchtitan
    from qwen3_neuron.data.source import DataSource

    return key_tree(PackedDataLoader.Config(sources=[DataSource(files="rows.jsonl")]))


def trainer_keys() -> dict[str, Any]:
    """The installed torchtitan's schema, from its classes (imports torchtitan)."""
    return {"configs": {name: _base_config_keys(name) for name in BASE_CONFIGS}, "packed_dataloader": _packed_keys()}


if __name__ == "__main__":
    schemas = json.loads(KEYS_FILE.read_text())
    schemas[installed_torchtitan()] = trainer_keys()  # the other versions' stay
    KEYS_FILE.write_text(json.dumps(schemas, indent=1, sort_keys=True) + "\n")
    print(f"wrote torchtitan {installed_torchtitan()}'s keys into {KEYS_FILE}")
