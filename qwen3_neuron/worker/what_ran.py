"""What this rank ran, read from the built model and torch's own compile counters, not from the
plan: `<run dir>/what_ran/rank_N.json`, which the launcher's summary reports (`overrides`,
`attention`, `compiled`).

- `overrides`: for each `override.imports` entry, the modules of this rank's model (and the
  trainer's components, `trainer.<name>`) whose class its module defines ({fqn: "module.Class"}).
  A kernel's replacement class lives in the module of its `@override` factory (the project's
  kernels, `examples/my_moe.py`); an entry whose classes appear nowhere in the model replaced
  nothing here, whatever the plan said.
- `attention`: what computes each layer's attention ({module fqn: "module.Class"}): its
  `inner_attention` (native Qwen3, MoE), or for model=hf the attention function torchtitan's
  Transformers backend calls from each `self_attn`.
- `compiled` (compile.enable=true): the backend torchtitan compiled with, and from
  `torch._dynamo.utils`: graphs captured (`counters["stats"]["unique_graphs"]`), frames compiled
  (its compilation metrics: one record per frame compile, another per backward compile),
  recompiles (compiles of a frame that already had compiled code, with their reasons) and the
  seconds spent compiling, forward and backward.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.run_dir import write_what_ran

_HF_BACKEND_MODEL = "torchtitan.experiments.transformers_modeling_backend.model"
_MAX_REASONS = 5  # recompile reasons kept per rank: the first few say what changed


def record_what_ran(trainer, config, run_dir: Path) -> dict[str, Any]:
    """Write this rank's record (after training: the compile counters are final)."""
    modules = _model_modules(trainer)
    record = {
        "overrides": replaced_modules(modules + _components(trainer), config.override.imports),
        "attention": attention_classes(modules),
        "compiled": compile_record(config.compile.backend) if config.compile.enable else None,
    }
    write_what_ran(run_dir, int(os.environ.get("RANK", "0")), record)
    return record


def check_overrides_replaced(trainer, overrides: list[str]) -> None:
    """Once the model is built, before the first step: refuse (ConfigError) an override of
    `kernels.overrides` whose classes no module of this rank's model or trainer has."""
    for target, replaced in replaced_modules(_model_modules(trainer) + _components(trainer), overrides).items():
        if not replaced:
            raise ConfigError(
                f"kernels.overrides: '{target}' replaced nothing: no module of the built model is of a class "
                f"defined in {target.rpartition('.')[0]} (where its @override's classes live). Check what its "
                "factory returns; for an override meant for other models, set kernels.allow_unused=true."
            )


def _model_modules(trainer) -> list[tuple[str, Any]]:
    return [(fqn, module) for part in trainer.model_parts for fqn, module in part.named_modules()]


def _components(trainer) -> list[tuple[str, Any]]:
    """The trainer's own components (metrics, loss, dataloader, ...): overrides may replace those too."""
    return [(f"trainer.{name}", value) for name, value in vars(trainer).items()]


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def replaced_modules(modules, imports) -> dict[str, dict[str, str]]:
    """{override: {module fqn: class}} for every `override.imports` entry (empty: replaced nothing)."""
    record = {}
    for entry in imports:
        target = entry if isinstance(entry, str) else entry[0]
        home = target.rpartition(".")[0]  # the module of the @override factory
        record[target] = {
            _clean(fqn): class_path(type(m)) for fqn, m in modules if type(m).__module__ == home
        }
    return record


def attention_classes(modules) -> dict[str, str]:
    record = {_clean(fqn): class_path(type(m)) for fqn, m in modules if fqn.rpartition(".")[2] == "inner_attention"}
    hf_backend = sys.modules.get(_HF_BACKEND_MODEL)
    if hf_backend is not None and not record:  # model=hf: a module-level function, swapped per device
        function = hf_backend.flex_attention_forward
        record = {
            _clean(fqn): f"{function.__module__}.{function.__qualname__}"
            for fqn, _ in modules if fqn.rpartition(".")[2] == "self_attn"  # Transformers' layer name
        }  # fmt: skip
    return record


def compile_record(backend: str) -> dict[str, Any]:
    from torch._dynamo.utils import counters, get_compilation_metrics

    metrics = [m for m in get_compilation_metrics() if not m.is_runtime]
    frames = [m for m in metrics if m.co_name]  # a backward compile's record names no code object
    # a reason's first line names the guard that failed (the rest is its user stack)
    recompiles = [m.recompile_reason.splitlines()[0] for m in frames if m.recompile_reason]
    seconds = sum(
        (m.entire_frame_compile_time_s or 0.0) + (m.backward_cumulative_compile_time_us or 0) / 1e6 for m in metrics
    )
    return {
        "backend": backend,
        "graphs": counters["stats"]["unique_graphs"],
        "frames_compiled": len(frames),
        "recompiles": len(recompiles),
        "recompile_reasons": recompiles[:_MAX_REASONS],
        "compile_seconds": round(seconds, 3),
    }


def _clean(fqn: str) -> str:
    """A module's name without the wrappers torch.compile and activation checkpointing add."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        fqn = fqn.replace(wrapper, "")
    return fqn
