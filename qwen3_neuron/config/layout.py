"""Parallel layouts, checked against the world size and the model before any process starts.

torchtitan checks a layout only once every rank is up (`ParallelDims`, the trainer's batch and
sequence-length checks, the pipeline splitter), and some clashes never get a message of their
own: a TP degree that does not divide the key/value heads fails as a shape error in the first
forward. `check_layout` runs all of these on the planned `Trainer.Config`, names the keys and the
numbers that clash, and lists the values that would fit.

    world size = nnodes x nproc_per_node = dp_replicate x dp_shard x cp x tp x pp
    (data_parallel_shard_degree=-1: the ranks the other degrees leave; ep borrows its ranks from
    dp_shard x cp x tp)

Two more checks are about the torch of *this* machine (skipped for a dry run that plans for a
device that is not here, `here=False`). Measured on CPU (`launch.py`, 2 gloo ranks, torch 2.13 +
the CPU fixes in `devices`): FSDP and HSDP train as they are; TP, CP and EP train with
`spmd_backend=partial_dtensor`; PP does not run. Nothing there is particular to CPU or gloo - each
failure is one of these two torch capabilities, probed (never a version string):
- torch's FSDP takes spmd_types-typed parameters (`parallelism.spmd_backend=spmd_types`,
  torchtitan's default) on a multi-axis mesh only from torch 2.14 on
  (`FSDPParam._resolve_spmd_types_for_storage`); with TP, CP or EP on an older torch the run
  would fail in `fully_shard` ("When dp_mesh_dims is provided, all parameters must be DTensors"),
  so the plan asks for `spmd_backend=partial_dtensor` instead (measured on CPU: TP, CP and EP
  train with it). FSDP/HSDP alone are handled by `devices` (CPU fix 7);
- torchtitan 0.3.0 drives pipeline schedules with per-microbatch lists
  (`schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)`, trainer.py
  `pp_forward_backward_step`), an API torch 2.13's schedules lack (their `step` takes the whole
  batch and fails: "Expecting 4 arg_mbs but got 1", measured on CPU). PP is refused on such a torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

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
class Degrees:
    dp_replicate: int
    dp_shard: int  # resolved: never -1
    cp: int
    tp: int
    pp: int
    ep: int

    @property
    def data_parallel(self) -> int:
        """Ranks that read different data (torchtitan's batch mesh)."""
        return self.dp_replicate * self.dp_shard


@dataclass(frozen=True)
class ModelShape:
    """The numbers of the model a layout must divide; None where the model does not say."""

    name: str
    tied_embeddings: bool = False
    block_mask: bool = False  # attention reads a flex BlockMask (FlexAttention.Config and its swaps)
    n_heads: int | None = None
    n_kv_heads: int | None = None
    n_layers: int | None = None
    num_experts: int | None = None


def check_layout(config, world_size: int, *, here: bool = True) -> None:
    """Raise ConfigError when `config.parallelism` does not fit `world_size` ranks and the model.

    `here`: the workers will run with this machine's torch, so check what it can run too; False
    for a dry run that plans for a device (and its torch) that is not here."""
    parallelism = config.parallelism
    degrees = resolve_degrees(parallelism, world_size)
    shape = model_shape(config)
    training = config.training
    _check_tensor_parallel(degrees, shape, training.seq_len, parallelism.enable_sequence_parallel, world_size)
    _check_context_parallel(degrees, shape, training.seq_len, parallelism.enable_sequence_parallel)
    _check_pipeline(degrees, shape, parallelism, config, world_size)
    _check_expert_parallel(degrees, shape)
    _check_batch(degrees, training)
    if here:
        _check_spmd_backend(degrees, parallelism, shape)
        _check_pipeline_schedules(degrees)


def resolve_degrees(parallelism, world_size: int) -> Degrees:
    """The degrees with data_parallel_shard_degree=-1 resolved; raises when they cannot multiply
    to the world size."""
    raw = {name: getattr(parallelism, key) for name, key in KEYS.items()}
    for name, value in raw.items():
        lowest = -1 if name == "dp_shard" else 1
        if value < 1 and value != lowest:
            allowed = "-1 (the rest) or >= 1" if name == "dp_shard" else ">= 1"
            raise ConfigError(f"parallelism.{KEYS[name]}={value}: must be {allowed}.")
    others = {name: raw[name] for name in ("dp_replicate", "cp", "tp", "pp")}
    product_of_others = math.prod(others.values())
    if raw["dp_shard"] == -1:
        if world_size % product_of_others:
            raise ConfigError(
                f"parallelism does not fit world size {world_size} (run.nnodes x "
                f"run.nproc_per_node): {_product_text(others)} = {product_of_others}, which does "
                f"not divide {world_size}, so data_parallel_shard_degree=-1 has no whole number of "
                f"ranks left. {_fitting_hint(others, world_size)}"
            )
        raw["dp_shard"] = world_size // product_of_others
    elif product_of_others * raw["dp_shard"] != world_size:
        shown = {**others, "dp_shard": raw["dp_shard"]}
        fit = (
            f" data_parallel_shard_degree={world_size // product_of_others} (or -1) fits."
            if world_size % product_of_others == 0
            else f" {_fitting_hint(others, world_size)}"
        )
        raise ConfigError(
            f"parallelism does not fit world size {world_size} (run.nnodes x run.nproc_per_node): "
            f"{_product_text(shown)} = {math.prod(shown.values())}.{fit}"
        )
    return Degrees(**raw)


def model_shape(config) -> ModelShape:
    """Heads, layers and experts of the planned model (torchtitan's native configs, or the HF
    backend's config.json)."""
    spec = config.model_spec
    model = spec.model
    name = f"{spec.name} {spec.flavor}"
    layers = getattr(model, "layers", None)
    if isinstance(layers, list) and layers and hasattr(layers[0], "attention"):
        from torchtitan.models.common.attention import FlexAttention

        attention = layers[0].attention
        experts = [layer.moe.num_experts for layer in layers if getattr(layer, "moe", None) is not None]
        return ModelShape(
            name=name,
            tied_embeddings=bool(getattr(model, "enable_weight_tying", False)),
            block_mask=isinstance(getattr(attention, "inner_attention", None), FlexAttention.Config),
            n_heads=getattr(attention, "n_heads", None),
            n_kv_heads=getattr(attention, "n_kv_heads", None),
            n_layers=len(layers),
            num_experts=experts[0] if experts else None,
        )
    return _hf_shape(name, getattr(config, "hf_model", None))


# ---- the checks ------------------------------------------------------------------------------


def _check_tensor_parallel(degrees, shape, seq_len, sequence_parallel, world_size) -> None:
    tp = degrees.tp
    if tp == 1:
        return
    heads = {"attention heads": shape.n_heads, "key/value heads": shape.n_kv_heads}
    clashes = {what: n for what, n in heads.items() if n is not None and n % tp}
    if clashes:
        known = [n for n in heads.values() if n is not None]
        fits = [d for d in _divisors(world_size) if all(n % d == 0 for n in known)]
        raise ConfigError(
            f"parallelism.tensor_parallel_degree={tp} does not divide the "
            + " and ".join(f"{n} {what}" for what, n in clashes.items())
            + f" of {shape.name}. TP degrees that divide "
            + " and ".join(f"{n} {what}" for what, n in heads.items() if n is not None)
            + f" and the world size {world_size}: {', '.join(map(str, fits))}."
        )
    if sequence_parallel and seq_len % tp:
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by parallelism.tensor_parallel_degree="
            f"{tp} (sequence parallel shards the sequence over the TP ranks). Use a multiple of "
            f"{tp}, e.g. {_round_up(seq_len, tp)}, or parallelism.enable_sequence_parallel=false."
        )


def _check_context_parallel(degrees, shape, seq_len, sequence_parallel) -> None:
    if degrees.cp == 1:
        return
    if shape.block_mask and seq_len % (degrees.cp * FLEX_BLOCK_SIZE):
        divisor = degrees.cp * FLEX_BLOCK_SIZE
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by parallelism.context_parallel_degree="
            f"{degrees.cp} x {FLEX_BLOCK_SIZE} (the flex BlockMask block size): torch's context "
            f"parallel shards the attention mask in whole blocks. Use a multiple of {divisor}, e.g. "
            f"{_round_up(seq_len, divisor)}."
        )
    divisor = 2 * degrees.cp * (degrees.tp if sequence_parallel else 1)
    if seq_len % divisor:
        tp_part = f" x tensor_parallel_degree={degrees.tp}" if sequence_parallel and degrees.tp > 1 else ""
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by {divisor} = 2 x "
            f"parallelism.context_parallel_degree={degrees.cp}{tp_part} (context parallel cuts each "
            f"sequence into 2 x cp chunks). Use a multiple of {divisor}, e.g. {_round_up(seq_len, divisor)}."
        )


def _check_pipeline(degrees, shape, parallelism, config, world_size) -> None:
    if degrees.pp == 1:
        return
    local_batch = config.training.local_batch_size
    microbatch = parallelism.pipeline_parallel_microbatch_size
    if microbatch < 1 or local_batch % microbatch:
        raise ConfigError(
            f"training.local_batch_size={local_batch} is not a multiple of "
            f"parallelism.pipeline_parallel_microbatch_size={microbatch}."
        )
    if shape.tied_embeddings:
        raise ConfigError(
            f"parallelism.pipeline_parallel_degree={degrees.pp}: {shape.name} ties its input and "
            "output embeddings, which torchtitan cannot split into pipeline stages (\"Weight tying "
            "is not supported with Pipeline Parallel\"). Use FSDP/TP for it, or an untied model."
        )
    if shape.n_layers is None or parallelism.module_fqns_per_model_part is not None:
        return  # the split is the user's own, or the model does not list its layers
    problem = _pipeline_split_problem(degrees.pp, shape, parallelism)
    if problem:
        fits = [
            d for d in _divisors(world_size)
            if d > 1 and not _pipeline_split_problem(d, shape, parallelism)
        ]  # fmt: skip
        hint = f" Pipeline degrees that fit: {', '.join(map(str, fits))}." if fits else ""
        raise ConfigError(
            f"parallelism.pipeline_parallel_degree={degrees.pp} cannot split the {shape.n_layers} "
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


def _check_expert_parallel(degrees, shape) -> None:
    ep = degrees.ep
    if ep == 1:
        return
    if shape.num_experts is None:
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} needs a mixture-of-experts model (model=moe); "
            f"{shape.name} has no experts. Use expert_parallel_degree=1."
        )
    if shape.num_experts % ep:
        fits = [d for d in _divisors(shape.num_experts) if (degrees.dp_shard * degrees.cp * degrees.tp) % d == 0]
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} does not divide the {shape.num_experts} experts "
            f"of {shape.name} (model.num_experts). EP degrees that fit: {', '.join(map(str, fits))}."
        )
    borrowed = degrees.dp_shard * degrees.cp * degrees.tp
    if borrowed % ep:
        fits = [d for d in _divisors(borrowed) if shape.num_experts % d == 0]
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} must divide data_parallel_shard_degree="
            f"{degrees.dp_shard} x context_parallel_degree={degrees.cp} x tensor_parallel_degree="
            f"{degrees.tp} = {borrowed} (EP takes its ranks from these). EP degrees that fit: "
            f"{', '.join(map(str, fits))}."
        )


def _check_batch(degrees, training) -> None:
    global_batch, local_batch = training.global_batch_size, training.local_batch_size
    if local_batch < 1:
        raise ConfigError(f"training.local_batch_size={local_batch}: must be >= 1.")
    if global_batch <= 0:
        return  # -1: local batch x data-parallel degree, one accumulation step
    per_step = local_batch * degrees.data_parallel
    if global_batch % per_step:
        fits = [b for b in _divisors(global_batch) if global_batch % (b * degrees.data_parallel) == 0]
        raise ConfigError(
            f"training.global_batch_size={global_batch} is not a multiple of training.local_batch_size="
            f"{local_batch} x {degrees.data_parallel} data-parallel ranks (data_parallel_replicate_degree="
            f"{degrees.dp_replicate} x data_parallel_shard_degree={degrees.dp_shard}) = {per_step}. "
            + (f"Local batch sizes that fit: {', '.join(map(str, fits))}." if fits else
               f"No local batch size fits: make the global batch a multiple of {degrees.data_parallel}.")
        )


def _check_spmd_backend(degrees, parallelism, shape) -> None:
    model_parallel = [name for name in ("tp", "cp", "ep") if getattr(degrees, name) > 1]
    if parallelism.spmd_backend != "spmd_types" or not model_parallel or _fsdp_takes_spmd_types():
        return
    import torch

    used = ", ".join(f"{KEYS[name]}={getattr(degrees, name)}" for name in model_parallel)
    hf = shape.name.startswith("transformers_modeling_backend")
    fix = (
        "The Transformers backend (model=hf) accepts only spmd_types: use FSDP/HSDP for it here."
        if hf else "Set parallelism.spmd_backend=partial_dtensor (DTensor on the model-parallel axes)."
    )
    raise ConfigError(
        f"parallelism.spmd_backend=spmd_types with {used} needs torch >= 2.14 "
        f"(FSDP of spmd_types parameters); this torch is {torch.__version__}. {fix}"
    )


def _check_pipeline_schedules(degrees) -> None:
    if degrees.pp == 1 or _schedules_take_microbatch_lists():
        return
    import torch

    raise ConfigError(
        f"parallelism.pipeline_parallel_degree={degrees.pp} needs torch >= 2.14 here: torchtitan "
        f"0.3.0 calls the pipeline schedule with per-microbatch inputs (step(arg_mbs=...)), which "
        f"this torch ({torch.__version__}) does not accept. Use pipeline_parallel_degree=1 (FSDP/"
        "TP) on this machine."
    )


def _schedules_take_microbatch_lists() -> bool:
    import inspect

    from torch.distributed.pipelining.schedules import _PipelineSchedule

    return "arg_mbs" in inspect.signature(_PipelineSchedule.step).parameters


def _fsdp_takes_spmd_types() -> bool:
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    return hasattr(FSDPParam, "_resolve_spmd_types_for_storage")


# ---- helpers ---------------------------------------------------------------------------------


def _hf_shape(name: str, hf_model: str | None) -> ModelShape:
    """The HF backend reads config.json only in the workers; read the same file here."""
    if not hf_model or not (Path(hf_model) / "config.json").is_file():
        return ModelShape(name=name)
    hf = json.loads((Path(hf_model) / "config.json").read_text(encoding="utf-8"))
    hf = hf.get("text_config", hf)
    experts = next((hf[k] for k in ("num_experts", "n_routed_experts", "num_local_experts") if hf.get(k)), None)
    return ModelShape(
        name=f"{name} ({Path(hf_model).name})",
        n_heads=hf.get("num_attention_heads"),
        n_kv_heads=hf.get("num_key_value_heads", hf.get("num_attention_heads")),
        n_layers=hf.get("num_hidden_layers"),
        num_experts=experts,
    )


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
