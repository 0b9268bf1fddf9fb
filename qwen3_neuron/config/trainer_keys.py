"""torchtitan's `Trainer.Config` keys, known without importing torchtitan (seconds): the launcher
refuses a misspelled key of one of torchtitan's own sections (`training.stpes=3`) before torchrun
starts, with the message the plan's `fields.apply_fields` gives for it.

`trainer_keys.json` holds, for one torchtitan version, the tree of field names of the base config
of each config function `conf/model/` names, and of the packed data loader that data=text|chat|mix
puts in `dataloader` (and in `validator.dataloader` with a validation set). What it does not
know is left to the plan: another torchtitan version or config function, a node with `_target_`
(another class). Rewrite it from the real classes with `python -m qwen3_neuron.config.trainer_keys`;
tests/test_config.py holds it equal to them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from qwen3_neuron.config.fields import key_tree, unknown_key_message
from qwen3_neuron.config.settings import FRAMEWORK_OWNED, OPTIMIZER_SHORTHANDS, PACKED_KINDS, SECTIONS, Settings
from qwen3_neuron.errors import ConfigError

KEYS_FILE = Path(__file__).with_name("trainer_keys.json")

# The base configs the model groups name, as `<model.module>:<model.config_fn>`.
BASE_CONFIGS = ("qwen3:qwen3_32b", "transformers_modeling_backend:transformers_modeling_backend_full")


def check_trainer_keys(composed: Mapping[str, Any], settings: Settings) -> None:
    """Refuse a key torchtitan's sections do not have, as the plan would (ConfigError)."""
    tree = _tree_for(settings)
    if tree is None:
        return
    for section, values in composed.items():
        if section in SECTIONS or section in FRAMEWORK_OWNED:
            continue  # the framework's own sections; the plan names the owned fields' keys
        if section == "optimizer" and isinstance(values, Mapping):
            values = {k: v for k, v in values.items() if k not in OPTIMIZER_SHORTHANDS}
        _check(tree, {section: values}, "")


def _tree_for(settings: Settings) -> dict | None:
    known = _known()
    model = settings.model
    tree = known.get("configs", {}).get(f"{model.module}:{model.config_fn}")
    if tree is None:
        return None
    data = settings.data
    if data.kind in PACKED_KINDS:  # trainer_config.data.apply_data swaps these in before the YAML applies
        packed = known["packed_dataloader"]
        tree = {**tree, "dataloader": packed}
        if data.val_files or data.val_fraction:
            tree["validator"] = {**tree["validator"], "dataloader": packed}
    return tree


def _check(tree: dict, values: Mapping[str, Any], path: str) -> None:
    if "_target_" in values:
        return  # another config class: the plan checks its keys
    for key, value in values.items():
        key_path = f"{path}.{key}" if path else key
        if key not in tree:
            raise ConfigError(unknown_key_message(key_path, key, tree))
        if isinstance(value, Mapping) and tree[key] is not None:
            _check(tree[key], value, key_path)


@cache
def _known() -> dict[str, Any]:
    """The file's trees if they are the installed torchtitan's, else nothing."""
    try:
        installed = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        return {}
    known = json.loads(KEYS_FILE.read_text())
    return known if known["torchtitan"] == installed else {}


def trainer_keys() -> dict[str, Any]:
    """What `trainer_keys.json` holds, from torchtitan's classes (imports torchtitan)."""
    from qwen3_neuron.data.loader import PackedDataLoader
    from qwen3_neuron.data.source import DataSource
    from qwen3_neuron.trainer_config.build import base_config

    configs = {}
    for name in BASE_CONFIGS:
        tree = key_tree(base_config(*name.split(":")))
        configs[name] = {key: None if key in FRAMEWORK_OWNED else keys for key, keys in tree.items()}
    packed = PackedDataLoader.Config(sources=[DataSource(files="rows.jsonl")])
    return {"torchtitan": metadata.version("torchtitan"), "configs": configs, "packed_dataloader": key_tree(packed)}


if __name__ == "__main__":
    KEYS_FILE.write_text(json.dumps(trainer_keys(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {KEYS_FILE}")
