"""What the workers record they ran (worker/what_ran.py) and how summary.json reports it: an
override that put none of its modules in a worker's model shows no modules there, whatever the
plan said. (The runs that write these records: tests/test_moe_training.py, test_training.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torchtitan.models.common.moe import GroupedExperts

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.kernels.moe.blockwise import blockwise_experts
from qwen3_neuron.report.summary import summarize, summary_lines
from qwen3_neuron.run_dir import write_what_ran
from qwen3_neuron.worker.what_ran import attention_classes, check_overrides_replaced, replaced_modules

BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
MY_EXPERTS = "examples.my_moe.my_experts"


def test_an_override_is_credited_with_the_modules_of_its_own_classes_only():
    config = GroupedExperts.Config(dim=16, hidden_dim=16, num_experts=2)
    model = torch.nn.ModuleDict({"swapped": blockwise_experts(config).build(), "kept": config.build()})
    record = replaced_modules(list(model.named_modules()), [BLOCKWISE, (MY_EXPERTS, {"compute_dtype": "float32"})])
    assert record == {
        BLOCKWISE: {"swapped": "qwen3_neuron.kernels.moe.blockwise.BlockwiseGroupedExperts"},
        MY_EXPERTS: {},  # configured, but none of its modules is in this model
    }


def test_a_users_override_that_replaced_no_module_stops_the_run_before_the_first_step():
    config = GroupedExperts.Config(dim=16, hidden_dim=16, num_experts=2)
    trainer = SimpleNamespace(model_parts=[torch.nn.ModuleDict({"experts": blockwise_experts(config).build()})])
    check_overrides_replaced(trainer, [BLOCKWISE])  # its classes are in the model
    with pytest.raises(ConfigError) as error:
        check_overrides_replaced(trainer, [BLOCKWISE, MY_EXPERTS])
    assert str(error.value) == (
        "kernels.overrides: 'examples.my_moe.my_experts' replaced nothing: no module of the built model is of a "
        "class defined in examples.my_moe (where its @override's classes live). Check what its factory returns; "
        "for an override meant for other models, set kernels.allow_unused=true."
    )


def test_attention_is_read_from_each_layers_inner_attention():
    layer = torch.nn.Module()
    layer.inner_attention = torch.nn.Identity()
    model = torch.nn.ModuleDict({"0": layer})
    assert attention_classes(list(model.named_modules())) == {"0.inner_attention": "torch.nn.modules.linear.Identity"}


def test_the_summary_joins_every_ranks_record(tmp_path):
    """Pipeline stages hold different layers: the modules of all ranks; compile figures: the most
    of any rank, and how many ranks captured a graph."""
    experts = "qwen3_neuron.kernels.moe.blockwise.BlockwiseGroupedExperts"
    sdpa = "qwen3_neuron.kernels.attention.sdpa.SDPAFlexAttention"
    for rank, graphs, seconds in ((0, 2, 4.0), (1, 0, 1.5)):
        write_what_ran(tmp_path, rank, {
            "overrides": {BLOCKWISE: {f"layers.{rank}.moe.routed_experts.inner_experts": experts}, MY_EXPERTS: {}},
            "attention": {f"layers.{rank}.attention.inner_attention": sdpa},
            "compiled": {"backend": "aot_eager", "graphs": graphs, "frames_compiled": 2 * graphs, "recompiles": rank,
                         "recompile_reasons": ["a guard"] * rank, "compile_seconds": seconds},
        })  # fmt: skip
    summary = summarize(tmp_path, "completed", 1.0)
    assert summary["overrides"] == {
        BLOCKWISE: {f"layers.{r}.moe.routed_experts.inner_experts": experts for r in (0, 1)},
        MY_EXPERTS: {},
    }
    assert summary["attention"] == {sdpa: 2}
    assert summary["compiled"] == {
        "backend": "aot_eager", "graphs": 2, "frames_compiled": 4, "recompiles": 1, "compile_seconds": 4.0,
        "recompile_reasons": ["a guard"], "ranks_with_graphs": 1,
    }  # fmt: skip
    json.dumps(summary)  # summary.json takes it as it is
    assert "compiled (aot_eager): 2 graph(s) on 1 rank(s), 1 recompile(s), 4.0 s compiling" in summary_lines(summary)


def test_no_record_no_claim(tmp_path):
    summary = summarize(tmp_path, "failed", 1.0)
    assert (summary["overrides"], summary["attention"], summary["compiled"]) == (None, None, None)
