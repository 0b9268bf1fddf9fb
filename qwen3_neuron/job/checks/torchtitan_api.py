"""The torchtitan APIs the project uses, checked before the plan imports them.

The installed `torchtitan` may be upstream 0.3.0 or AWS's torchtitan-neuron fork (0.2.2+neuron.N,
installed as the `torchtitan` package itself: `scripts/setup_neuron.py`). Their version strings
say little about what each has, so the plan asks for the APIs themselves: each entry below is one
API, the module and names the project imports from it, and what the project needs it for. A
torchtitan lacking one stops the plan with a ConfigError naming it, instead of an ImportError from
deep inside the plan's imports. The config registry a run takes its base config from
(`model.module`'s `config_registry`, `model.config_fn`) is the user's choice: the plan's
`job.trainer_config.base_config` names it when it does not import or lacks the function.

This module imports no torchtitan at its own import: `check_torchtitan_api` runs before
`job.plan` (which imports torchtitan.trainer) is imported, in the launcher's dry run and in
the workers' local rank 0.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass

from qwen3_neuron.errors import ConfigError

_HF_BACKEND = "torchtitan.experiments.transformers_modeling_backend"


@dataclass(frozen=True)
class TorchtitanApi:
    name: str  # what the error calls it
    module: str
    names: tuple[str, ...]  # dotted from the module; a dataclass's field counts as a name
    needed_for: str
    model_kinds: tuple[str, ...] = ("native", "moe", "hf")  # the runs that import it


APIS = (
    TorchtitanApi(
        "Trainer.Config", "torchtitan.trainer",
        ("Trainer.Config", "Trainer.Config.model_spec", "Trainer.Config.override", "Trainer.Config.validator"),
        "every run: the config the YAML's torchtitan sections fill, field by field",
    ),
    TorchtitanApi(
        "the Config classes", "torchtitan.config.configurable", ("Configurable", "Configurable.Config"),
        "every run: each section of Trainer.Config is a component's Config",
    ),
    TorchtitanApi(
        "the ModelSpec swap", "torchtitan.protocols.model_spec", ("ModelSpec",),
        "every run: model.flavor's model spec replaces the base config's",
    ),
    TorchtitanApi(
        "Qwen3's model registry", "torchtitan.models.qwen3",
        ("model_registry", "qwen3_configs", "_build_qwen3_layers", "_build_qwen3_moe_layers", "_qwen3_norm"),
        "every run: model.flavor's Qwen3 specs (native, MoE and the project's own flavours)",
    ),
    TorchtitanApi(
        "the override registry", "torchtitan.config.override",
        ("override", "derive", "apply_overrides", "parse_cli_imports"),
        "every run: the device's attention swap, the metrics hook and kernels=... (override.imports)",
    ),
    TorchtitanApi(
        "the LoRA converter", "torchtitan.components.lora", ("LoRAConverter", "LoRAConverter.Config"),
        "finetune=lora (its module is imported by every run's build)",
    ),
    TorchtitanApi(
        "the validator", "torchtitan.components.validate", ("Validator", "Validator.Config"),
        "validation (data.val_files, data.val_fraction): the validator section",
    ),
    TorchtitanApi(
        "the HF backend", _HF_BACKEND,
        ("TitanModelConfig", "TitanMoeModelConfig", "model.HFTransformerModel",
         "parallelize.parallelize_hf_transformers", "pipeline.pipeline_hf_transformers",
         "state_dict_adapter.HFTransformerStateDictAdapter"),
        "model=hf: Transformers as torchtitan's modeling backend", model_kinds=("hf",),
    ),
)  # fmt: skip


def check_torchtitan_api(model_kind: str, apis: tuple[TorchtitanApi, ...] = APIS) -> None:
    """Raise ConfigError naming every API a run of `model_kind` uses that torchtitan lacks."""
    lacking = [f"{api.name} ({problem}; needed for {api.needed_for})"
               for api in apis if model_kind in api.model_kinds
               for problem in [_problem(api)] if problem]  # fmt: skip
    if lacking:
        raise ConfigError(
            f"the installed torchtitan ({_installed()}) lacks what this project uses: {'; '.join(lacking)}. "
            "The project is written against upstream torchtitan 0.3.0 (pip install torchtitan==0.3.0); "
            "AWS's torchtitan-neuron works where it has these APIs."
        )


def _problem(api: TorchtitanApi) -> str | None:
    """What is missing of `api`, or None."""
    try:
        module = importlib.import_module(api.module)
    except ImportError as e:
        return f"{api.module} does not import: {e}"
    problems, missing = [], []
    for name in api.names:
        if any(name.startswith(f"{gone}.") for gone in missing):
            continue  # "no X" says "no X.Config" too
        problem = _lookup(module, api.module, name)
        if problem:
            problems.append(problem)
            missing.append(name)
    return ", ".join(problems) or None


def _lookup(module, module_name: str, dotted: str) -> str | None:
    """None if `module_name.dotted` is there (a submodule is imported); else what is missing."""
    obj, path = module, module_name
    for part in dotted.split("."):
        if dataclasses.is_dataclass(obj) and isinstance(obj, type) and part in _field_names(obj):
            return None  # a field (a slots dataclass has no class attribute for a default_factory field)
        path = f"{path}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if not hasattr(obj, "__path__") or importlib.util.find_spec(path) is None:  # not a package's submodule
            return f"no {module_name}.{dotted}"
        try:
            obj = importlib.import_module(path)
        except ImportError as e:
            return f"{path} does not import: {e}"
    return None


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _installed() -> str:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return "no torchtitan distribution found"
