"""Stage 4, plan: a settled job -> validated torchtitan `Trainer.Config`.

No process is started and no device is touched here, so every config error surfaces before
anything is built. The job comes settled and recorded by the launcher (`Job.settled`,
`job.record.record_job`); the plan runs in local rank 0 of the workers the launcher started
(`worker.rank0_plan`: that process imports torchtitan anyway), or in the launcher for a dry run and
`run.show_data`. It builds the config (`job.trainer_config`: local rank 0 then trains with it,
the other workers build it from job.yaml) and checks it once: on a copy, it does what
torchtitan's `Trainer.__init__` does to the config before building anything (`ParallelDims`, the
model's `update_from_config`, `apply_overrides`, `_validate_cuda_graphs`) and turns their errors
into `ConfigError`s with what would fit; then the checks torchtitan lacks (`layout`, HF dirs,
assets, torch capabilities, what the worker's `train.main` would assert, the static shapes
Neuron's compile needs: `static_shapes`).
"""

from __future__ import annotations

import copy
import operator
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torchtitan.config.override import apply_overrides
from torchtitan.trainer import Trainer

from qwen3_neuron.data.data_checks import check_data
from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError, UnsupportedModel
from qwen3_neuron.finetune.lora import uncovered_note
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.settings import Settings
from qwen3_neuron.job.trainer_keys import schema_disagreement
from qwen3_neuron.models.hf.model_dir import (
    check_initial_hf_load,
    check_tokenizer_fits,
    native_architecture,
    open_model_dir,
)
from qwen3_neuron.job.checks import layout
from qwen3_neuron.job.checks.memory import GrpoMemory, MemoryEstimate, check_fit, estimate_memory, meta_model
from qwen3_neuron.job.checks.static_shapes import check_static_shapes
from qwen3_neuron.job.trainer_config import build_trainer_config
from qwen3_neuron.trainers import KEEPS_REFERENCE

# Counts torchtitan takes as given; zero or negative would fail late or loop forever.
MUST_BE_POSITIVE = ("training.steps", "training.local_batch_size", "training.seq_len", "metrics.log_freq")

@dataclass
class Plan:
    job: Job  # settled: the device, model dir and NEFF cache as the workers take them (job.yaml)
    nproc_per_node: int  # ranks on each node
    trainer_config: Trainer.Config  # local rank 0 trains with it
    replacements: list[str]  # torchtitan's "[Override] target: fqn Old -> New" lines
    notes: list[str] = field(default_factory=list)  # what the plan settled or could not check
    memory: MemoryEstimate | None = None  # tensor memory per rank against the device's
    parameters: dict[str, int] = field(default_factory=dict)  # trainable_parameters, total_parameters
    static_shapes: str | None = None  # device=neuron + compile: what the static-shape check covered
    refusal: str | None = None  # a dry run's plan that a launch would refuse: why (it does not fit)

    @property
    def settings(self) -> Settings:
        return self.job.settings

    @property
    def device(self) -> str:
        return self.job.device

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.settings.run.nnodes


def make_plan(
    job: Job,
    run_dir: Path,
    nproc_per_node: int,
    warn: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
) -> Plan:
    """Validate everything torchtitan's side of the `job` (settled: `Job.settled`) can get wrong,
    with `nproc_per_node` ranks on each node; raises ConfigError on bad input. `warn`: where the
    plan's warnings go (standard error; local rank 0 hands them to the launcher)."""
    settings, device, nproc = job.settings, job.device, nproc_per_node
    # a dry run may plan for a device that is not here: say so, and skip what only it can check
    missing = devices.unavailable_reason(device) if settings.run.dry_run else None
    notes = [f"device={device} is not here ({missing}) - dry run: planned for it, not checked"] if missing else []
    model = settings.model
    model_dir = open_model_dir(model.hf_model, model.trust_remote_code, job.model_dir) if model.kind == "hf" else None
    config = build_trainer_config(job, run_dir)
    stale_keys = schema_disagreement(settings)  # the launcher's key check, against the installed classes
    if stale_keys:
        warn(f"[qwen3-neuron] note: {stale_keys}")
        notes.append(stale_keys)
    world_size = nproc * settings.run.nnodes
    _check_positive(config)
    _check_worker_modes(config, world_size)
    if settings.data.kind == "preference":
        _check_preference(config, settings, world_size)
    rewards = _check_grpo(config, settings, world_size) if settings.data.kind == "prompts" else None
    replacements, unapplied = _check_like_the_trainer(config, world_size, settings, device, model_dir, missing, notes)
    static_shapes = None
    if device == "neuron" and config.compile.enable:  # before torchrun: nothing recompiles or fails there
        static_shapes = check_static_shapes(
            config, world_size, replacements=replacements, unapplied_factories=unapplied, model_dir=model_dir
        )
    if model_dir is not None:
        check_tokenizer_fits(config.hf_assets_path, model_dir.vocab_size)
    check_initial_hf_load(config, model.kind)  # from_hf: safetensors present, arch matches
    _check_export(config, settings)
    _check_local_paths(config)
    completion_tokens = settings.grpo.max_completion_length if settings.data.kind == "prompts" else 0
    # first rows only: fields, conversations, chat template, validation set, the columns the rewards read
    check_data(config, world_size, completion_tokens, warn, rewards, _samples_taken(config, settings, world_size))
    model_on_meta = meta_model(config)  # built once for the LoRA note, the counts and the estimate
    if settings.finetune.method == "lora":
        notes.extend(_check_lora(config, settings, world_size, warn, model_on_meta))
    parameters = parameter_counts(model_on_meta)
    # DPO's and KTO's reference, and GRPO's KL reference with beta > 0: finetune=full keeps the starting
    # weights; ORPO and SimPO hold none
    trainer = settings.trainer.name
    reference = trainer in KEEPS_REFERENCE or (trainer == "grpo" and settings.grpo.beta > 0)
    frozen_reference = reference and settings.finetune.method == "full"
    logprobs = settings.data.kind in ("preference", "prompts")  # the preference trainers' and GRPO's loss
    grpo = None
    if settings.data.kind == "prompts":
        kept = int(settings.grpo.num_iterations > 1) + int(settings.grpo.beta > 0)
        completions = config.training.local_batch_size * _accumulation_steps(config, world_size)
        grpo = GrpoMemory(static_cache=config.compile.enable, completions=completions, kept_logprobs=kept,
                          reward_models=reward_model_bytes(rewards))  # fmt: skip
    memory = estimate_memory(config, world_size, device, nproc, model_on_meta, frozen_reference, logprobs,
                             model_dir, grpo)
    refusal = None
    try:
        check_fit(memory, config, settings.run.memory_check, warn=warn)
    except ConfigError as e:
        if not settings.run.dry_run:
            raise
        refusal = str(e)  # a dry run shows the plan for another machine first, then this verdict
    if device != "neuron" and settings.device.cache_dir is not None:
        notes.append(f"device.cache_dir={settings.device.cache_dir} is TorchNeuron's NEFF cache: unused on device={device}")
    return Plan(job, nproc, config, replacements, notes, memory, parameters, static_shapes, refusal)


def parameter_counts(model_on_meta) -> dict[str, int]:
    """Parameters of the model as built (`meta_model`): those the optimizer gets, and all.
    finetune=lora: the adapters, and the frozen base plus the adapters."""
    parameters = list(model_on_meta.parameters())  # a tied weight counted once
    return {
        "trainable_parameters": sum(p.numel() for p in parameters if p.requires_grad),
        "total_parameters": sum(p.numel() for p in parameters),
    }


def _check_export(config: Trainer.Config, settings: Settings) -> None:
    """checkpointing=export_hf of a native model: its config.json must be writable, or the run
    would train and then fail to export."""
    checkpoint = config.checkpoint
    if settings.model.kind == "hf" or not (checkpoint.enable and checkpoint.last_save_in_hf):
        return
    if settings.finetune.method == "lora" and not settings.finetune.merge_export:
        return  # the adapter dir alone: PEFT's adapter_config.json names the base
    try:
        native_architecture(config.model_spec.model)
    except UnsupportedModel as e:
        lora = " (finetune=lora: finetune.merge_export=false exports the adapters alone)"
        raise ConfigError(
            f"checkpointing=export_hf cannot export model.flavor={config.model_spec.flavor}: {e}. "
            f"Train without the export (e.g. checkpointing=periodic keeps torchtitan's checkpoints)"
            f"{lora if settings.finetune.method == 'lora' else ''}."
        ) from e


def _check_lora(
    config: Trainer.Config, settings: Settings, world_size: int, warn: Callable[[str], None], model_on_meta
) -> list[str]:
    """finetune=lora: refuse what the adapters cannot do; the notes say what they do not cover."""
    if layout.resolve_degrees(config.parallelism, world_size).pp > 1:
        raise ConfigError(
            "finetune=lora with pipeline parallelism is not supported: the adapters are gathered "
            "for the export from every rank's model part. Use parallelism=fsdp (or tp)."
        )
    _check_lora_base(config, settings.model.kind)
    built = model_on_meta if settings.model.kind == "hf" else None  # HF's Linear layers: built, not configured
    note = uncovered_note(settings.finetune, config.model_spec.model, built)
    if not note:
        return []
    warn(f"[qwen3-neuron] note: {note}")
    return [note]


def _check_lora_base(config: Trainer.Config, kind: str) -> None:
    """finetune=lora freezes the base: refuse a run where it would stay a random init. Adapters
    trained on random weights fit no published model (the PEFT export names its base) and are
    never what a fine-tuning means, so this fails rather than warns. The base comes from HF
    safetensors: a torchtitan checkpoint of a full model holds no adapter keys, and torchtitan's
    model-only load asks for every key of the LoRA model."""
    checkpoint = config.checkpoint
    if checkpoint.enable and checkpoint.initial_load_in_hf:
        return
    where = "model.hf_model's weights" if kind == "hf" else "with checkpoint.initial_load_path=/abs/hf_dir"
    raise ConfigError(
        "finetune=lora freezes the base model, but nothing loads it: it would stay a random init. "
        f"Add checkpointing=from_hf ({where}; e.g. checkpointing=[from_hf,export_hf]). A torchtitan "
        "checkpoint of a full model cannot be the base (it holds no adapter keys): export it with "
        "checkpointing=export_hf and load that dir."
    )


def starting_weights(config: Trainer.Config) -> str:
    """Where the first step's weights come from, in words (the dry run's `weights:` line)."""
    checkpoint = config.checkpoint
    if not _loads_starting_weights(checkpoint):
        seed = config.debug.seed
        return (f"a random init ({'seed ' + str(seed) if seed is not None else 'unseeded'}): nothing loads "
                "weights; checkpointing=from_hf starts from a model dir's safetensors")  # fmt: skip
    source = checkpoint.initial_load_path or config.hf_assets_path
    kind = "HF safetensors" if checkpoint.initial_load_in_hf else "a torchtitan checkpoint"
    key = "checkpoint.initial_load_path" if checkpoint.initial_load_path else "model.hf_model"
    return f"{source} ({kind}, {key}); a checkpoint of this run dir, when there is one, comes first"


def _loads_starting_weights(checkpoint) -> bool:
    """DPO and GRPO start from a model that already answers: the run must load one."""
    return bool(checkpoint.enable and (checkpoint.initial_load_in_hf or checkpoint.initial_load_path))


def _check_preference(config: Trainer.Config, settings: Settings, world_size: int) -> None:
    """data=preference: the preference trainers tune a model that already answers (DPO and KTO
    against that model as it started; a reward model may start from any weights)."""
    if settings.trainer.name != "reward_model" and not _loads_starting_weights(config.checkpoint):
        trainer = settings.trainer.name
        tunes = ("tunes a model against itself as it starts (the DPO reference)" if trainer in KEEPS_REFERENCE
                 else f"with trainer={trainer} tunes a model that already answers")  # fmt: skip
        raise ConfigError(
            f"data=preference {tunes}, but nothing loads weights: it would start from a random init. Add "
            "checkpointing=from_hf (e.g. checkpointing=[from_hf,export_hf]) or checkpoint.initial_load_path=<dir>."
        )
    degrees = layout.resolve_degrees(config.parallelism, world_size)
    split = {"pipeline": degrees.pp, "tensor": degrees.tp, "context": degrees.cp}
    for name, degree in split.items():
        if degree > 1:
            raise ConfigError(
                f"data=preference with {name} parallelism (degree {degree}) is not supported: a pair's "
                "log-probabilities (trainer=reward_model: its scores) are read over whole sequences on one "
                "rank. Use parallelism=fsdp."
            )


def _check_grpo(config: Trainer.Config, settings: Settings, world_size: int):
    """data=prompts: GRPO samples from a model that already writes, in whole groups per rank.
    Returns the reward functions (their columns are checked against the first rows)."""
    from qwen3_neuron.generation.tools import load_tools
    from qwen3_neuron.rewards.sequence_classifier import RewardModel, check_reward_model
    from qwen3_neuron.trainers.grpo import rewards_of

    grpo = settings.grpo
    tools = load_tools(grpo.tools, grpo.environment, grpo.tool_timeout_s)
    rewards = rewards_of(grpo, tools)  # importable, callable, one weight each (an environment's own too)
    _check_tool_settings(grpo, tools, rewards)
    for function in rewards.functions:
        if isinstance(function, RewardModel):  # a reward model dir: read with the policy's tokenizer
            check_reward_model(function, config.hf_assets_path)
    if not _loads_starting_weights(config.checkpoint):
        raise ConfigError(
            "data=prompts samples completions from the model and rewards the better ones, but nothing loads "
            "weights: a random init writes nothing a reward can tell apart. Add checkpointing=from_hf (e.g. "
            "checkpointing=[from_hf,export_hf]) or checkpoint.initial_load_path=<dir>."
        )
    degrees = layout.resolve_degrees(config.parallelism, world_size)
    for name, degree in {"pipeline": degrees.pp, "tensor": degrees.tp, "context": degrees.cp}.items():
        if degree > 1:
            raise ConfigError(f"data=prompts with {name} parallelism (degree {degree}) is not built: generation "
                              "runs the whole model on each rank's prompts. Use parallelism=fsdp.")  # fmt: skip
    completions = config.training.local_batch_size * _accumulation_steps(config, world_size)
    if completions % grpo.num_generations:
        raise ConfigError(
            f"data=prompts: a rank's batch of {completions} completions a step (training.local_batch_size x "
            f"gradient accumulation) does not divide into whole groups of grpo.num_generations="
            f"{grpo.num_generations}: make it a multiple (e.g. training.local_batch_size={grpo.num_generations})."
        )
    return rewards


def _check_tool_settings(grpo, tools, rewards) -> None:
    """grpo.tools / grpo.environment: a finite number of rounds of calls, and rewards that take
    the environments TRL hands them (and none that waits for environments there are not)."""
    import inspect

    if tools is not None and grpo.max_tool_calling_iterations < 1:
        raise ConfigError(f"grpo.max_tool_calling_iterations={grpo.max_tool_calling_iterations}: the rounds of "
                          "tool calls a completion may make, at least 1 with grpo.tools or grpo.environment "
                          "(e.g. 4).")  # fmt: skip
    environment = tools is not None and tools.environment is not None
    for index, (name, function) in enumerate(zip(rewards.names, rewards.functions)):
        parameters = inspect.signature(function).parameters
        takes = "environments" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        needs = "environments" in parameters and parameters["environments"].default is inspect.Parameter.empty
        if environment and not takes:
            raise ConfigError(f"grpo.rewards[{index}]: {name} takes neither `environments` nor **kwargs, and with "
                              "grpo.environment every reward is handed each rollout's environment as TRL hands it: "
                              "add **kwargs to its parameters.")  # fmt: skip
        if needs and not environment:
            raise ConfigError(f"grpo.rewards[{index}]: {name} reads `environments`, which only a run with "
                              "grpo.environment=module.Class has: set it, or choose another reward.")  # fmt: skip


def reward_model_bytes(rewards) -> int:
    """The weights of the reward models among the rewards: every rank holds them all run."""
    from qwen3_neuron.rewards.sequence_classifier import RewardModel

    return sum(f.parameter_bytes() for f in rewards.functions if isinstance(f, RewardModel))


def _samples_taken(config: Trainer.Config, settings, world_size: int) -> int:
    """The samples the run's steps take from the data, all ranks together (data=prompts: the
    prompts, each sampled grpo.num_generations times)."""
    training = config.training
    degrees = layout.resolve_degrees(config.parallelism, world_size)
    samples = training.steps * training.local_batch_size * _accumulation_steps(config, world_size)
    samples *= degrees.dp_replicate * degrees.dp_shard
    return samples // settings.grpo.num_generations if settings.data.kind == "prompts" else samples


def _accumulation_steps(config: Trainer.Config, world_size: int) -> int:
    """torchtitan's: global_batch_size / (local_batch_size x data-parallel degree), 1 when unset."""
    training = config.training
    if training.global_batch_size <= 0:
        return 1
    degrees = layout.resolve_degrees(config.parallelism, world_size)
    dp = degrees.dp_replicate * degrees.dp_shard
    return max(training.global_batch_size // (training.local_batch_size * dp), 1)


def _check_worker_modes(config: Trainer.Config, world_size: int) -> None:
    """What torchtitan's `train.main` (mirrored by the worker) asserts only once the workers run."""
    checkpoint = config.checkpoint
    if checkpoint.create_seed_checkpoint:
        if world_size != 1:
            raise ConfigError(
                f"checkpoint.create_seed_checkpoint=true needs world size 1 (torchtitan writes the "
                f"seed checkpoint unsharded, from one process); this plan has world size {world_size}. "
                "Set run.nproc_per_node=1 (and run.nnodes=1)."
            )
        if not checkpoint.enable:
            raise ConfigError(
                "checkpoint.create_seed_checkpoint=true needs checkpoint.enable=true "
                "(e.g. checkpointing=periodic): the seed checkpoint is a checkpoint save."
            )


def _check_like_the_trainer(config, world_size, settings, device, model_dir, missing, notes) -> list[str]:
    """Do to a copy of the config what torchtitan's `Trainer.__init__` does before it builds
    anything, with torchtitan's own code: `ParallelDims` (degrees against the world size; no
    process group, no mesh: those come only with `build_mesh`), the model's
    `update_from_config`, `apply_overrides` and `_validate_cuda_graphs`. Their errors become
    ConfigErrors with what would fit; `layout` adds the checks torchtitan lacks. Returns
    torchtitan's override log lines and the kernel factories a dry run could not apply."""
    trial = copy.deepcopy(config)
    parallel_dims = layout.resolve_degrees(trial.parallelism, world_size)
    layout.update_model_config(trial, world_size)
    layout.check_layout(trial, parallel_dims, model_dir, device=device, here=not missing)
    backend_note = None if missing else layout.spmd_backend_note(parallel_dims, trial.parallelism, device)
    notes.extend([backend_note] if backend_note else [])
    try:
        return _check_overrides(trial, _may_replace_nothing(settings)), []
    except ConfigError as e:
        if not (missing and _needs_the_device(e)):
            raise
        # the kernels need the absent device to load: check everything else, say so
        notes.append(f"kernels.factories not applied in this dry run: {e}")
        trial = _without_kernel_factories(trial, settings)
        return _check_overrides(trial, _may_replace_nothing(settings)), list(settings.kernels.factories)


def _may_replace_nothing(settings: Settings) -> frozenset[str]:
    kernels = settings.kernels
    return frozenset(kernels.overrides if kernels.allow_unused else ())


def _check_overrides(config: Trainer.Config, may_replace_nothing: frozenset[str]) -> list[str]:
    """Apply the override imports to a copy of the config, as the trainer will: a target that
    does not import, names no @override or replaces nothing (unless `may_replace_nothing`)
    fails here, named. Then the trainer's next check, `_validate_cuda_graphs`, on the result."""
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
        if target in may_replace_nothing:
            continue
        if not any(line.startswith(f"[Override] {target}:") for line in replacements):
            raise ConfigError(
                f"override '{target}' matches no node of this model ({config.model_spec.flavor}): "
                "check its @override target class and fqns (kernels.allow_unused=true for an override "
                "meant for other models)."
            )
    try:
        trial._validate_cuda_graphs()
    except ValueError as e:
        message = str(e).replace("--training.", "training.")  # torchtitan's CLI spelling
        raise ConfigError(f"training.disable_cuda_graphs=false: {message}") from e
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
