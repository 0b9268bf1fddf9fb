"""The memory plan at Qwen3's real vocabulary (the tiny body with 151,936 embedding rows, where
the logits decide whether a step fits): the estimate against torch's MemTracker peak of a real
step, and a refusal that names the biggest part."""

from __future__ import annotations

import json

import pytest
from conftest import compose_job, plan_of, trained

from qwen3_neuron.assets.build import build_real_vocab_model
from qwen3_neuron.errors import ConfigError


@pytest.fixture(scope="module")
def real_vocab_dir(assets):
    return build_real_vocab_model(assets.root)


def _real_vocab(model_dir, *overrides):
    return ("model=hf", f"model.hf_model={model_dir}", "checkpointing=[from_hf]", "data=chat", *overrides)


@pytest.mark.integration
def test_the_estimate_is_within_a_tenth_of_a_real_vocabulary_steps_tracked_peak(tmp_path, real_vocab_dir):
    run = trained(tmp_path / "run", *_real_vocab(real_vocab_dir), "training.seq_len=128", "training.local_batch_size=2",
                  "training.steps=2", "lr_scheduler.warmup_steps=1", "run.nproc_per_node=1", "run.measure_memory=true",
                  "validator.enable=false", "metrics.enable_tensorboard=false")  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    record = json.loads((run / "step_memory.json").read_text())
    assert record["step"] == summary["tracked_step"] == 2
    assert sum(record["by_category_gib"].values()) == pytest.approx(record["tracked_peak_gib"], rel=1e-9)
    assert summary["tracked_peak_gib"] == record["tracked_peak_gib"]
    estimate = json.loads((run / "memory_estimate.json").read_text())
    # AdamW's two float32 states of every parameter (42 M, 92 % of them the embedding) were live
    assert record["by_category_gib"]["optimizer"] == pytest.approx(2 * estimate["parameters_gib"], rel=1e-3)
    # at seq_len 128 a loss chunk is 32 tokens: the lm_head's weight-sized gradient buffers are the
    # peak (temporaries: the same bytes at seq_len 128, 256 and 512, measured)
    assert estimate["peak_at"] == "the lm_head's gradient reduce-scatter"
    assert summary["memory_estimate_gib"] == pytest.approx(summary["tracked_peak_gib"], rel=0.10), record


def test_a_plan_refused_at_real_sizes_names_its_biggest_part_first(tmp_path, real_vocab_dir):
    huge = _real_vocab(real_vocab_dir, "training.seq_len=65536", "training.local_batch_size=8")
    parts = plan_of(compose_job(*huge, "run.memory_check=off"), tmp_path / "off").memory.parts()
    biggest = max(parts, key=parts.get)
    with pytest.raises(ConfigError) as refused:
        plan_of(compose_job(*huge), tmp_path / "refused")
    assert f"Biggest: {biggest} {parts[biggest]:.2f} GiB, " in str(refused.value)
