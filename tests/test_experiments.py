"""The recipe's three trainings as named experiments: the trn2.48xlarge ones plan here as dry runs
(no Trainium here), their CPU variants train.

(cpu_qwen3_tiny_native trains in tests/test_parallelism.py, on each dense layout against one rank,
and cpu_qwen3_tiny_moe there with expert parallel; as it is, it is conftest.py's
`moe_experiment_run`, which tests/test_moe_training.py compares torchtitan's experts and a user
kernel with; cpu_qwen3_tiny_hf is tests/test_hf_integration.py's `hf_run`, exported and loaded back.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config, compose_job, launch, launch_of, plan_of

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.checks.layout import resolve_degrees
from qwen3_neuron.launch.hydra_setup import CONF_DIR, experiment_without_plus
from qwen3_neuron.models.flavors import moe_dims
from qwen3_neuron.run_dir import group_replacements

NKI = "qwen3_neuron.kernels.moe.nki.nki_experts"
BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
HAS_TORCH_NEURONX = devices.unavailable_reason("neuron") is None


def dry_run(tmp_path, experiment, *overrides):
    return plan_of(compose_job(f"experiment={experiment}", "run.dry_run=true", *overrides), tmp_path / "run")


def assert_one_trn2_node(plan):
    """64 ranks on one node, Neuron runtime/compiler env, the neuron compile backend."""
    assert (plan.device, launch_of(plan).nproc_per_node, plan.world_size) == ("neuron", 64, 64)
    assert "--standalone" in launch_of(plan).command and "--nproc_per_node=64" in launch_of(plan).command
    assert launch_of(plan).env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert "--logical-nc-config=2" in launch_of(plan).env["NEURON_CC_FLAGS"]
    config = plan.trainer_config
    assert config.compile.enable and config.compile.backend == "neuron"
    degrees = resolve_degrees(config.parallelism, plan.world_size)
    assert (degrees.dp_shard, degrees.tp, degrees.ep, degrees.pp, degrees.cp) == (64, 1, 1, 1, 1)
    if not HAS_TORCH_NEURONX:
        assert any("device=neuron is not here" in note for note in plan.notes)


def test_trn2_qwen3_4b_native_plans_qwen3_4b_in_qwen3_32b_on_64_ranks(tmp_path, assets):
    plan = dry_run(tmp_path, "trn2_qwen3_4b_native")
    assert_one_trn2_node(plan)
    config = plan.trainer_config
    model = config.model_spec.model
    assert (config.model_spec.name, config.model_spec.flavor) == ("qwen3", "4B-Instruct-2507")
    assert (model.dim, len(model.layers), model.vocab_size) == (2560, 36, 151936)
    assert {layer.attention.rope.theta for layer in model.layers} == {5e6}
    assert devices.NEURON_ATTENTION_OVERRIDE in config.override.imports
    assert (config.training.seq_len, config.training.local_batch_size) == (4096, 2)
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_trn2_qwen3_moe_nki_plans_64_experts_nki_dp64(tmp_path, assets):
    plan = dry_run(tmp_path, "trn2_qwen3_moe_nki")
    assert_one_trn2_node(plan)
    config = plan.trainer_config
    dims = moe_dims(config.model_spec.model)
    assert (dims["num_experts"], dims["num_experts_per_tok"]) == (64, 8)
    assert (NKI, {"block_size": 128}) in config.override.imports
    if not HAS_TORCH_NEURONX:  # the NKI factory cannot load here; the plan says so, checks the rest
        assert any("kernels.factories not applied in this dry run" in note and NKI in note for note in plan.notes)
        assert devices.NEURON_ATTENTION_OVERRIDE in group_replacements(plan.replacements)


def test_trn2_qwen3_4b_hf_plans_from_hf_with_export(tmp_path, assets):
    try:
        plan = dry_run(tmp_path, "trn2_qwen3_4b_hf")
    except ConfigError as e:
        # the published weights are not in this machine's HF cache (runs never download): the
        # error names them; plan the same experiment on the tiny HF Qwen3 instead
        assert "Qwen/Qwen3-4B-Instruct-2507" in str(e) and "cache" in str(e)
        plan = dry_run(tmp_path, "trn2_qwen3_4b_hf", f"model.hf_model={assets.tiny_qwen3_dir}")
    assert_one_trn2_node(plan)
    config = plan.trainer_config
    assert config.model_spec.name == "transformers_modeling_backend"
    checkpoint = config.checkpoint
    assert checkpoint.enable and checkpoint.initial_load_in_hf and checkpoint.initial_load_model_only
    assert checkpoint.last_save_in_hf and checkpoint.export_dtype == "bfloat16"


@pytest.mark.skipif(HAS_TORCH_NEURONX, reason="torch-neuronx is installed here")
def test_a_trn2_dry_run_prints_the_torchrun_command_and_starts_nothing(tmp_path, assets):
    run_dir = tmp_path / "run"
    result = launch(run_dir, "experiment=trn2_qwen3_4b_native", "run.dry_run=true", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "[qwen3-neuron] device: neuron, world size 64" in out
    assert "NEURON_LOGICAL_NC_CONFIG=2" in out and "torch.distributed.run --standalone --nproc_per_node=64" in out
    assert "note: device=neuron is not here" in out
    assert "[qwen3-neuron] compile cache: " in out  # TorchNeuron's NEFF cache (tests/test_neuron_plan.py)
    assert "[qwen3-neuron] static shapes for compile.backend=neuron: training batches 2 x 4096 tokens" in out
    command = (run_dir / "command.sh").read_text()
    assert "NEURON_CC_FLAGS=" in command and "TORCH_NEURONX_NEFF_CACHE_DIR=" in command
    assert not (run_dir / "train.log").exists()


def test_every_named_experiment_composes(assets):
    """Every file in conf/experiment/: trn2_* plans the trn2 node, cpu_* is a CI-sized CPU run,
    tool_recipe_* a recipe's CPU steps."""
    names = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
    assert {"trn2_qwen3_moe_nki", "cpu_qwen3_tiny_native", "optuna_lr"} <= set(names)
    for name in names:
        composed = compose_config(f"experiment={name}")
        if name.startswith("trn2_"):
            assert composed["device"]["type"] == "neuron"
        elif name.startswith("cpu_"):
            assert composed["device"]["type"] == "cpu" and composed["run"]["nproc_per_node"] == 2
            training = composed["training"]
            # seconds of training: at most 8192 tokens a rank (the DPO one needs 32 steps to learn its reply)
            assert training["steps"] * training["seq_len"] * training["local_batch_size"] <= 8192, name
        elif name.startswith("tool_recipe_"):  # minutes of training: tests/test_recipes.py runs them
            assert composed["device"]["type"] == "cpu" and composed["run"]["nproc_per_node"] == 2
        else:  # a search over the default job (tests/test_sweeps.py runs one)
            assert name == "optuna_lr" and composed["device"]["type"] == "auto"


# ---- the CPU variants train ------------------------------------------------------------------


@pytest.mark.integration
def test_cpu_qwen3_tiny_moe_trains_with_the_blockwise_kernel(moe_experiment_run):
    summary = json.loads((moe_experiment_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 5
    assert summary["final_loss"] < summary["first_loss"] - 0.3
    assert len(summary["overrides"][BLOCKWISE]) == 2  # both MoE layers' experts


def test_an_experiments_values_beat_the_defaults_and_the_command_line_beats_both(assets):
    defaults = compose_config()
    experiment = compose_config("experiment=cpu_qwen3_tiny_native")
    overridden = compose_config("experiment=cpu_qwen3_tiny_native", "training.steps=3")
    assert defaults["training"]["steps"] == 30  # conf/config.yaml
    assert experiment["training"]["steps"] == 5  # conf/experiment/cpu_qwen3_tiny_native.yaml
    assert overridden["training"]["steps"] == 3
    assert experiment["run"]["nproc_per_node"] == overridden["run"]["nproc_per_node"] == 2


def test_the_plus_form_of_experiment_still_selects_it():
    argv = ["launch.py", "+experiment=cpu_qwen3_tiny_native", "+x=1", "training.steps=3"]
    assert experiment_without_plus(argv) == ["launch.py", "experiment=cpu_qwen3_tiny_native", "+x=1", "training.steps=3"]


def test_trn2_qwen3_4b_sft_plans_chat_sft_with_validation_on_64_ranks(tmp_path, assets):
    # 6 x the bundled conversations: data.val_fraction=0.02 carves at least one row for each of 64 ranks
    chats = tmp_path / "chats.jsonl"
    chats.write_text(Path(assets.chat_train_file).read_text() * 6)
    files = f"data.files={chats}"
    try:
        plan = dry_run(tmp_path, "trn2_qwen3_4b_sft", files)
    except ConfigError as e:  # the published weights are not in this machine's HF cache
        assert "Qwen/Qwen3-4B-Instruct-2507" in str(e) and "cache" in str(e)
        plan = dry_run(tmp_path, "trn2_qwen3_4b_sft", files, f"model.hf_model={assets.tiny_qwen3_dir}")
    assert_one_trn2_node(plan)
    config = plan.trainer_config
    [source] = config.dataloader.sources
    assert (source.format, source.files, source.val_fraction, source.train_on_prompt) == (
        "chat", str(chats), 0.02, False)  # fmt: skip
    assert config.validator.enable and config.validator.dataloader.role == "validation"
    assert config.hf_assets_path == plan.job.composed["model"]["hf_model"]  # the model dir's own tokenizer
    assert config.checkpoint.initial_load_in_hf and config.checkpoint.last_save_in_hf


def test_trn2_qwen3_4b_grpo_plans_lora_grpo_with_held_out_prompts_and_one_generation_shape(tmp_path, assets):
    rows = tmp_path / "math.jsonl"
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                                        "answer": str(2 * i)}) + "\n" for i in range(3200)))  # fmt: skip
    files = f"data.files={rows}"
    try:
        plan = dry_run(tmp_path, "trn2_qwen3_4b_grpo", files)
    except ConfigError as e:  # the published weights are not in this machine's HF cache
        assert "Qwen/Qwen3-4B-Instruct-2507" in str(e) and "cache" in str(e)
        plan = dry_run(tmp_path, "trn2_qwen3_4b_grpo", files, f"model.hf_model={assets.tiny_qwen3_dir}")
    assert_one_trn2_node(plan)
    config = plan.trainer_config
    [source] = config.dataloader.sources
    assert (source.format, source.val_fraction) == ("prompts", 0.02) and config.validator.enable
    assert plan.job.settings.finetune.method == "lora" and plan.job.settings.grpo.num_generations == 8
    assert config.training.local_batch_size % plan.job.settings.grpo.num_generations == 0  # whole groups per rank
    assert ("GRPO's generation on a static KV cache of 8 x 2048 positions per layer, without gradients: the prompts' "
            "forward (8 x 128, 8 x 256, 8 x 512, 8 x 1024, 8 x 2048: the narrowest that holds the batch's longest "
            "prompt) and each new token's (8 x 1), 6 more graphs, each compiled once") in plan.static_shapes
    assert config.checkpoint.initial_load_in_hf and config.checkpoint.last_save_in_hf


def test_trn2_qwen3_4b_sft_without_data_files_names_the_key(tmp_path, assets):
    with pytest.raises(ConfigError, match=r"data: set exactly one of files or hf_dataset \(got neither; e.g. data.files="):
        dry_run(tmp_path, "trn2_qwen3_4b_sft", f"model.hf_model={assets.tiny_qwen3_dir}")


def test_cpu_qwen3_tiny_sft_plans_the_same_flow_on_2_cpu_ranks(tmp_path, assets):
    plan = plan_of(compose_job("experiment=cpu_qwen3_tiny_sft"), tmp_path / "run")
    assert (plan.device, plan.world_size) == ("cpu", 2)
    config = plan.trainer_config
    assert config.dataloader.sources[0].format == "chat" and config.validator.enable
    assert config.training.steps <= 5 and config.model_spec.name == "transformers_modeling_backend"
