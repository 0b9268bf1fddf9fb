"""model=moe and the kernels group at plan time: no process is started here."""

from __future__ import annotations

import pytest
from conftest import compose_config, launch

from qwen3_neuron.fields import ConfigError
from qwen3_neuron.flavors import moe_dims
from qwen3_neuron.plan import make_plan

BLOCKWISE = "qwen3_neuron.kernels.blockwise.blockwise_experts"


def plan_for(tmp_path, *overrides):
    return make_plan(compose_config(*overrides), tmp_path / "run")


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
    replaced = plan.replacements_by_override()[BLOCKWISE]
    assert replaced == [
        f"model_spec.model.layers.{i}.moe.routed_experts.inner_experts "
        "GroupedExperts.Config -> BlockwiseGroupedExperts.Config with block_size=32"
        for i in range(2)
    ]


def test_a_users_kernel_goes_through_the_same_flow(tmp_path, assets):
    plan = plan_for(tmp_path, "model=moe", "kernels.overrides=[examples.my_moe.my_experts]")
    assert len(plan.replacements_by_override()["examples.my_moe.my_experts"]) == 2


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model=moe", "kernels=nki"], "kernels=nki needs device neuron"),
        (["model=moe", "kernels.overrides=[no_such_pkg.moe.experts]"], "no_such_pkg.moe.experts"),
        (["model=moe", "kernels.overrides=[qwen3_neuron.metrics.not_an_override]"], "names no registered @override"),
        (["kernels=blockwise"], f"'{BLOCKWISE}' matches no node"),
        (["model=moe", "kernels=blockwise", "kernels.overrides=[examples.my_moe.my_experts]"], "kernels=none"),
        (["model=moe", "model.top_k=9"], "model.top_k=9"),
        (["model=moe", "model.flavor=tiny"], "Valid: 235B-A22B, 30B-A3B, debugmodel_moe, tiny_moe"),
        (["model.num_experts=4"], "model.num_experts applies to model=moe"),
    ],
)
def test_bad_kernel_and_moe_input_fails_at_plan_time(tmp_path, assets, overrides, expected):
    with pytest.raises(ConfigError) as error:
        plan_for(tmp_path, *overrides)
    assert expected in str(error.value)


def test_nki_on_cpu_starts_no_process(tmp_path, assets):
    result = launch(tmp_path / "run", "model=moe", "kernels=nki", timeout=300)
    assert result.returncode == 2 and "kernels=nki needs device neuron" in result.stderr
    assert not (tmp_path / "run").exists()
