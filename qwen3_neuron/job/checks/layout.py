"""Parallel layouts, checked against the world size and the model before any process starts.

The plan runs torchtitan's own checks on a copy of the config, as `Trainer.__init__` would once
every rank is up: `ParallelDims` (`resolve_degrees`) and the model's `update_from_config`
(`update_model_config`: TP divides the heads, no weight tying under PP, seq_len within RoPE).
This module names the keys in their errors and lists the values that would fit, and adds what
torchtitan has no callable check for (`check_layout`): the trainer's own inline sequence and
batch arithmetic, CP's whole flex blocks, pipeline microbatches and stages, expert parallel, the
Transformers backend's heads, and two capabilities of the torch of *this* machine (probed, never
a version string; skipped for a dry run that plans for a device that is not here).

    world size = nnodes x nproc_per_node = dp_replicate x dp_shard x cp x tp x pp
    (data_parallel_shard_degree=-1: the ranks the other degrees leave; ep borrows its ranks from
    dp_shard x cp x tp)

Measured on CPU (`launch.py`, 2 gloo ranks + the CPU fixes in `devices`): FSDP and HSDP train
as they are; on torch 2.13, TP, CP and EP train with `spmd_backend=partial_dtensor` (what the
build picks there when the user sets no backend: `devices.torch_capabilities`) and PP does
not run; on torch 2.14 and 2.15, TP, CP and EP train with torchtitan's default `spmd_types` and
PP trains an untied model (`model.flavor=tiny_untied`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from qwen3_neuron.devices.torch_capabilities import OLD_FSDP, schedules_take_microbatch_lists, spmd_types_problem
from qwen3_neuron.errors import ConfigError

# torch's context parallel needs Q_LEN % (cp x this) == 0 for BlockMask attention
# (tensor/experimental/_context_parallel/_attention.py, torch.nn.attention.flex_attention default).
FLEX_BLOCK_SIZE = 128

KEYS = {
    "dp_replicate": "data_parallel_replicate_degree",
    "dp_shard": "data_parallel_shard_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
    "pp": "pipeline_parallel_degree",
    "ep": "expert_parallel_degree",
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of the model the checks torchtitan lacks must divide."""

    name: str
    n_layers: int
    block_mask: bool = False  # attention reads a flex BlockMask (FlexAttention.Config and its swaps)
    num_experts: int | None = None
    heads: dict[str, int] | None = None  # model=hf only: torchtitan checks its own decoders' heads
    hf: bool = False


def resolve_degrees(parallelism, world_size: int):
    """torchtitan's `ParallelDims` for `world_size` ranks (data_parallel_shard_degree=-1
    resolved). Its constructor only checks the degrees: no process group, no device mesh."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    try:
        return ParallelDims.from_config(parallelism, world_size)
    except AssertionError as e:
        raise ConfigError(_degrees_message(parallelism, world_size)) from e


def update_model_config(config, world_size: int) -> None:
    """The model's `update_from_config`, as the trainer calls it before building the model."""
    try:
        config.model_spec.model.update_from_config(config=config)
    except (ValueError, NotImplementedError, AssertionError) as e:
        raise ConfigError(_model_update_message(config, world_size, str(e))) from e


def check_layout(config, parallel_dims, model_dir=None, *, device: str, here: bool = True) -> None:
    """Raise ConfigError where the layout fails a check torchtitan makes only inside a running
    trainer, or not at all. `model_dir`: model=hf's `HFModelDir`. `here`: the workers will run
    on `device` with this machine's torch, so check what they can run too; False for a dry run
    that plans for a device (and its torch) that is not here."""
    shape = model_shape(config, model_dir)
    _check_hf_heads(parallel_dims, shape)
    _check_sequence_split(parallel_dims, shape, config)
    _check_pipeline(parallel_dims, shape, config)
    _check_expert_parallel(parallel_dims, shape)
    _check_batch(parallel_dims, config.training)
    if here:
        _check_spmd_backend(parallel_dims, config.parallelism, shape, device)
        _check_pipeline_schedules(parallel_dims)


def model_shape(config, model_dir=None) -> ModelShape:
    """Layers, experts (and, for model=hf, heads) of the planned model: torchtitan's configs, or
    the HF backend's config.json as the plan read it."""
    spec = config.model_spec
    name = f"{spec.name} {spec.flavor}"
    if model_dir is not None:
        text = model_dir.text_config
        heads = text.get("num_attention_heads")
        return ModelShape(
            name=f"{name} ({model_dir.path.name})",
            n_layers=text["num_hidden_layers"],
            num_experts=model_dir.num_experts,
            heads={"attention heads": heads, "key/value heads": text.get("num_key_value_heads") or heads} if heads else None,
            hf=True,
        )
    from torchtitan.models.common.attention import FlexAttention

    layers = spec.model.layers
    experts = [layer.moe.num_experts for layer in layers if getattr(layer, "moe", None) is not None]
    inner = getattr(spec.model.first_attention, "inner_attention", None)
    return ModelShape(
        name=name,
        n_layers=len(layers),
        block_mask=isinstance(inner, FlexAttention.Config),
        num_experts=experts[0] if experts else None,
    )


# ---- torchtitan's errors, with what would fit -------------------------------------------------


def _degrees_message(parallelism, world_size: int) -> str:
    """Which degree ParallelDims refused (one below its minimum, or a product that is not the
    world size), and the values that would fit."""
    raw = {name: getattr(parallelism, key) for name, key in KEYS.items()}
    for name, value in raw.items():
        lowest = -1 if name == "dp_shard" else 1
        if value < 1 and value != lowest:
            allowed = "-1 (the rest) or >= 1" if name == "dp_shard" else ">= 1"
            return f"parallelism.{KEYS[name]}={value}: must be {allowed}."
    others = {name: raw[name] for name in ("dp_replicate", "cp", "tp", "pp")}
    product = math.prod(others.values())
    shown = others if raw["dp_shard"] == -1 else {**others, "dp_shard": raw["dp_shard"]}
    why = (
        f", which does not divide {world_size}, so data_parallel_shard_degree=-1 has no whole "
        "number of ranks left" if raw["dp_shard"] == -1 else ""
    )  # fmt: skip
    fit = (
        f"data_parallel_shard_degree={world_size // product} (or -1) fits."
        if world_size % product == 0 else _fitting_hint(others, world_size)
    )  # fmt: skip
    return (
        f"parallelism does not fit world size {world_size} (run.nnodes x run.nproc_per_node): "
        f"{_product_text(shown)} = {math.prod(shown.values())}{why}. {fit}"
    )


def _model_update_message(config, world_size: int, error: str) -> str:
    """torchtitan's `update_from_config` error, named by key, with what would fit."""
    spec, parallelism = config.model_spec, config.parallelism
    name = f"{spec.name} {spec.flavor}"
    if "must divide n_" in error:  # "tensor_parallel_degree (4) must divide n_kv_heads (2)."
        attention = spec.model.first_attention
        heads = {"attention heads": attention.n_heads, "key/value heads": attention.n_kv_heads or attention.n_heads}
        return _tp_heads_message(parallelism.tensor_parallel_degree, heads, name, world_size)
    if "Weight tying is not supported with Pipeline Parallel" in error:
        return (
            f"parallelism.pipeline_parallel_degree={parallelism.pipeline_parallel_degree}: {name} ties "
            "its input and output embeddings, which torchtitan cannot split into pipeline stages "
            f"(\"{error}\"). Use FSDP/TP for it, or an untied model"
            + (" (model.flavor=tiny_untied is the tiny one untied)." if spec.flavor == "tiny" else ".")
        )
    if "RoPE maximum" in error:
        return f"training.seq_len={config.training.seq_len} is too long for {name}: {error}"
    return f"model.flavor={spec.flavor} does not take this config ({name}): {error}"


def _tp_heads_message(tp: int, heads: dict[str, int], name: str, world_size: int) -> str:
    clashes = {what: n for what, n in heads.items() if n % tp}
    fits = [d for d in _divisors(world_size) if all(n % d == 0 for n in heads.values())]
    return (
        f"parallelism.tensor_parallel_degree={tp} does not divide the "
        + " and ".join(f"{n} {what}" for what, n in clashes.items())
        + f" of {name}. TP degrees that divide "
        + " and ".join(f"{n} {what}" for what, n in heads.items())
        + f" and the world size {world_size}: {', '.join(map(str, fits))}."
    )


# ---- the checks torchtitan lacks ------------------------------------------------------------


def _check_hf_heads(dims, shape: ModelShape) -> None:
    if shape.heads and dims.tp > 1 and any(n % dims.tp for n in shape.heads.values()):
        raise ConfigError(_tp_heads_message(dims.tp, shape.heads, shape.name, dims.world_size))


def _check_sequence_split(dims, shape: ModelShape, config) -> None:
    """The trainer's seq_len check (trainer.py, after init_distributed), preceded by CP's."""
    seq_len, sequence_parallel = config.training.seq_len, config.parallelism.enable_sequence_parallel
    if dims.cp > 1 and shape.block_mask and seq_len % (dims.cp * FLEX_BLOCK_SIZE):
        divisor = dims.cp * FLEX_BLOCK_SIZE
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by parallelism.context_parallel_degree="
            f"{dims.cp} x {FLEX_BLOCK_SIZE} (the flex BlockMask block size): torch's context "
            f"parallel shards the attention mask in whole blocks. Use a multiple of {divisor}, e.g. "
            f"{_round_up(seq_len, divisor)}."
        )
    if shape.hf and seq_len % dims.seq_len_divisor:  # the Transformers backend's parallelize asserts it, CP or not
        divisor = dims.seq_len_divisor
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by {divisor}: model=hf (torchtitan's Transformers "
            f"backend) takes a multiple of parallelism.tensor_parallel_degree={dims.tp} x 2 x "
            f"parallelism.context_parallel_degree={dims.cp}, with context parallel or without. Use a multiple of "
            f"{divisor}, e.g. {_round_up(seq_len, divisor)}."
        )
    tp = dims.tp if sequence_parallel else 1
    divisor = tp * (2 * dims.cp if dims.cp > 1 else 1)
    if seq_len % divisor == 0:
        return
    parts = [f"parallelism.tensor_parallel_degree={tp} (sequence parallel shards the sequence over the TP ranks)"] if tp > 1 else []
    if dims.cp > 1:
        parts.append(f"2 x parallelism.context_parallel_degree={dims.cp} (context parallel cuts each sequence into 2 x cp chunks)")
    off = " or parallelism.enable_sequence_parallel=false" if tp > 1 and dims.cp == 1 else ""
    raise ConfigError(
        f"training.seq_len={seq_len} is not divisible by {divisor} = {' x '.join(parts)}. "
        f"Use a multiple of {divisor}, e.g. {_round_up(seq_len, divisor)}{off}."
    )


def _check_pipeline(dims, shape: ModelShape, config) -> None:
    if dims.pp == 1:
        return
    parallelism = config.parallelism
    local_batch = config.training.local_batch_size
    microbatch = parallelism.pipeline_parallel_microbatch_size
    if local_batch % microbatch:
        raise ConfigError(
            f"training.local_batch_size={local_batch} is not a multiple of "
            f"parallelism.pipeline_parallel_microbatch_size={microbatch}."
        )
    if parallelism.module_fqns_per_model_part is not None:
        return  # the split is the user's own
    problem = _pipeline_split_problem(dims.pp, shape, parallelism)
    if problem:
        fits = [
            d for d in _divisors(dims.world_size)
            if d > 1 and not _pipeline_split_problem(d, shape, parallelism)
        ]  # fmt: skip
        hint = f" Pipeline degrees that fit: {', '.join(map(str, fits))}." if fits else ""
        raise ConfigError(
            f"parallelism.pipeline_parallel_degree={dims.pp} cannot split the {shape.n_layers} "
            f"layers of {shape.name}: {problem}{hint}"
        )


def _pipeline_split_problem(pp: int, shape: ModelShape, parallelism) -> str | None:
    """torchtitan's own stage arithmetic (distributed/pipeline_parallel.py), run here."""
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )

    layers_only = SimpleNamespace(layers=[None] * shape.n_layers)
    try:
        stages, n_layers, first, last = _get_pipeline_metadata(SimpleNamespace(pp=pp), parallelism, layers_only)
        _generate_llm_fqn_per_model_part(stages, n_layers, first, last)
    except ValueError as e:
        return str(e)
    return None


def _check_expert_parallel(dims, shape: ModelShape) -> None:
    ep = dims.ep
    if ep == 1:
        return
    if shape.num_experts is None:
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} needs a mixture-of-experts model (model=moe); "
            f"{shape.name} has no experts. Use expert_parallel_degree=1."
        )
    borrowed = dims.dp_shard * dims.cp * dims.tp
    if shape.num_experts % ep:
        fits = [d for d in _divisors(shape.num_experts) if borrowed % d == 0]
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} does not divide the {shape.num_experts} experts "
            f"of {shape.name} (model.num_experts). EP degrees that fit: {', '.join(map(str, fits))}."
        )
    if borrowed % ep:
        fits = [d for d in _divisors(borrowed) if shape.num_experts % d == 0]
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} must divide data_parallel_shard_degree="
            f"{dims.dp_shard} x context_parallel_degree={dims.cp} x tensor_parallel_degree="
            f"{dims.tp} = {borrowed} (EP takes its ranks from these). EP degrees that fit: "
            f"{', '.join(map(str, fits))}."
        )


def _check_batch(dims, training) -> None:
    """The trainer's global batch assertion (trainer.py), with the local batch sizes that fit."""
    global_batch, local_batch = training.global_batch_size, training.local_batch_size
    if global_batch <= 0:
        return  # -1: local batch x data-parallel degree, one accumulation step
    data_parallel = dims.dp_replicate * dims.dp_shard  # the trainer's batch mesh
    per_step = local_batch * data_parallel
    if global_batch % per_step:
        fits = [b for b in _divisors(global_batch) if global_batch % (b * data_parallel) == 0]
        raise ConfigError(
            f"training.global_batch_size={global_batch} is not a multiple of training.local_batch_size="
            f"{local_batch} x {data_parallel} data-parallel ranks (data_parallel_replicate_degree="
            f"{dims.dp_replicate} x data_parallel_shard_degree={dims.dp_shard}) = {per_step}. "
            + (f"Local batch sizes that fit: {', '.join(map(str, fits))}." if fits else
               f"No local batch size fits: make the global batch a multiple of {data_parallel}.")
        )


def spmd_backend_note(dims, parallelism, device: str) -> str | None:
    """For the plan's notes: whether the `partial_dtensor` workaround applies to this layout on
    `device` with this machine's torch (None without TP/CP/EP, where the backend does not matter)."""
    model_parallel = [KEYS[name] for name in ("tp", "cp", "ep") if getattr(dims, name) > 1]
    if not model_parallel:
        return None
    backend, used = parallelism.spmd_backend, ", ".join(model_parallel)
    problem = spmd_types_problem(parallelism, device)
    if problem is None:
        if backend == "partial_dtensor":
            return (f"parallelism.spmd_backend=partial_dtensor ({used}): not needed with this torch, whose "
                    "FSDP takes spmd_types parameters (torchtitan's default spmd_types works too).")
        return f"parallelism.spmd_backend={backend} ({used}): this torch's FSDP takes it; no partial_dtensor workaround."
    return f"parallelism.spmd_backend={backend} ({used}): the partial_dtensor workaround, needed here ({problem})."


def _check_spmd_backend(dims, parallelism, shape: ModelShape, device: str) -> None:
    model_parallel = [name for name in ("tp", "cp", "ep") if getattr(dims, name) > 1]
    problem = spmd_types_problem(parallelism, device) if model_parallel else None
    if parallelism.spmd_backend != "spmd_types" or problem is None:
        return
    import torch

    used = ", ".join(f"{KEYS[name]}={getattr(dims, name)}" for name in model_parallel)
    fix = (
        "The Transformers backend (model=hf) accepts only spmd_types: use FSDP/HSDP for it here."
        if shape.hf else "Set parallelism.spmd_backend=partial_dtensor (DTensor on the model-parallel axes)."
    )
    if problem == OLD_FSDP:
        raise ConfigError(
            f"parallelism.spmd_backend=spmd_types with {used} needs torch >= 2.14 "
            f"(FSDP of spmd_types parameters); this torch is {torch.__version__}. {fix}"
        )
    raise ConfigError(f"parallelism.spmd_backend=spmd_types with {used} on device={device}: {problem}. {fix}")


def _check_pipeline_schedules(dims) -> None:
    if dims.pp == 1 or schedules_take_microbatch_lists():
        return
    import torch

    raise ConfigError(
        f"parallelism.pipeline_parallel_degree={dims.pp} needs torch >= 2.14 here: torchtitan "
        f"0.3.0 calls the pipeline schedule with per-microbatch inputs (step(arg_mbs=...)), which "
        f"this torch ({torch.__version__}) does not accept. Use pipeline_parallel_degree=1 (FSDP/"
        "TP) on this machine, or another torch (`make run TORCH=2.14.1`)."
    )


# ---- helpers ---------------------------------------------------------------------------------


def _product_text(degrees: dict[str, int]) -> str:
    return " x ".join(f"{KEYS[name]}={value}" for name, value in degrees.items())


def _fitting_hint(others: dict[str, int], world_size: int) -> str:
    """Which value of each set degree (> 1) would fit with the rest unchanged."""
    hints = []
    for name, value in others.items():
        if value == 1:
            continue
        rest = math.prod(v for n, v in others.items() if n != name)
        fits = [d for d in _divisors(world_size) if (world_size // d) % rest == 0]
        hints.append(f"{KEYS[name]} in {{{', '.join(map(str, fits))}}}")
    return ("With the other degrees unchanged, these fit: " + "; ".join(hints) + ".") if hints else ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
