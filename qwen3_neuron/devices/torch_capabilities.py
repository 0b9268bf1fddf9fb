"""What the torch of *this* machine can do, probed (never a version string): the build picks
`parallelism.spmd_backend` by it, the plan's layout checks and the CPU fixes (`fixes`) ask it.
"""

from __future__ import annotations


def spmd_backend_for_this_torch(parallelism, model_kind: str, device: str) -> str | None:
    """`partial_dtensor` where torchtitan's default `spmd_types` cannot run TP/CP/EP here
    (`spmd_types_problem`) and the model takes it (model=hf accepts spmd_types only: its plan
    refuses, naming FSDP/HSDP); None where the default runs. For a user who sets no backend."""
    degrees = (parallelism.tensor_parallel_degree, parallelism.context_parallel_degree,
               parallelism.expert_parallel_degree)  # fmt: skip
    if model_kind == "hf" or max(degrees) <= 1 or spmd_types_problem(parallelism, device) is None:
        return None
    return "partial_dtensor"


OLD_FSDP = "this torch's FSDP cannot take spmd_types parameters"


def spmd_types_problem(parallelism, device: str) -> str | None:
    """Why torchtitan's default `parallelism.spmd_backend=spmd_types` cannot run this layout's
    TP/CP/EP on `device` with this machine's torch (`OLD_FSDP`: torch < 2.14), or None."""
    if not fsdp_takes_spmd_types():
        return OLD_FSDP
    if device == "cpu" and parallelism.expert_parallel_degree > 1:
        # measured on torch 2.14.1: "ProcessGroupGloo::alltoall: invalid tensor size" at step 1
        return "spmd_types sends EP's tokens as uneven all_to_all chunks, which CPU's gloo refuses"
    return None


def schedules_take_microbatch_lists() -> bool:
    """torchtitan 0.3.0 drives pipeline schedules with per-microbatch lists (trainer.py
    `pp_forward_backward_step`: `step(arg_mbs=...)`); torch 2.13's `step` takes the whole batch
    and fails ("Expecting 4 arg_mbs but got 1", measured on CPU)."""
    import inspect

    from torch.distributed.pipelining.schedules import _PipelineSchedule

    return "arg_mbs" in inspect.signature(_PipelineSchedule.step).parameters


def fsdp_takes_spmd_types() -> bool:
    """torch's FSDP takes spmd_types-typed parameters (torchtitan's default
    `parallelism.spmd_backend=spmd_types`) on a multi-axis mesh from torch 2.14 on; before,
    TP/CP/EP fail in `fully_shard` ("When dp_mesh_dims is provided, all parameters must be
    DTensors"). FSDP/HSDP alone are handled by `devices` (`fixes`)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    return hasattr(FSDPParam, "_resolve_spmd_types_for_storage")
