"""Parallel layouts, the Neuron device plan, multi-node torchrun.

Unit tests compose and plan (no process starts). Integration tests train each layout (FSDP, TP,
CP, EP; HSDP as one job of two "nodes" on localhost) 10 steps on 2 CPU gloo ranks and compare its
losses and grad norms, step by step, with one rank's on the same global batches.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, compose_config, compose_job, launch, launch_of, plan_of, read_jsonl

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.devices import torch_capabilities
from qwen3_neuron.devices.torch_capabilities import fsdp_takes_spmd_types, schedules_take_microbatch_lists
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.checks.layout import resolve_degrees
from qwen3_neuron.job.torchrun import torchrun_args
from qwen3_neuron.run_dir import group_replacements

OLD_TORCH_FSDP = not fsdp_takes_spmd_types()  # torch < 2.14: TP/CP/EP need partial_dtensor
OLD_TORCH_PP = not schedules_take_microbatch_lists()  # torch < 2.14: torchtitan's PP cannot run
PP_REFUSED = "this torch's pipeline schedules take the whole batch, not torchtitan 0.3.0's microbatch lists"
MODEL_PARALLEL_BACKEND = ["parallelism.spmd_backend=partial_dtensor"] if OLD_TORCH_FSDP else []
NEURON_DRY_RUN = ["device=neuron", "run.dry_run=true"]


def plan_for(tmp_path, *overrides):
    return plan_of(compose_job(*overrides), tmp_path / "run")


def degrees_of(plan) -> tuple[int, ...]:
    d = resolve_degrees(plan.trainer_config.parallelism, plan.world_size)
    return d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp, d.ep


# ---- every option composes and plans ---------------------------------------------------------

#          option, extra overrides, world size, (dp_replicate, dp_shard, cp, tp, pp, ep)
OPTIONS = [
    ("auto", [], 2, (1, 2, 1, 1, 1, 1)),
    ("fsdp", [], 2, (1, 2, 1, 1, 1, 1)),
    ("hsdp", ["run.nproc_per_node=4"], 4, (2, 2, 1, 1, 1, 1)),
    ("tp", ["run.nproc_per_node=4", *MODEL_PARALLEL_BACKEND], 4, (1, 2, 1, 2, 1, 1)),
    ("cp", ["training.seq_len=256", *MODEL_PARALLEL_BACKEND], 2, (1, 1, 2, 1, 1, 1)),
    # PP needs an untied model (tiny ties its embeddings) and, here, a torch whose schedules
    # take microbatch lists: planned as a Neuron dry run (this torch is not the one that runs it)
    ("pp", ["model=moe", "run.nproc_per_node=4", *NEURON_DRY_RUN], 4, (1, 2, 1, 1, 2, 1)),
    ("ep", ["model=moe", *MODEL_PARALLEL_BACKEND], 2, (1, 2, 1, 1, 1, 2)),
]


@pytest.mark.parametrize("option, overrides, world_size, expected", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_every_parallelism_option_composes_and_plans(tmp_path, assets, option, overrides, world_size, expected):
    plan = plan_for(tmp_path, f"parallelism={option}", *overrides)
    assert plan.world_size == world_size
    assert degrees_of(plan) == expected
    assert f"--nproc_per_node={launch_of(plan).nproc_per_node}" in launch_of(plan).command


def test_a_degree_is_overridable_on_the_command_line(tmp_path, assets):
    plan = plan_for(
        tmp_path, "parallelism=tp", "parallelism.tensor_parallel_degree=4", "run.nproc_per_node=8",
        "model=moe", "model.flavor=debugmodel_moe", *MODEL_PARALLEL_BACKEND,
    )  # fmt: skip
    assert plan.trainer_config.parallelism.tensor_parallel_degree == 4
    assert degrees_of(plan) == (1, 2, 1, 4, 1, 1)


def test_pp_and_ep_switch_off_cuda_graphs_which_torchtitan_refuses_with_them(assets):
    for option in ("pp", "ep"):
        assert compose_config(f"parallelism={option}")["training"]["disable_cuda_graphs"] is True


# ---- inconsistent layouts fail at plan time, naming the numbers ------------------------------

BAD_LAYOUTS = [
    (["parallelism.tensor_parallel_degree=3"],
     ["tensor_parallel_degree=3", "world size 2", "tensor_parallel_degree in {1, 2}"]),
    (["parallelism.data_parallel_shard_degree=4"],
     ["data_parallel_shard_degree=4 = 4", "world size 2", "data_parallel_shard_degree=2 (or -1) fits"]),
    (["parallelism=hsdp", "parallelism.data_parallel_replicate_degree=3"],
     ["data_parallel_replicate_degree=3", "does not divide 2"]),
    (["parallelism=tp", "parallelism.tensor_parallel_degree=4", "run.nproc_per_node=4"],
     ["tensor_parallel_degree=4 does not divide the 2 key/value heads of qwen3 tiny",
      "TP degrees that divide 4 attention heads and 2 key/value heads and the world size 4: 1, 2"]),
    (["parallelism=tp", "training.seq_len=127", "run.nproc_per_node=4"],
     ["training.seq_len=127", "tensor_parallel_degree=2", "128"]),
    (["parallelism=cp", "training.seq_len=200"],
     ["training.seq_len=200", "context_parallel_degree=2", "256"]),
    (["parallelism=pp", *NEURON_DRY_RUN],
     ["pipeline_parallel_degree=2", "ties its input and output embeddings"]),
    (["parallelism=pp", "model=moe", "parallelism.pipeline_parallel_degree=8", "run.nproc_per_node=8", *NEURON_DRY_RUN],
     ["pipeline_parallel_degree=8 cannot split the 2 layers", "Pipeline degrees that fit: 2, 4"]),
    (["parallelism=pp", "model=moe", "training.local_batch_size=3",
      "parallelism.pipeline_parallel_microbatch_size=2", *NEURON_DRY_RUN],
     ["local_batch_size", "3", "pipeline_parallel_microbatch_size"]),
    (["parallelism=ep"],
     ["expert_parallel_degree=2 needs a mixture-of-experts model", "qwen3 tiny has no experts"]),
    (["parallelism=ep", "model=moe", "model.num_experts=6", "parallelism.expert_parallel_degree=4",
      "run.nproc_per_node=4"],
     ["expert_parallel_degree=4 does not divide the 6 experts", "EP degrees that fit: 1, 2"]),
    (["parallelism=ep", "model=moe", "parallelism.expert_parallel_degree=4"],
     ["expert_parallel_degree=4 must divide", "= 2", "EP degrees that fit: 1, 2"]),
    (["training.global_batch_size=6", "training.local_batch_size=2"],
     ["training.global_batch_size=6", "2 data-parallel ranks", "Local batch sizes that fit: 1, 3"]),
]  # fmt: skip


@pytest.mark.parametrize("overrides, expected", BAD_LAYOUTS, ids=[" ".join(o) for o, _ in BAD_LAYOUTS])
def test_inconsistent_layouts_fail_at_plan_time_naming_the_numbers(tmp_path, assets, overrides, expected):
    with pytest.raises(ConfigError) as error:
        plan_for(tmp_path, *overrides, *MODEL_PARALLEL_BACKEND)
    for text in expected:
        assert text in str(error.value)


@pytest.mark.skipif(not OLD_TORCH_FSDP, reason="this torch's FSDP takes spmd_types parameters")
@pytest.mark.parametrize("option", ["tp", "cp", "ep"])
def test_model_parallel_options_plan_as_shipped_and_spmd_types_is_refused_on_this_torch(tmp_path, assets, option):
    shipped = ("model=moe", "training.seq_len=256", "run.nproc_per_node=2")
    assert plan_for(tmp_path, f"parallelism={option}", *shipped).trainer_config.parallelism.spmd_backend == "partial_dtensor"
    with pytest.raises(ConfigError, match=r"spmd_backend=spmd_types .* needs torch >= 2.14") as error:
        plan_for(tmp_path, f"parallelism={option}", *shipped, "parallelism.spmd_backend=spmd_types")
    assert "parallelism.spmd_backend=partial_dtensor" in str(error.value)


@pytest.mark.skipif(not OLD_TORCH_PP, reason="this torch's pipeline schedules take microbatch lists")
def test_pipeline_parallel_is_refused_on_this_torch(tmp_path, assets):
    with pytest.raises(ConfigError, match="pipeline_parallel_degree=2 needs torch >= 2.14"):
        plan_for(tmp_path, "parallelism=pp", "model=moe")


@pytest.mark.parametrize("backend", ["spmd_types", "partial_dtensor"])
def test_the_plan_says_whether_the_partial_dtensor_workaround_applies(tmp_path, assets, backend):
    if backend == "spmd_types" and OLD_TORCH_FSDP:
        pytest.skip("this torch's FSDP cannot take spmd_types parameters: the plan refuses it (test above)")
    plan = plan_for(tmp_path, "parallelism=tp", "run.nproc_per_node=4", f"parallelism.spmd_backend={backend}")
    note = next(n for n in plan.notes if n.startswith("parallelism.spmd_backend="))
    assert f"spmd_backend={backend} (tensor_parallel_degree)" in note
    if OLD_TORCH_FSDP:
        assert "the partial_dtensor workaround, needed here" in note
    elif backend == "partial_dtensor":
        assert "not needed with this torch" in note
    else:
        assert "no partial_dtensor workaround" in note
    assert not any(n.startswith("parallelism.spmd_backend=") for n in plan_for(tmp_path, "parallelism=fsdp").notes)


def test_ep_on_cpu_takes_partial_dtensor_on_every_torch(tmp_path, assets, monkeypatch):
    """spmd_types' EP sends uneven all_to_all chunks, which gloo refuses at step 1 even on a torch
    whose FSDP takes spmd_types (measured on torch 2.14.1, where TP and CP run with it): on CPU an
    EP job that sets no backend gets partial_dtensor, and one that asks for spmd_types is refused."""
    monkeypatch.setattr(torch_capabilities, "fsdp_takes_spmd_types", lambda: True)  # as torch >= 2.14
    ep = ("model=moe", "parallelism=ep")
    plan = plan_for(tmp_path, *ep)
    assert plan.trainer_config.parallelism.spmd_backend == "partial_dtensor"
    assert "parallelism.spmd_backend=partial_dtensor (expert_parallel_degree): the partial_dtensor workaround, " \
           "needed here (spmd_types sends EP's tokens as uneven all_to_all chunks, which CPU's gloo refuses)." in plan.notes
    assert plan_for(tmp_path, "parallelism=tp", "run.nproc_per_node=4").trainer_config.parallelism.spmd_backend == "spmd_types"
    with pytest.raises(ConfigError) as error:
        plan_for(tmp_path, *ep, "parallelism.spmd_backend=spmd_types")
    assert str(error.value) == (
        "parallelism.spmd_backend=spmd_types with expert_parallel_degree=2 on device=cpu: spmd_types sends EP's "
        "tokens as uneven all_to_all chunks, which CPU's gloo refuses. Set parallelism.spmd_backend=partial_dtensor "
        "(DTensor on the model-parallel axes)."
    )


@pytest.mark.skipif(OLD_TORCH_PP, reason=PP_REFUSED)
def test_pp_plans_on_this_torch_for_an_untied_model_only(tmp_path, assets):
    plan = plan_for(tmp_path, "parallelism=pp", "model.flavor=tiny_untied")
    assert degrees_of(plan) == (1, 1, 1, 1, 2, 1)
    with pytest.raises(ConfigError, match="qwen3 tiny ties its input and output embeddings"):
        plan_for(tmp_path, "parallelism=pp")


def test_a_neuron_dry_run_does_not_apply_this_machines_torch_checks(tmp_path, assets):
    plan = plan_for(tmp_path, "parallelism=tp", "model=moe", "run.nproc_per_node=4", *NEURON_DRY_RUN)
    assert plan.trainer_config.parallelism.spmd_backend == "spmd_types"
    assert degrees_of(plan) == (1, 2, 1, 2, 1, 1)


# ---- device=neuron ---------------------------------------------------------------------------

HAS_TORCH_NEURONX = devices.unavailable_reason("neuron") is None


@pytest.mark.skipif(HAS_TORCH_NEURONX, reason="torch-neuronx is installed here")
def test_neuron_dry_run_plans_64_ranks_with_the_neuron_env_and_says_it_did_not_check(tmp_path, assets):
    plan = plan_for(tmp_path, *NEURON_DRY_RUN, "compile.enable=true")
    assert (plan.device, launch_of(plan).nproc_per_node, plan.world_size) == ("neuron", 64, 64)
    assert "--nproc_per_node=64" in launch_of(plan).command and "--standalone" in launch_of(plan).command
    assert launch_of(plan).env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert "--logical-nc-config=2" in launch_of(plan).env["NEURON_CC_FLAGS"] and "--target=trn2" in launch_of(plan).env["NEURON_CC_FLAGS"]
    assert launch_of(plan).env["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith("neff")
    assert "OMP_NUM_THREADS" not in launch_of(plan).env
    assert plan.trainer_config.compile.backend == "neuron"
    assert any("device=neuron is not here" in note and "torch-neuronx" in note for note in plan.notes)
    assert devices.NEURON_ATTENTION_OVERRIDE in plan.trainer_config.override.imports
    swapped = group_replacements(plan.replacements)[devices.NEURON_ATTENTION_OVERRIDE]
    assert len(swapped) == 4 and all("FlexAttention.Config -> NeuronSDPAAttention.Config" in s for s in swapped)


def test_a_users_compile_backend_is_kept(tmp_path, assets):
    plan = plan_for(tmp_path, *NEURON_DRY_RUN, "compile.backend=aot_eager")
    assert plan.trainer_config.compile.backend == "aot_eager"
    assert plan_for(tmp_path).trainer_config.compile.backend == "inductor"  # cpu: torchtitan's


@pytest.mark.parametrize("bf16_units, expected", [(False, "float32"), (True, "bfloat16")], ids=["emulated", "native"])
def test_a_cpu_that_emulates_bf16_keeps_fsdp_parameters_in_float32(tmp_path, assets, monkeypatch, bf16_units, expected):
    monkeypatch.setattr(devices, "_cpu_has_bf16_units", lambda: bf16_units)
    assert plan_for(tmp_path).trainer_config.training.mixed_precision_param == expected
    kept = plan_for(tmp_path, "training.mixed_precision_param=bfloat16").trainer_config.training
    assert kept.mixed_precision_param == "bfloat16"  # the user's choice wins
    assert plan_for(tmp_path, *NEURON_DRY_RUN).trainer_config.training.mixed_precision_param == "bfloat16"


def test_neuron_env_keeps_what_the_user_exported(monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--target=trn2 --lnc=2 -O1")
    assert "NEURON_CC_FLAGS" not in devices.compiler_env("neuron")  # the NEFF cache: tests/test_neuron_plan.py
    assert devices.compiler_env("cpu") == devices.compiler_env("cuda") == {}


@pytest.mark.skipif(HAS_TORCH_NEURONX, reason="torch-neuronx is installed here")
def test_neuron_without_dry_run_is_still_refused(tmp_path, assets):
    with pytest.raises(ConfigError, match="device.type=neuron.*torch-neuronx is not installed"):
        plan_for(tmp_path, "device=neuron")


@pytest.mark.numerics
def test_neuron_attention_matches_flex_and_lets_torchtitan_compile_with_the_neuron_backend():
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.distributed.compile import _maybe_regional_inductor_backend
    from torchtitan.models.common.attention import FlexAttention, get_causal_mask_mod

    from qwen3_neuron.kernels.attention.neuron import sdpa_for_neuron

    batch, seq, heads, kv_heads, head_dim = 2, 128, 4, 2, 32
    mask = create_block_mask(get_causal_mask_mod(), batch, None, seq, seq, device="cpu")
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, seq, heads, head_dim, generator=generator)
    k, v = (torch.randn(batch, seq, kv_heads, head_dim, generator=generator) for _ in range(2))
    flex = FlexAttention(FlexAttention.Config())
    neuron = sdpa_for_neuron(FlexAttention.Config()).build()
    kwargs = dict(attention_masks=mask, scale=0.125, enable_gqa=True)
    expected = flex(q, k, v, **kwargs)  # float32 both: sums of `seq` weighted values, n x 2^-24 of their magnitude
    torch.testing.assert_close(neuron(q, k, v, **kwargs), expected, atol=seq * 2**-24 * expected.abs().max(), rtol=0)

    assert isinstance(sdpa_for_neuron(FlexAttention.Config()), FlexAttention.Config)  # masks still built
    assert _maybe_regional_inductor_backend(torch.nn.Sequential(neuron), "neuron") == "neuron"
    with pytest.raises(ValueError, match="neither 'inductor' nor 'aot_eager'"):
        _maybe_regional_inductor_backend(torch.nn.Sequential(flex), "neuron")


# ---- torchrun arguments ----------------------------------------------------------------------


def run_settings(**changes):
    base = dict(nnodes=1, node_rank=0, rdzv_endpoint=None, rdzv_id="qwen3_neuron", max_restarts=0)
    return SimpleNamespace(**{**base, **changes})


def test_one_node_is_standalone(tmp_path):
    assert torchrun_args(run_settings(), 2, tmp_path) == [
        "--standalone", "--nproc_per_node=2",
        f"--log-dir={tmp_path / 'ranks'}", "--tee=3", "--local-ranks-filter=0", "--role=rank",
    ]  # fmt: skip


def test_each_node_of_a_job_meets_at_node_0s_rendezvous(tmp_path):
    settings = dict(nnodes=2, rdzv_endpoint="node0:29500", rdzv_id="job7", max_restarts=3)
    first = torchrun_args(run_settings(node_rank=0, **settings), 64, tmp_path)
    second = torchrun_args(run_settings(node_rank=1, **settings), 64, tmp_path)
    for args in (first, second):
        assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500", "--rdzv-id=job7",
                "--nproc_per_node=64", "--max-restarts=3"} <= set(args)  # fmt: skip
        assert "--standalone" not in args
    assert "--rdzv-conf=is_host=true" in first and "--rdzv-conf=is_host=false" in second
    assert f"--log-dir={tmp_path / 'ranks' / 'node1'}" in second


@pytest.mark.parametrize(
    "changes, expected",
    [
        (dict(nnodes=2), "run.nnodes=2 needs run.rdzv_endpoint"),
        (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "run.node_rank=2 is outside 0..1"),
        (dict(nnodes=2, rdzv_endpoint="node0"), "run.rdzv_endpoint=node0 is not <host>:<port>"),
        (dict(max_restarts=-1), "run.max_restarts must be >= 0"),
        (dict(nnodes=2, rdzv_endpoint="h:1", rdzv_id=""), "run.rdzv_id"),
    ],
)
def test_bad_node_settings_are_named(tmp_path, changes, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        torchrun_args(run_settings(**changes), 2, tmp_path)


def test_run_keys_reach_the_torchrun_command(tmp_path, assets):
    plan = plan_for(
        tmp_path, "run.nnodes=2", "run.node_rank=1", "run.rdzv_endpoint=10.0.0.1:29555", "run.rdzv_id=abc",
        "run.nproc_per_node=1",
    )  # fmt: skip
    assert plan.world_size == 2
    assert "--rdzv-endpoint=10.0.0.1:29555" in launch_of(plan).command and "--node-rank=1" in launch_of(plan).command
    with pytest.raises(ConfigError, match="run.nnodes=2 needs run.rdzv_endpoint"):
        plan_for(tmp_path, "run.nnodes=2")
    # a numeric id (a SLURM job id, or a uuid prefix of digits only), which Hydra reads as an int,
    # or a uuid prefix such as 0e123456, which it reads as the float 0.0
    for text, passed in [("19067173", "19067173"), ("0e123456", "0.0")]:
        numeric = plan_for(tmp_path, "run.nnodes=2", "run.rdzv_endpoint=h:1", f"run.rdzv_id={text}", "run.nproc_per_node=1")  # fmt: skip
        assert f"--rdzv-id={passed}" in launch_of(numeric).command


# ---- integration: every layout trains 10 steps on 2 CPU ranks as one rank does ---------------

# Every run here starts from the same weights (a tiny HF dir, loaded) and trains the same 20 rows in
# the same global batches of 2, in float32, for 10 steps:
# - data.streaming=true: `datasets` splits a one-file stream between data-parallel ranks row by row
#   (rank r reads rows r, r + 2, ...), so a step's two batches of 1 are the rows one rank reads as
#   its batch of 2 (a map-style file is split into contiguous halves: other rows at each step).
# - data.overlong=truncate, data.packing=none: a sample is one row, whichever rank reads it.
# - training.seq_len=256: what CP 2 needs with the BlockMask (cp x 128, conf/parallelism/cp.yaml).
# - float32: one rank runs without FSDP, so in float32; FSDP's bf16 parameters would differ from it
#   by bf16 rounding, whatever the layout. torchtitan's MoE experts compute in bf16 whatever the
#   parameters: the MoE runs take the example's LoopExperts at float32 instead (the factory's keyword
#   argument through torchtitan's override.imports), which takes EP's DTensor weights.
# - MoE: every token to all 8 experts (model.top_k=8). A top-2 choice is not continuous: rounding that
#   breaks a near tie the other way sends a token to another expert, a jump no rounding bound covers
#   (two float32 expert kernels, bit-identical for 4 steps, then 9.3e-5 apart in the loss under
#   ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2). The scores still weigh each expert's output.
#   Sequences of 128 pay for the 4x expert rows in float32 (a launch's CPU seconds as before, or less).
# (A random init would differ too: DTensor's RNG is not sharding-invariant on CPU.)
NUMERICS = ("data=text", "data.streaming=true", "data.overlong=truncate", "data.packing=none", "training.seq_len=256",
            "training.mixed_precision_param=float32", "training.steps=10", "checkpointing=from_hf")  # fmt: skip
STEPS = 10
DENSE, MOE = "experiment=cpu_qwen3_tiny_native", "experiment=cpu_qwen3_tiny_moe"
MOE_NUMERICS = ("kernels=none", "override.imports=[[examples.my_moe.my_experts,{compute_dtype:float32}]]",
                "model.top_k=8", "training.seq_len=128")  # fmt: skip

# How close a layout must come to one rank, from float32's unit roundoff u = 2^-24: all a layout
# changes is the order of float32 sums (a same-config repeat is bit-identical: the MoE test below).
# A float32 sum of n terms rounds by at most (n - 1) u of the magnitudes summed (511 u of the loss,
# 2.4e-4 a step: never approached). To first order its rounding is a sum of n independent roundings
# of mean zero (Higham and Mary's model, SIAM J. Sci. Comput. 2019), each at most u of a partial sum,
# so by Hoeffding's inequality below LAMBDA sqrt(n) u of the magnitudes summed, or LAMBDA sqrt(n / 3) u
# of the total for positive terms (partial sums rising to it), with probability 1 - 2 exp(-LAMBDA^2 / 2):
# 1 - 7e-4 at LAMBDA = 4. Two orders of one sum differ by up to twice that. With T tokens a step (2 x 256
# dense, 2 x 128 MoE):
# - loss: the mean of T token losses, each below LOSS = 8 (7.7 at step 1): 2 LAMBDA sqrt(T / 3) u LOSS
#   at step 1 (5.0e-5 dense, 3.5e-5 MoE). Each later step adds its own: AdamW moves a weight by
#   lr x m / (sqrt(v) + eps), a ratio that keeps the gradients' relative rounding, so the next loss by
#   that fraction of what one update moves it (less than LOSS); s steps' independent roundings add up to
#   2 LAMBDA sqrt(s T / 3) u LOSS (1.6e-4 and 1.1e-4 at step 10).
# - grad norm: the square root of a sum of squares over up to LARGEST = 2048 x 256 entries (the embedding,
#   lm_head, an MoE layer's w1, w2, w3), whole on one rank and in shards on two: LAMBDA sqrt(LARGEST / 3) u
#   apart, relative (1.0e-4), plus the gradients', sums over the T tokens of either sign: 2 LAMBDA
#   sqrt(s T) u (3.4e-5 dense, 2.4e-5 MoE at step 10).
# Measured (AMD EPYC, torch 2.13; the same under ONEDNN_MAX_CPU_ISA=AVX2 or AVX512_CORE, and under
# ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2, which do change float32's roundings): at most
# 9.5e-7 (2 ulps) in the loss and 3.6e-5 in the grad norm. A gradient summed instead of averaged over the
# 2 ranks shows as a grad norm twice one rank's (1.0 relative); torchtitan's bf16 experts in the one-rank
# reference move EP 2's grad norm 1.8e-4 (its loss 7.3e-5, inside the loss's bound).
U, LAMBDA, LOSS, LARGEST = 2.0**-24, 4, 8.0, 2048 * 256


def tolerance(steps: int, tokens: int) -> dict[str, float]:
    """The bound above on |loss - one rank's| and |grad norm / one rank's - 1| after `steps` steps."""
    return dict(
        loss=2 * LAMBDA * math.sqrt(steps * tokens / 3) * U * LOSS,
        grad_norm=LAMBDA * math.sqrt(LARGEST / 3) * U + 2 * LAMBDA * math.sqrt(steps * tokens) * U,
    )


def tokens_per_step(run_dir: Path) -> int:
    """The global batch of 2 rows of the run's seq_len, padding included (torchtitan counts every label)."""
    return 2 * json.loads((run_dir / "trainer_config.json").read_text())["training"]["seq_len"]


def losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_jsonl(run_dir / "metrics.jsonl")]


def numerics_run(run_dir: Path, experiment: str, start: Path, *overrides: str, threads: int | None = None) -> Path:
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None  # kept by the launcher (devices.worker_env)
    result = launch(run_dir, experiment, *NUMERICS, f"checkpoint.initial_load_path={start}", *overrides, timeout=600,
                    env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    return run_dir


SINGLE = ("run.nproc_per_node=1", "training.local_batch_size=2")  # the global batch of 2 on one rank


@pytest.fixture(scope="module")
def dense_one_rank(tmp_path_factory, assets) -> Path:
    return numerics_run(tmp_path_factory.mktemp("dense-one-rank") / "run", DENSE, assets.tiny_qwen3_dir, *SINGLE)


@pytest.fixture(scope="module")
def moe_one_rank(tmp_path_factory, assets) -> Path:
    """float32 experts, every token to all 8 (MOE_NUMERICS). One thread, as each of the two-rank
    runs has (the launcher gives a rank cores // ranks): with two, repeats of this run with
    torchtitan's bf16 experts differed from step 2 on (by up to 1.3e-3 in the loss, an Intel Xeon
    with AVX512-BF16), where one-thread runs repeat bit for bit."""
    run_dir = tmp_path_factory.mktemp("moe-one-rank") / "run"
    return numerics_run(run_dir, MOE, assets.tiny_qwen3_moe_dir, *MOE_NUMERICS, *SINGLE, threads=1)


ONE_RANK = {DENSE: "dense_one_rank", MOE: "moe_one_rank"}  # what each model's layouts compare with


def assert_trains_like(run_dir: Path, reference: Path) -> None:
    """Step for step, the loss and the grad norm (before clipping) of `reference`, within `tolerance`."""
    ran, expected = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    print(f"{run_dir}: {[(r['loss'], r['grad_norm']) for r in ran]}")  # the numbers behind a failure
    assert [r["step"] for r in ran] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    first, every = tolerance(1, tokens_per_step(reference)), tolerance(STEPS, tokens_per_step(reference))
    assert ran[0]["loss"] == pytest.approx(expected[0]["loss"], abs=first["loss"])
    assert ran[0]["grad_norm"] == pytest.approx(expected[0]["grad_norm"], rel=first["grad_norm"])
    assert [r["loss"] for r in ran] == pytest.approx([r["loss"] for r in expected], abs=every["loss"])
    assert [r["grad_norm"] for r in ran] == pytest.approx([r["grad_norm"] for r in expected], rel=every["grad_norm"])
    assert ran[-1]["loss"] < ran[0]["loss"] - 0.3  # it learns


def assert_job_wide_speed(run_dir: Path, ranks: int) -> None:
    """tokens/s is the job's (every rank's tokens; torchtitan logs one device's) and MFU is against
    the peak of all its ranks. Each step's global batch over its logged tokens/s is the step's
    time: summed over steps 2-10 it is the time they took (measured within 0.4% over 15 runs),
    which a wrong rank factor misses by a factor of 2."""
    summary = json.loads((run_dir / "summary.json").read_text())
    peak = json.loads((run_dir / "peak_flops.json").read_text())
    assert summary["ranks"] == peak["ranks"] == ranks
    records = read_jsonl(run_dir / "metrics.jsonl")
    seconds = records[-1]["elapsed_seconds"] - records[0]["elapsed_seconds"]
    step_times = [tokens_per_step(run_dir) / record["tokens_per_second"] for record in records[1:]]
    assert sum(step_times) == pytest.approx(seconds, rel=0.05)
    for record in records:
        assert record["tokens_per_second"] == pytest.approx(record["tps_per_device"] * ranks)
        per_device = record["flops_per_token"] * record["tps_per_device"] / peak["flops_per_second"]
        assert record["mfu"] == pytest.approx(per_device, rel=1e-9)  # torchtitan's per-device MFU
    expected = summary["flops_per_token"] * summary["tokens_per_second"] / (peak["flops_per_second"] * ranks)
    assert summary["mfu"] == pytest.approx(expected, rel=1e-12)


#         layout: model, overrides, the mesh torchtitan builds
LAYOUTS = {
    # the experiment's own layout: FSDP over both ranks, a batch of 1 each
    "fsdp": (DENSE, ["training.local_batch_size=1"], "dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=1"),
    # TP splits the weights and CP the sequence: both ranks read the whole batch of 2
    "tp": (DENSE, ["parallelism=tp", "training.local_batch_size=2", *MODEL_PARALLEL_BACKEND],
           "dp_replicate=1, dp_shard=1, cp=1, tp=2, ep=1"),
    "cp": (DENSE, ["parallelism=cp", "training.local_batch_size=2", *MODEL_PARALLEL_BACKEND],
           "dp_replicate=1, dp_shard=1, cp=2, tp=1, ep=1"),
    # EP 2 borrows FSDP's 2 ranks: each holds 4 of the 8 experts and reads a batch of 1
    "ep": (MOE, [*MOE_NUMERICS, "parallelism=ep", "training.local_batch_size=1", *MODEL_PARALLEL_BACKEND],
           "dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=2"),
}  # fmt: skip


@pytest.mark.numerics
@pytest.mark.integration
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_on_two_ranks_trains_10_steps_like_one_rank(tmp_path, assets, request, layout):
    model, overrides, mesh = LAYOUTS[layout]
    start = assets.tiny_qwen3_moe_dir if model == MOE else assets.tiny_qwen3_dir
    run_dir = numerics_run(tmp_path / "run", model, start, *overrides)
    assert f"Building device mesh with parallelism: pp=1, {mesh}" in (run_dir / "train.log").read_text()
    assert_trains_like(run_dir, request.getfixturevalue(ONE_RANK[model]))
    assert_job_wide_speed(run_dir, ranks=2)


@pytest.mark.integration
def test_the_same_moe_run_again_gives_the_same_losses_bit_for_bit(tmp_path, assets, moe_one_rank):
    """Same config, same seed, one thread: the README's promise, on the MoE (routing, token
    dispatch, the experts' loop)."""
    again = numerics_run(tmp_path / "again", MOE, assets.tiny_qwen3_moe_dir, *MOE_NUMERICS, *SINGLE, threads=1)
    ran, first = read_jsonl(again / "metrics.jsonl"), read_jsonl(moe_one_rank / "metrics.jsonl")
    assert [(r["loss"], r["grad_norm"]) for r in ran] == [(r["loss"], r["grad_norm"]) for r in first]


@pytest.mark.integration
def test_one_rank_reports_its_own_speed(dense_one_rank, moe_one_rank):
    for run_dir in (dense_one_rank, moe_one_rank):
        assert_job_wide_speed(run_dir, ranks=1)


@pytest.fixture(scope="module")
def untied_start(tmp_path_factory, assets) -> Path:
    """The tiny HF Qwen3 as an untied model dir: lm_head a copy of the embedding, so
    model.flavor=tiny_untied starts as the same function as the tied tiny model."""
    from safetensors.torch import load_file, save_file

    source, untied = assets.tiny_qwen3_dir, tmp_path_factory.mktemp("untied") / "tiny_qwen3_untied"
    untied.mkdir()
    for path in source.iterdir():
        if path.suffix != ".safetensors" and path.name != "config.json":
            (untied / path.name).write_bytes(path.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}, indent=2))
    weights = load_file(source / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, untied / "model.safetensors", metadata={"format": "pt"})
    return untied


@pytest.mark.numerics
@pytest.mark.integration
@pytest.mark.skipif(OLD_TORCH_PP, reason=PP_REFUSED)
def test_pp_on_two_ranks_trains_like_one_rank(tmp_path, assets, dense_one_rank, untied_start):
    """Two pipeline stages of 2 layers each, 1F1B over 2 microbatches of 1: the same batch of 2
    and the same weights as one rank, so the same losses at every step."""
    untied = (DENSE, untied_start, "model.flavor=tiny_untied", "training.local_batch_size=2")
    single = numerics_run(tmp_path / "one", *untied, "run.nproc_per_node=1")
    pp = numerics_run(tmp_path / "pp", *untied, "parallelism=pp")
    assert losses(single)[0] == pytest.approx(losses(dense_one_rank)[0], abs=1e-4)  # the tied model's function
    assert_trains_like(pp, single)  # measured on 2.14.1 (5 steps, bf16): losses within 1e-6


# ---- integration: HSDP across two "nodes" on localhost, one job ------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.numerics
@pytest.mark.integration
def test_hsdp_across_two_nodes_forms_one_job_and_trains_10_steps_like_one_rank(tmp_path, assets, dense_one_rank):
    """HSDP 2 x 1 as it is used across nodes: each node's rank holds a whole replica, and the
    gradients are averaged between the nodes. (On 2 ranks, 1 x 2 is FSDP itself, tested above;
    2 x 1 is the layout that adds the replicate dimension.) Two launches on localhost, one rank
    each, meet at node 0's rendezvous and train one job of world size 2."""
    endpoint, job_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    run_dirs = [tmp_path / f"node{rank}" for rank in range(2)]
    # each "node" on cores of its own, as real nodes are: its launcher then gives its one rank
    # those cores' threads (else each rank would take a thread per core of the machine, and two
    # ranks spinning in gloo on too few cores take several times as long)
    cores = sorted(os.sched_getaffinity(0))
    own_cores = [cores[: max(1, len(cores) // 2)], cores[len(cores) // 2 :] or cores]

    def start(rank: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dirs[rank]}", DENSE, *NUMERICS,
             f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}", "parallelism=hsdp",
             "training.local_batch_size=1", "run.nproc_per_node=1", "run.nnodes=2", f"run.node_rank={rank}",
             f"run.rdzv_endpoint={endpoint}", f"run.rdzv_id={job_id}"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, own_cores[rank]),
        )  # fmt: skip

    nodes = [start(0)]
    # node 1 starts once node 0's torchrun runs: the rendezvous orders ranks by (host, pid), so
    # global rank 0 - the one writing metrics - is then node 0's
    deadline = time.time() + 300
    while not (run_dirs[0] / "train.log").exists() and nodes[0].poll() is None and time.time() < deadline:
        time.sleep(0.5)
    nodes.append(start(1))
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]

    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert_trains_like(run_dirs[0], dense_one_rank)
    assert_job_wide_speed(run_dirs[0], ranks=2)
    node0 = losses(run_dirs[0])
    for run_dir in run_dirs:
        log = (run_dir / "train.log").read_text()
        assert "dp_replicate=2, dp_shard=1" in log  # each node's rank joined a mesh of 2
        logged = [float(x) for x in re.findall(r"step:\s+\d+\s+\S*loss:\s+([0-9.]+)", log)]
        assert logged == pytest.approx(node0, abs=5e-5)
    assert not (run_dirs[1] / "summary.json").exists()  # one summary per job: node 0's
