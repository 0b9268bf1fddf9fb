"""The catalogue of bad inputs: each fails before any worker starts, names the key or file and
what would be valid, and writes nothing. Add a row to extend it."""

from __future__ import annotations

import pytest
from conftest import compose_config, launch

from qwen3_neuron.config.plan import make_plan
from qwen3_neuron.errors import ConfigError

BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
FULL_AC = "torchtitan.distributed.activation_checkpoint.FullAC.Config"

# (overrides, texts the error must contain)
PLAN_TIME = [
    (["training.stpes=3"], ["training.stpes", "'steps'"]),
    (["model.flavr=x"], ["model.flavr", "'flavor'"]),
    (["optimizer.implementaton=foreach"], ["optimizer.implementaton", "'implementation'"]),
    (["training.steps=abc"], ["training.steps", "expected int", "'abc'"]),
    (["training.dtype=fp16"], ["training.dtype", "'bfloat16'", "'float32'"]),
    (["run.dry_run=maybe"], ["run.dry_run", "expected bool"]),
    (["compile.components=model"], ["compile.components", "expected list"]),
    (["training.steps=0"], ["training.steps must be a positive integer, got 0"]),
    (["training.steps=-5"], ["training.steps must be a positive integer, got -5"]),
    (["training.local_batch_size=0"], ["training.local_batch_size must be a positive integer"]),
    (["training.seq_len=0"], ["training.seq_len must be a positive integer"]),
    (["metrics.log_freq=0"], ["metrics.log_freq must be a positive integer"]),
    (["optimizer.lr=-1e-3"], ["optimizer.lr", "must be > 0"]),
    (["parallelism.pipeline_parallel_microbatch_size=0"], ["pipeline_parallel_microbatch_size must be greater than 0"]),
    (["model.flavor=5B"], ["model.flavor=5B", "4B", "tiny"]),
    (["model.config_fn=qwen3_33b"], ["model.config_fn=qwen3_33b", "qwen3_32b"]),
    (["model.module=qwen4"], ["model.module=qwen4", "torchtitan.models.qwen4.config_registry"]),
    (["device=cuda"], ["device.type=cuda", "CUDA"]),
    (["device=neuron"], ["device.type=neuron", "torch-neuronx"]),
    (["parallelism.tensor_parallel_degree=3"], ["parallelism", "world size 2"]),
    (["run.nproc_per_node=0"], ["run.nproc_per_node", ">= 1"]),
    (["+dump_folder=/tmp/elsewhere"], ["dump_folder", "hydra.run.dir"]),
    (["hf_assets_path=/nonexistent/tokenizer"], ["hf_assets_path=/nonexistent/tokenizer", "qwen3_neuron.assets"]),
    (["dataloader.dataset_path=/nonexistent/data"], ["dataloader.dataset_path=/nonexistent/data", "does not exist"]),
    (["+activation_checkpoint._target_=torchtitan.config.configs.TrainingConfig"], ["activation_checkpoint._target_", "FullAC.Config"]),
    (["+activation_checkpoint._target_=no_such_pkg.Thing.Config"], ["activation_checkpoint._target_", "cannot import"]),
    (["model=moe", "kernels=nki"], ["kernels=nki needs device neuron", "kernels=blockwise"]),
    (["model=moe", "kernels.overrides=[no_such_pkg.moe.experts]"], ["no_such_pkg.moe.experts", "could not be imported"]),
    (["model=moe", "kernels.overrides=[qwen3_neuron.worker.metrics.not_an_override]"], ["names no registered @override"]),
    (["kernels=blockwise"], [f"'{BLOCKWISE}' matches no node"]),
    (["model=moe", "kernels=blockwise", "kernels.overrides=[examples.my_moe.my_experts]"], ["both claim node", "kernels=none"]),
    (["model=moe", "model.top_k=9"], ["model.top_k=9", "8 experts"]),
    (["model=moe", "model.num_experts=0"], ["model.num_experts must be >= 1"]),
    (["model=moe", "model.flavor=tiny"], ["model.flavor=tiny", "tiny_moe"]),
    (["model.num_experts=4"], ["model.num_experts applies to model=moe"]),
    (["model.flavor=32B"], ["does not fit", "GiB of", "parameters 61.02", "more FSDP ranks", "run.memory_check=warn"]),
    # torchtitan's own checks (ParallelDims, update_from_config, _validate_cuda_graphs), named
    (["parallelism.context_parallel_degree=0"], ["parallelism.context_parallel_degree=0: must be >= 1"]),
    (["training.seq_len=4096"], ["training.seq_len=4096 is too long for qwen3 tiny", "RoPE maximum", "2048"]),
    (["parallelism=pp", "training.disable_cuda_graphs=false"],
     ["CUDA graphs do not support pipeline parallelism", "training.disable_cuda_graphs"]),
    # finetune=lora (the base-load rows name a from_hf dir so that only the LoRA key is wrong)
    (["finetune=lora", "finetune.target_modules=[q_proj,k_proj,v_proj,qkv_proj]"],
     ["finetune.target_modules: unknown module 'qkv_proj'", "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"]),
    (["finetune=lora", "finetune.rank=0"], ["finetune.rank must be a positive integer, got 0"]),
    (["finetune=lora", "finetune.rank=-4"], ["finetune.rank must be a positive integer, got -4"]),
    (["finetune=lora", "finetune.dropout=0.1"], ["finetune.dropout=0.1", "no dropout", "valid: 0.0"]),
    (["finetune=lora", "finetune.target_modules=[q_proj,o_proj]"],
     ["computes q_proj, k_proj, v_proj with one projection (wqkv)", "all of them or none"]),
    (["finetune=lora", "model=moe", "finetune.target_modules=[gate_proj,up_proj]"],
     ["matches no Linear layer of this model", "q_proj, k_proj, v_proj, o_proj"]),
    (["finetune=lora", "model=hf"], ["finetune=lora supports model=native and model=moe", "checkpointing=from_hf"]),
    (["finetune=lora"], ["finetune=lora freezes the base model, but nothing loads it", "checkpointing=from_hf",
                         "checkpoint.initial_load_path=/abs/hf_dir"]),
    (["finetune=lora", "checkpointing=periodic"], ["nothing loads it"]),
    (["finetune=lora", "finetune.rnak=4"], ["finetune.rnak", "'rank'"]),
    # what torchtitan's train.main would assert once the workers run
    (["checkpointing=periodic", "checkpoint.create_seed_checkpoint=true"],
     ["checkpoint.create_seed_checkpoint=true needs world size 1", "world size 2", "run.nproc_per_node=1"]),
    (["checkpoint.create_seed_checkpoint=true", "run.nproc_per_node=1"],
     ["checkpoint.create_seed_checkpoint=true needs checkpoint.enable=true"]),
]  # fmt: skip


@pytest.mark.parametrize("overrides, expected", PLAN_TIME, ids=[" ".join(o) for o, _ in PLAN_TIME])
def test_bad_input_fails_at_plan_time_naming_the_key(tmp_path, assets, overrides, expected):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        make_plan(compose_config(*overrides), run_dir)
    for text in expected:
        assert text in str(error.value)
    assert not run_dir.exists()


# Caught by Hydra itself while composing, or by the launcher: checked through launch.py.
LAUNCH_TIME = [
    (["model=nativ"], ["model/nativ", "native"]),
    (["device=tpu"], ["device/tpu", "cpu"]),
    (["trainig.steps=3"], ["trainig"]),
    (["training.stpes=3"], ["training.stpes", "'steps'"]),
    (["model=moe", "kernels=nki"], ["kernels=nki needs device neuron"]),
]


@pytest.mark.parametrize("overrides, expected", LAUNCH_TIME, ids=[" ".join(o) for o, _ in LAUNCH_TIME])
def test_bad_input_on_the_command_line_exits_non_zero_and_writes_nothing(tmp_path, assets, overrides, expected):
    run_dir = tmp_path / "run"
    result = launch(run_dir, *overrides, timeout=300)
    assert result.returncode != 0
    for text in expected:
        assert text in result.stderr
    assert not run_dir.exists()
    assert "qwen3_neuron.worker.train" not in result.stdout  # no torchrun command was run
