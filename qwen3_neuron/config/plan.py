"""Stage 2, plan: composed config -> validated torchtitan `Trainer.Config` + torchrun command.

No process is started and no device is touched here, so every config error surfaces before
torchrun. Workers call `build_trainer_config` on what the launcher recorded: same function, same
inputs, same config.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import operator
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.config.override import apply_overrides
from torchtitan.trainer import Trainer

from qwen3_neuron.config.fields import apply_fields, unknown_key_message
from qwen3_neuron.config.layout import check_layout
from qwen3_neuron.config.settings import SECTIONS, Settings, parse_settings
from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError, DeviceUnavailableError
from qwen3_neuron.config.torchrun import torchrun_args
from qwen3_neuron.models.flavors import moe_model_spec, native_model_spec
from qwen3_neuron.models.hf.model_dir import check_initial_hf_load
from qwen3_neuron.models.hf.spec import configure_hf_trainer, hf_model_spec

# Fields the framework owns: the model comes from the `model` group, outputs go to the run dir.
FRAMEWORK_OWNED = {"model_spec": "model.flavor", "dump_folder": "hydra.run.dir", "hf_model": "model.hf_model"}

# `optimizer.lr=3e-4` and friends: set on every param group (torchtitan 0.3.0 keeps them in
# `optimizer.param_groups[i].optimizer_kwargs`).
OPTIMIZER_SHORTHANDS = ("lr", "weight_decay", "betas", "eps")

# Counts torchtitan takes as given; zero or negative would fail late or loop forever.
MUST_BE_POSITIVE = ("training.steps", "training.local_batch_size", "training.seq_len", "metrics.log_freq")

# Metrics to metrics.jsonl: swapped in through torchtitan's own override registry.
METRICS_OVERRIDE = "qwen3_neuron.worker.metrics.run_dir_metrics"


@dataclass
class Plan:
    settings: Settings
    device: str
    nproc_per_node: int
    trainer_config: Trainer.Config
    command: list[str]
    env: dict[str, str]
    replacements: list[str]  # torchtitan's "[Override] target: fqn Old -> New" lines
    notes: list[str] = field(default_factory=list)  # what the plan settled or could not check

    def replacements_by_override(self) -> dict[str, list[str]]:
        """{override target: ["fqn Old -> New", ...]}, for the summary."""
        grouped: dict[str, list[str]] = {}
        for line in self.replacements:
            target, _, change = line.removeprefix("[Override] ").partition(": ")
            grouped.setdefault(target, []).append(change)
        return grouped

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.settings.run.nnodes

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.command)}".strip()


def make_plan(composed: Mapping[str, Any], run_dir: Path) -> Plan:
    """Validate everything and work out what to run; raises ConfigError on bad input."""
    settings = parse_settings(composed)
    dry_run = settings.run.dry_run
    device = _resolve_device(settings.device.type, dry_run)
    # a dry run may plan for a device that is not here: say so, and skip what only it can check
    missing = devices.unavailable_reason(device) if dry_run else None
    notes = [f"device={device} is not here ({missing}) - dry run: planned for it, not checked"] if missing else []
    nproc = settings.run.nproc_per_node
    nproc = devices.default_nproc(device) if nproc is None else nproc
    if nproc < 1:
        raise ConfigError(f"run.nproc_per_node must be >= 1, got {nproc}.")
    config = build_trainer_config(composed, run_dir, device)
    world_size = nproc * settings.run.nnodes
    _check_positive(config)
    check_layout(config, world_size, here=not missing)
    _check_local_paths(config)
    try:
        replacements = _check_overrides(config)
    except ConfigError as e:
        if not (missing and _needs_the_device(e)):
            raise
        # the kernels need the absent device to load: check everything else, say so
        notes.append(f"kernels.factories not applied in this dry run: {e}")
        replacements = _check_overrides(_without_kernel_factories(config, settings))
    command = [
        sys.executable, "-m", "torch.distributed.run", *torchrun_args(settings.run, nproc, run_dir),
        "-m", "qwen3_neuron.worker.train", str(run_dir),
    ]  # fmt: skip
    # user kernels importable from where launch.py runs are importable in the workers too
    env = {
        **devices.worker_env(device, nproc),
        **devices.compiler_env(device),
        "PYTHONPATH": _worker_pythonpath(),
    }
    return Plan(settings, device, nproc, config, command, env, replacements, notes)


def build_trainer_config(composed: Mapping[str, Any], run_dir: Path, device: str) -> Trainer.Config:
    """The final torchtitan config: base config function, flavour swap, YAML sections on top."""
    settings = parse_settings(composed)
    config = _base_config(settings.model.module, settings.model.config_fn)
    config.model_spec = _model_spec(settings)
    for section, values in composed.items():
        if section in SECTIONS:
            continue
        if section in FRAMEWORK_OWNED:
            raise ConfigError(f"'{section}' is set by the framework; set {FRAMEWORK_OWNED[section]} instead.")
        if section == "optimizer" and isinstance(values, Mapping):
            values = _apply_optimizer_shorthands(config, values)
        config = apply_fields(config, {section: values}, "")
    if settings.model.kind == "hf":
        configure_hf_trainer(config, settings.model)  # hf_model + hf_assets_path -> the model dir
    check_initial_hf_load(config, settings.model.kind)  # from_hf: safetensors present, arch matches
    _set_loss_vocab(config)
    backend = devices.compile_backend(device)
    if backend and "backend" not in (composed.get("compile") or {}):
        config.compile.backend = backend  # the device's own torch.compile backend (neuron)
    config.dump_folder = str(run_dir)
    config.override.imports = [
        *config.override.imports,
        METRICS_OVERRIDE,
        *devices.override_imports(device, settings.model.kind),
        *_kernel_overrides(settings, device),
    ]
    return config


def _worker_pythonpath() -> str:
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([os.getcwd(), inherited] if inherited else [os.getcwd()])


def _resolve_device(requested: str, dry_run: bool = False) -> str:
    try:
        return devices.resolve_device(requested, dry_run=dry_run)
    except DeviceUnavailableError as e:
        raise ConfigError(f"device.type={requested}: {e}") from e


def _base_config(module: str, config_fn: str) -> Trainer.Config:
    registry_name = _registry_name(module)
    try:
        registry = importlib.import_module(registry_name)
    except ModuleNotFoundError as e:
        # torchtitan's own loader hides this cause (e.g. a missing `triton`): say it.
        raise ConfigError(f"model.module={module}: cannot import {registry_name}: {e}") from e
    functions = sorted(
        name for name, fn in inspect.getmembers(registry, inspect.isfunction)
        if fn.__module__ == registry.__name__ and not name.startswith("_")
    )  # fmt: skip
    if config_fn not in functions:
        raise ConfigError(unknown_key_message(f"model.config_fn={config_fn}", config_fn, functions))
    return getattr(registry, config_fn)()


def _registry_name(module: str) -> str:
    """As torchtitan's --module: a short name is looked up in torchtitan.models, then
    torchtitan.experiments (transformers_modeling_backend lives there); a dotted name is used as is."""
    if "." in module:
        return module
    for package in ("torchtitan.models", "torchtitan.experiments"):
        if importlib.util.find_spec(f"{package}.{module}") is not None:
            return f"{package}.{module}.config_registry"
    return f"torchtitan.models.{module}.config_registry"


def _model_spec(settings: Settings):
    model = settings.model
    moe_changes = {"num_experts": model.num_experts, "top_k": model.top_k, "moe_hidden_dim": model.moe_hidden_dim}
    if model.kind == "moe":
        return moe_model_spec(model.flavor, **moe_changes)
    stray = [key for key, value in moe_changes.items() if value is not None]
    if stray:
        raise ConfigError(f"model.{stray[0]} applies to model=moe only (this is model={model.kind}).")
    if model.kind == "native":
        return native_model_spec(model.flavor)
    return hf_model_spec(model)


def _apply_optimizer_shorthands(config: Trainer.Config, values: Mapping[str, Any]) -> dict:
    values = dict(values)
    for key in OPTIMIZER_SHORTHANDS:
        if key in values:
            value = values.pop(key)
            for group in config.optimizer.param_groups:
                group.optimizer_kwargs[key] = tuple(value) if key == "betas" else value
    return values


def _set_loss_vocab(config: Trainer.Config) -> None:
    """The base function sized the loss for its own model; follow the swapped-in flavour."""
    vocab_size = config.model_spec.model.vocab_size
    for _, loss_config, _, _ in config.loss.traverse(CrossEntropyLoss.Config):
        loss_config.global_vocab_size = vocab_size


def _kernel_overrides(settings: Settings, device: str) -> list[str]:
    kernels = settings.kernels
    if device not in kernels.devices:
        raise ConfigError(
            f"kernels={kernels.name} needs device {' or '.join(kernels.devices)}, "
            f"but the device is {device}. Use kernels=none or kernels=blockwise here."
        )
    kernel_kwargs = {"block_size": kernels.block_size}
    return [*((factory, kernel_kwargs) for factory in kernels.factories), *kernels.overrides]


def _check_overrides(config: Trainer.Config) -> list[str]:
    """Apply the override imports to a copy of the config, as the trainer will: a target that
    does not import, names no @override or replaces nothing fails here, named."""
    trial = copy.deepcopy(config)
    try:
        replacements = apply_overrides(trial.override, trial)
    except (ImportError, ValueError, TypeError) as e:
        hint = (
            " A kernels.overrides entry replacing the same nodes as the kernels option's own "
            "factories needs kernels=none (or narrower fqns in its @override)."
            if "both claim node" in str(e) else ""
        )  # fmt: skip
        raise ConfigError(f"override.imports: {e}{hint}") from e
    for entry in config.override.imports:
        target = entry if isinstance(entry, str) else entry[0]
        if not any(line.startswith(f"[Override] {target}:") for line in replacements):
            raise ConfigError(
                f"override '{target}' matches no node of this model ({config.model_spec.flavor}): "
                "check its @override target class and fqns."
            )
    return replacements


def _check_positive(config: Trainer.Config) -> None:
    for key in MUST_BE_POSITIVE:
        value = operator.attrgetter(key)(config)
        if value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value}.")
    for index, group in enumerate(config.optimizer.param_groups):
        lr = group.optimizer_kwargs.get("lr")
        if lr is not None and not lr > 0:
            raise ConfigError(f"optimizer.lr (param group {index}, {group.pattern!r}) must be > 0, got {lr}.")


def _needs_the_device(error: ConfigError) -> bool:
    """An override that imports but refuses to load without its device (kernels=nki without
    torch-neuronx raises an ImportError that is not a missing module)."""
    cause = error.__cause__
    return isinstance(cause, ImportError) and not isinstance(cause, ModuleNotFoundError)


def _without_kernel_factories(config: Trainer.Config, settings: Settings) -> Trainer.Config:
    trial = copy.deepcopy(config)
    trial.override.imports = [
        entry for entry in trial.override.imports
        if (entry if isinstance(entry, str) else entry[0]) not in settings.kernels.factories
    ]  # fmt: skip
    return trial


def _check_local_paths(config: Trainer.Config) -> None:
    """Assets the run reads must exist before any worker starts."""
    wanted = {"hf_assets_path": config.hf_assets_path}
    dataset_path = getattr(config.dataloader, "dataset_path", None)
    if dataset_path:
        wanted["dataloader.dataset_path"] = dataset_path
    for key, path in wanted.items():
        if _looks_local(path) and not Path(path).exists():
            raise ConfigError(
                f"{key}={path} does not exist. The project's tiny assets are made by "
                f"`python -m qwen3_neuron.assets` (make assets)."
            )


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or Path(path).exists()
