"""The memory estimate per rank (qwen3_neuron.job.checks.memory): its static parts against the local
sizes of a really built and sharded model, the fit check, and a trained run's measurement."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from conftest import compose_job, plan_of
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from qwen3_neuron.job.checks.memory import GIB, meta_model
from qwen3_neuron.worker.tensor_memory import MEASURED_STEPS, measure_training


def _local_bytes(tensors) -> int:
    storages = {}
    for tensor in tensors:
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())


def _built_static_gib(config, world_size: int) -> dict[str, float]:
    """Rank 0 of `world_size` ranks: the model torchtitan's way (meta build), FSDP2 per block and
    at the root as torchtitan applies it, over a fake process group (no processes: collectives do
    nothing, shards are real); a gradient per parameter; torchtitan's optimizer stepped once."""
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        model = meta_model(config)
        mesh = init_device_mesh("cpu", (world_size,))
        for block in model.layers.values() if hasattr(model, "layers") else model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        parameters = list(model.parameters())
        for parameter in parameters:
            parameter.grad = torch.zeros_like(parameter)
        optimizers = config.optimizer.build(model_parts=[model])
        optimizers.step()
        states = [
            value for optimizer in optimizers.optimizers for state in optimizer.state.values()
            for value in state.values()
        ]  # fmt: skip
        return {
            "parameters_gib": _local_bytes(parameters) / GIB,
            "gradients_gib": _local_bytes([p.grad for p in parameters]) / GIB,
            "optimizer_gib": _local_bytes(states) / GIB,
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "overrides, ranks",
    [(["model.flavor=tiny"], 1), (["model.flavor=tiny"], 2), (["model=moe"], 2), (["model=hf"], 2)],
    ids=["native-1-rank", "native-2-ranks", "moe-2-ranks", "hf-2-ranks"],
)
def test_static_parts_equal_the_local_sizes_of_a_sharded_model(tmp_path, assets, overrides, ranks):
    plan = plan_of(compose_job(*overrides, f"run.nproc_per_node={ranks}"), tmp_path / "run")
    estimate = plan.memory.to_json()
    built = _built_static_gib(plan.trainer_config, ranks)
    for part, gib in built.items():
        assert estimate[part] == pytest.approx(gib, rel=1e-9), part


def test_a_plan_that_does_not_fit_warns_with_memory_check_warn(tmp_path, assets, capsys):
    plan = plan_of(compose_job("model.flavor=32B", "run.memory_check=warn"), tmp_path / "run")
    memory = plan.memory
    assert memory.per_rank_gib > memory.device_gib
    # 32B parameters in float32, sharded over 2 ranks: 4 bytes each for weights and gradients, 8
    # for AdamW's two states
    assert memory.parameters_gib == pytest.approx(32.76e9 * 4 / 2 / GIB, rel=0.01)
    assert memory.optimizer_gib == pytest.approx(2 * memory.parameters_gib, rel=1e-6)
    warning = capsys.readouterr().err
    assert "warning: the plan does not fit" in warning and f"{memory.per_rank_gib:.2f} GiB" in warning


def test_a_trn2_dry_run_estimates_against_a_logical_neuroncore(tmp_path, assets):
    plan = plan_of(compose_job("experiment=trn2_qwen3_4b_native", "run.dry_run=true"), tmp_path / "run")
    memory = plan.memory
    assert (memory.device, memory.device_gib, plan.world_size) == ("neuron", 24.0, 64)
    assert 1 < memory.per_rank_gib < 24  # 4B over 64 FSDP ranks with full activation checkpointing
    assert memory.recompute_gib > 0 and "of 24.0 GiB (neuron)" in memory.line()


@pytest.mark.integration
def test_the_estimate_is_within_a_quarter_of_what_the_default_run_measured(default_run):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["tensor_memory_gib"] > 0
    assert summary["tensor_memory_gib"] == pytest.approx(summary["memory_estimate_gib"], rel=0.25)


def test_planning_model_hf_leaves_transformers_weight_init_as_it_was(tmp_path, assets):
    # the estimate builds the model through torchtitan's backend, which patches Transformers'
    # init process-wide; local rank 0 plans, then builds, and global rank 0 loads Transformers models
    # of its own (the export check)
    from transformers import PreTrainedModel
    from transformers.models.qwen3 import modeling_qwen3

    before = (PreTrainedModel.__dict__["_init_weights"], modeling_qwen3.Qwen3DecoderLayer.__dict__["__init__"])
    plan_of(compose_job("model=hf", "run.dry_run=true"), tmp_path / "run")
    after = (PreTrainedModel.__dict__["_init_weights"], modeling_qwen3.Qwen3DecoderLayer.__dict__["__init__"])
    assert after == before


def test_saved_tensors_are_counted_in_the_first_steps_only_and_later_steps_run_unhooked():
    class Trainer:
        device = torch.device("cpu")

        def forward_backward_step(self, x):
            return (x.exp() * 2).sum()  # exp saves its output for backward: 4 x 1024 floats

    trainer = Trainer()
    meter = measure_training(trainer)
    x = torch.ones(4, 1024, requires_grad=True)
    for _ in range(MEASURED_STEPS):
        assert trainer.forward_backward_step.__name__ == "measured_step"
        trainer.forward_backward_step(x).backward()
    assert meter.peak_bytes == 4 * 1024 * 4
    assert trainer.forward_backward_step.__name__ == "forward_backward_step"  # torchtitan's own again
    meter.peak_bytes = 0
    trainer.forward_backward_step(x).backward()
    assert meter.peak_bytes == 0  # not measured any more


# ---- the estimate's terms, each held by the arithmetic of the shapes it counts ------------------


def _estimate(tmp_path, *overrides: str, logprobs: bool):
    """The estimate of a planned job's trainer config, as the SFT loss (cross-entropy) or as
    DPO's / GRPO's per-token log-probabilities (`logprobs`)."""
    from qwen3_neuron.job.checks.memory import estimate_memory

    plan = plan_of(compose_job(*overrides), tmp_path / "run")
    config, ranks = plan.trainer_config, plan.world_size
    return config, estimate_memory(config, ranks, "cpu", ranks, meta_model(config), logprobs=logprobs)


def test_a_cpu_rank_is_credited_with_its_share_of_the_nodes_memory(tmp_path, assets):
    import os

    node = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    for ranks in (1, 2):
        memory = plan_of(compose_job("model.flavor=tiny", f"run.nproc_per_node={ranks}"), tmp_path / f"{ranks}").memory
        assert memory.ranks_per_node == ranks and memory.device_gib == pytest.approx(node / ranks, rel=1e-12)


def test_the_log_probability_path_counts_its_own_copies_of_a_loss_chunks_logits(tmp_path, assets):
    """One rank, no FSDP: the lm_head's and the loss's working memory is the loss chunk's alone."""
    from qwen3_neuron.job.checks.memory import FLOAT32, LOGPROB_LOGIT_COPIES, LOSS_LOGIT_COPIES

    overrides = ("model.flavor=tiny", "run.nproc_per_node=1")
    config, cross_entropy = _estimate(tmp_path, *overrides, logprobs=False)
    _, logprobs = _estimate(tmp_path, *overrides, logprobs=True)
    assert LOGPROB_LOGIT_COPIES < LOSS_LOGIT_COPIES
    chunk = config.training.local_batch_size * config.training.seq_len // config.loss.num_chunks
    extra = (LOSS_LOGIT_COPIES - LOGPROB_LOGIT_COPIES) * chunk * config.model_spec.model.vocab_size * FLOAT32
    assert (cross_entropy.logits_gib - logprobs.logits_gib) * GIB == pytest.approx(extra, rel=1e-9)


def test_log_probabilities_hold_no_activations_at_the_lm_heads_gradient_reduce(tmp_path, assets):
    """FSDP over 2 ranks, short sequences: the trained lm_head's gradient reduce is the peak. The
    SFT loss's step still holds the activations then; the log-probability path's (DPO, GRPO) none."""
    from qwen3_neuron.job.checks.memory import REDUCE_SCATTER

    overrides = ("model.flavor=tiny", "run.nproc_per_node=2", "training.seq_len=16", "training.local_batch_size=1")
    _, cross_entropy = _estimate(tmp_path, *overrides, logprobs=False)
    _, logprobs = _estimate(tmp_path, *overrides, logprobs=True)
    for memory, held in ((cross_entropy, cross_entropy.activations_gib), (logprobs, 0.0)):
        assert memory.peak_at == REDUCE_SCATTER and memory.activations_gib > 0
        static = memory.parameters_gib + memory.optimizer_gib + memory.gradients_gib
        assert memory.per_rank_gib == pytest.approx(static + memory.logits_gib + held, rel=1e-12)


def test_a_lora_runs_reference_is_its_adapters_turned_off_not_a_copy(tmp_path, assets):
    full = plan_of(compose_job("experiment=cpu_qwen3_tiny_dpo", "finetune=full"), tmp_path / "full").memory
    lora = plan_of(compose_job("experiment=cpu_qwen3_tiny_dpo"), tmp_path / "lora").memory  # finetune=lora
    assert full.reference_gib == full.parameters_gib > 0
    assert lora.reference_gib == 0 and lora.parameters_gib > 0


def test_grpos_generation_counts_every_parameter_fsdp_gathers(tmp_path, assets):
    """Generation gathers every parameter once for all its forwards (FSDP's unshard), in the
    compute dtype: the plan's generation moment holds them beside the KV cache, one block's
    forward and the next tokens' scores."""
    from types import SimpleNamespace

    from qwen3_neuron.job.checks.memory import DTYPE_BYTES, GIB, GrpoMemory, _grpo_bytes, _shape

    plan = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo"), tmp_path / "run")  # 2 ranks, FSDP
    config = plan.trainer_config
    degrees = SimpleNamespace(pp=1, tp=1, cp=1, dp_shard=2)
    grpo = GrpoMemory(static_cache=False, completions=8, kept_logprobs=0)
    ungathered = _grpo_bytes(config, _shape(config, plan.job.model_dir), degrees, "cpu", grpo, gathered=0)[0]
    gathered = plan.parameters["total_parameters"] * DTYPE_BYTES[config.training.mixed_precision_param]
    assert plan.memory.generation_gib * GIB - ungathered == gathered
