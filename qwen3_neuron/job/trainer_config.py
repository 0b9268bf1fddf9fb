"""Build the torchtitan `Trainer.Config` of a job (`job.job.Job`). Both sides use it.

The plan (`job.plan`: in local rank 0, or the launcher) builds with it and then checks the
result, and local rank 0 trains with that config; the other workers (`worker.train`) build with
it from the run dir's `job.yaml` and check nothing again. So nothing here looks anything up or
reads more than it needs to build: the model=hf dir is read once (`HFModelDir`), from the local
path the plan resolved and recorded.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Mapping

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.trainer import Trainer

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.devices.torch_capabilities import spmd_backend_for_this_torch
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.fields import apply_fields, check_type, unknown_key_message
from qwen3_neuron.finetune.checkpoint import lora_checkpoint_config
from qwen3_neuron.finetune.lora import with_lora
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.loader_configs import apply_data
from qwen3_neuron.job.settings import FRAMEWORK_OWNED, OPTIMIZER_SHORTHANDS, SECTIONS, Settings
from qwen3_neuron.models.flavors import moe_model_spec, native_model_spec
from qwen3_neuron.models.hf.model_dir import HFModelDir
from qwen3_neuron.models.hf.spec import configure_hf_trainer, hf_model_spec, with_block_causal_mask
from qwen3_neuron.models.score_head import with_score_head
from qwen3_neuron.trainers import SCORES_SEQUENCES_ALONE

# Metrics to metrics.jsonl: swapped in through torchtitan's own override registry.
METRICS_OVERRIDE = "qwen3_neuron.worker.metrics.run_dir_metrics"


def build_trainer_config(job: Job, run_dir: Path) -> Trainer.Config:
    """The final torchtitan config of a settled job (`Job.settled`): base config function,
    flavour swap, YAML sections on top."""
    settings, model_dir, device, composed = job.settings, job.model_dir, job.device, job.composed
    config = base_config(settings.model.module, settings.model.config_fn)
    config.model_spec = _model_spec(settings, model_dir)
    # a packed data kind: before the YAML sections refine it; the prompts with GRPO's tools' schemas
    apply_data(config, settings.data, run_dir, settings.trainer.name, _tool_schemas(settings))
    for section, values in composed.items():
        if section in SECTIONS:
            continue
        if section in FRAMEWORK_OWNED:
            raise ConfigError(f"'{section}' is set by the framework; set {FRAMEWORK_OWNED[section]} instead.")
        if section == "optimizer" and isinstance(values, Mapping):
            values = _apply_optimizer_shorthands(config, values)
        config = apply_fields(config, {section: values}, "")
    if settings.model.kind == "hf":
        configure_hf_trainer(config, model_dir)  # hf_model + hf_assets_path -> the model dir
    _chunk_the_loss(config)
    _set_loss_vocab(config)
    _only_periodic_saves_periodically(config, composed.get("checkpoint") or {})
    if settings.finetune.method == "lora":
        config.checkpoint = lora_checkpoint_config(config.checkpoint)  # adapter-only checkpoints
    backend = devices.compile_backend(device)
    if backend and "backend" not in (composed.get("compile") or {}):
        config.compile.backend = backend  # the device's own torch.compile backend (neuron)
    param_dtype = devices.mixed_precision_param(device)
    if param_dtype and "mixed_precision_param" not in (composed.get("training") or {}):
        config.training.mixed_precision_param = param_dtype  # float32 on a CPU that emulates bf16
    if "spmd_backend" not in (composed.get("parallelism") or {}) and devices.unavailable_reason(device) is None:
        # TP/CP/EP where torchtitan's default cannot run them (torch < 2.14; EP on CPU): the workaround
        spmd = spmd_backend_for_this_torch(config.parallelism, settings.model.kind, device)
        config.parallelism.spmd_backend = spmd or config.parallelism.spmd_backend
    config.dump_folder = str(run_dir)
    config.override.imports = [
        *config.override.imports,
        METRICS_OVERRIDE,
        *devices.override_imports(device, settings.model.kind),
        *kernel_overrides(settings),
    ]
    return config


def _tool_schemas(settings: Settings) -> list[dict] | None:
    """data=prompts with grpo.tools or grpo.environment: their schemas (a ConfigError names a tool
    that cannot be loaded or described)."""
    if settings.data.kind != "prompts":
        return None
    from qwen3_neuron.generation.tools import load_tools

    grpo = settings.grpo
    tools = load_tools(grpo.tools, grpo.environment, grpo.tool_timeout_s)
    return tools.schemas if tools is not None else None


def _only_periodic_saves_periodically(config: Trainer.Config, composed_checkpoint: Mapping) -> None:
    """A run that names no `checkpoint.interval` (checkpointing=export_hf or from_hf without
    periodic) saves no `step-N` on the way: torchtitan would save one every interval steps of the
    base config function. Its interval is then past its last step, where its own save (the HF
    export's) stays."""
    if config.checkpoint.enable and "interval" not in composed_checkpoint:
        config.checkpoint.interval = config.training.steps + 1


def kernel_overrides(settings: Settings) -> list:
    """The kernels option's factories (with their block size) and the user's own overrides."""
    kernels = settings.kernels
    kernel_kwargs = {"block_size": kernels.block_size}
    return [*((factory, kernel_kwargs) for factory in kernels.factories), *kernels.overrides]


def base_config(module: str, config_fn: str) -> Trainer.Config:
    registry_name = _registry_name(module)
    try:
        registry = importlib.import_module(registry_name)
    except ImportError as e:
        # torchtitan's own loader hides this cause (e.g. a missing `triton`, or a name another
        # torchtitan lacks): say it.
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


def _model_spec(settings: Settings, model_dir: HFModelDir | None):
    spec = _base_model_spec(settings, model_dir)
    if settings.trainer.name in SCORES_SEQUENCES_ALONE:
        spec = with_block_causal_mask(spec)  # the converters below copy the config with its mask
    if settings.finetune.method == "lora":
        spec = with_lora(spec, settings.finetune)
    if settings.trainer.name == "reward_model":
        spec = with_score_head(spec)  # after LoRA: the head trains whole beside the adapters
    return spec


def _base_model_spec(settings: Settings, model_dir: HFModelDir | None):
    model = settings.model
    if model.kind == "moe":
        return moe_model_spec(
            model.flavor, num_experts=model.num_experts, top_k=model.top_k, moe_hidden_dim=model.moe_hidden_dim
        )
    if model.kind == "native":
        return native_model_spec(model.flavor)
    return hf_model_spec(model_dir, model.flavor)


def _apply_optimizer_shorthands(config: Trainer.Config, values: Mapping[str, Any]) -> dict:
    values = dict(values)
    for key, hint in OPTIMIZER_SHORTHANDS.items():
        if key in values:
            value = check_type(values.pop(key), hint, f"optimizer.{key}")
            for group in config.optimizer.param_groups:
                group.optimizer_kwargs[key] = value
    return values


def _chunk_the_loss(config: Trainer.Config) -> None:
    """The loss through lm_head a sequence chunk at a time, as torchtitan's Qwen3 configs have it
    (its Transformers-backend configs take the full [batch, seq, vocab] float32 logits)."""
    if type(config.loss) is CrossEntropyLoss.Config:
        config.loss = ChunkedLossWrapper.Config(loss_fn=config.loss)


def _set_loss_vocab(config: Trainer.Config) -> None:
    """The base function sized the loss for its own model; follow the swapped-in flavour."""
    vocab_size = config.model_spec.model.vocab_size
    for _, loss_config, _, _ in config.loss.traverse(CrossEntropyLoss.Config):
        loss_config.global_vocab_size = vocab_size
