"""model=moe and the kernels group at plan time: no process is started here."""

from __future__ import annotations

from conftest import compose_job, plan_of

from qwen3_neuron.models.flavors import moe_dims
from qwen3_neuron.run_dir import group_replacements

BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"


def plan_for(tmp_path, *overrides):
    return plan_of(compose_job(*overrides), tmp_path / "run")


def test_moe_overrides_rebuild_the_experts(tmp_path, assets):
    model = plan_for(tmp_path, "model=moe", "model.num_experts=4", "model.top_k=3", "model.moe_hidden_dim=64")
    dims = moe_dims(model.trainer_config.model_spec.model)
    assert (dims["num_experts"], dims["num_experts_per_tok"], dims["moe_intermediate_size"]) == (4, 3, 64)
    assert dims["hidden_size"] == 256  # the rest stays the flavour's


def test_recipe_moe_has_64_experts_on_torchtitans_debug_shape(tmp_path, assets):
    dims = moe_dims(plan_for(tmp_path, "model=moe", "model.flavor=debugmodel_moe").trainer_config.model_spec.model)
    assert (dims["num_experts"], dims["num_experts_per_tok"]) == (64, 8)


def test_blockwise_replaces_every_experts_node_with_its_block_size(tmp_path, assets):
    plan = plan_for(tmp_path, "model=moe", "kernels=blockwise", "kernels.block_size=32")
    assert (BLOCKWISE, {"block_size": 32}) in plan.trainer_config.override.imports
    replaced = group_replacements(plan.replacements)[BLOCKWISE]
    assert replaced == [
        f"model_spec.model.layers.{i}.moe.routed_experts.inner_experts "
        "GroupedExperts.Config -> BlockwiseGroupedExperts.Config with block_size=32"
        for i in range(2)
    ]


def test_a_users_kernel_goes_through_the_same_flow(tmp_path, assets):
    plan = plan_for(tmp_path, "model=moe", "kernels.overrides=[examples.my_moe.my_experts]")
    assert len(group_replacements(plan.replacements)["examples.my_moe.my_experts"]) == 2
