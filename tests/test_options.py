"""Every shipped `experiment=` and group option, as a dry run plans it on the default install:
it plans, or it is refused with the fix (what to download or set). In-process: no launch."""

from __future__ import annotations

import re

import pytest
from conftest import compose_job, plan_of

from qwen3_neuron.devices.torch_capabilities import schedules_take_microbatch_lists
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.launch.hydra_setup import CONF_DIR

TINY_HF = "${assets:tiny_qwen3_dir}"
CHATS = "data.files=${assets:chat_train_file}"
QWEN3_4B = "hf download Qwen/Qwen3-4B-Instruct-2507"
UNTIED = ["model.flavor=tiny_untied"]  # PP splits no tied embeddings: the tiny model untied
PP = UNTIED if schedules_take_microbatch_lists() else (UNTIED, "pipeline_parallel_degree=2 needs torch >= 2.14")

# option -> what else it needs to plan (overrides), or the text of its refusal here, or both:
# (overrides, the refusal that remains with them)
OPTIONS = {
    "checkpointing=export_hf": [],
    "checkpointing=from_hf": [f"checkpoint.initial_load_path={TINY_HF}"],
    "checkpointing=none": [],
    "checkpointing=periodic": [],
    "data=c4": "hf download allenai/c4",
    "data=chat": [],
    "data=mix": [],
    "data=preference": ["model=hf", "finetune=lora", "checkpointing=from_hf"],
    "data=prompts": ["model=hf", "checkpointing=from_hf", "grpo.rewards=[qwen3_neuron.rewards.length_penalty]",
                     "training.local_batch_size=8", "grpo.max_completion_length=64"],
    "data=text": [],
    "data=tiny": [],
    "device=auto": [],
    "device=cpu": [],
    "device=cuda": ["run.nproc_per_node=8"],  # a dry run plans for a device that is not here, and says so
    "device=neuron": [],
    "finetune=full": [],
    "finetune=lora": ["checkpointing=from_hf", f"checkpoint.initial_load_path={TINY_HF}"],
    "kernels=none": [],
    "kernels=blockwise": ["model=moe"],
    "kernels=nki": ["model=moe", "device=neuron"],
    "model=hf": [],
    "model=moe": [],
    "model=native": [],
    "parallelism=auto": [],
    "parallelism=cp": [],
    "parallelism=ep": ["model=moe"],
    "parallelism=fsdp": [],
    "parallelism=hsdp": [],
    "parallelism=pp": PP,
    "parallelism=tp": [],
    "experiment=cpu_qwen3_tiny_hf": [],
    "experiment=cpu_qwen3_tiny_lora": [],
    "experiment=cpu_qwen3_tiny_moe": [],
    "experiment=cpu_qwen3_tiny_native": [],
    "experiment=cpu_qwen3_tiny_sft": [],
    "experiment=cpu_qwen3_tiny_dpo": [],
    "experiment=cpu_qwen3_tiny_preference": [],
    "experiment=cpu_qwen3_tiny_reward_model": [],
    "experiment=cpu_qwen3_tiny_grpo": [],
    "experiment=tool_recipe_sft": [],
    "experiment=tool_recipe_grpo": [f"model.hf_model={TINY_HF}"],  # tool_recipe_sft's export, in the recipe
    "experiment=optuna_lr": [],
    "experiment=trn2_qwen3_4b_hf": QWEN3_4B,
    "experiment=trn2_qwen3_4b_lora": ([CHATS], "checkpoint.initial_load_path=/fsx/models/Qwen3-4B-Instruct-2507"),
    "experiment=trn2_qwen3_4b_native": [],
    "experiment=trn2_qwen3_4b_sft": ([CHATS], QWEN3_4B),
    "experiment=trn2_qwen3_4b_dpo": (["data.files=${assets:preference_train_file}"], QWEN3_4B),
    "experiment=trn2_qwen3_4b_grpo": (["data.files=${assets:preference_train_file}"], QWEN3_4B),
    "experiment=trn2_qwen3_moe_nki": [],
}
GROUPS = ("checkpointing", "data", "device", "finetune", "kernels", "model", "parallelism", "experiment")


def test_every_shipped_option_is_listed_here():
    shipped = {f"{group}={path.stem}" for group in GROUPS for path in (CONF_DIR / group).glob("*.yaml")}
    assert shipped == set(OPTIONS)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_option_dry_runs_on_the_default_install(tmp_path, assets, option):
    needs, refusal = OPTIONS[option], None
    if isinstance(needs, str):
        needs, refusal = [], needs
    elif isinstance(needs, tuple):
        needs, refusal = needs
    job = compose_job(option, *needs, "run.dry_run=true")
    if refusal is None:
        plan_of(job, tmp_path / "run")
        return
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        plan_of(job, tmp_path / "run")
