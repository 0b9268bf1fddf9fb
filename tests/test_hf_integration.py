"""Integration: model=hf and HF safetensors in and out, through `launch.py`.

model=hf trains on two CPU ranks: FSDP-sharded weights gathered into the export (a native model's
sharded export is tests/test_lora.py's merged one); the native run exported here takes one. The
tiny HF dirs hold untrained weights (first loss about ln(2048) = 7.62, the same as a random
init), so the round trips start from models trained here for 10 steps at lr 3e-3, which a new run
starts about 1.5 nats lower. Runs that only need the first loss of loaded weights take one rank
and one step (start-up dominates their time).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY, compose_job, launch, plan_of, read_jsonl
from safetensors.torch import load_file

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.run_dir import read_job

pytestmark = pytest.mark.integration

LN_VOCAB = math.log(2048)
TRAIN = [*TINY, "training.steps=10", "optimizer.lr=3e-3", "lr_scheduler.warmup_steps=2"]
FIRST_LOSS_ONLY = [*TINY, "training.steps=1", "run.nproc_per_node=1", "lr_scheduler.warmup_steps=1"]


def run(run_dir: Path, *overrides: str, ok: bool = True) -> dict:
    result = launch(run_dir, *overrides)
    if ok:
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary, "output": result.stdout + result.stderr, "returncode": result.returncode}


def first_loss_loading(run_dir: Path, kind: str, hf_dir: Path) -> dict:
    """One step of `kind` starting from the HF weights in `hf_dir` (fails if they did not load)."""
    source = f"model.hf_model={hf_dir}" if kind == "hf" else f"checkpoint.initial_load_path={hf_dir}"
    return run(run_dir, f"model={kind}", source, "checkpointing=from_hf", "hf.first_loss_check=fail", *FIRST_LOSS_ONLY)


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(path))
    return out


# experiment=cpu_qwen3_tiny_hf (model=hf from the tiny HF dir, checkpointing=[from_hf,export_hf],
# FSDP on 2 ranks) trained for TRAIN's 10 steps: the experiment's own CPU run, and these tests'.
HF_EXPERIMENT = ["experiment=cpu_qwen3_tiny_hf", *TRAIN]


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, assets):
    """Tiny model=hf from its HF weights, 10 steps on 2 ranks, exported."""
    run_dir = tmp_path_factory.mktemp("hf") / "run"
    return run_dir, run(run_dir, *HF_EXPERIMENT, "hf.first_loss_check=off")


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory, assets):
    """hf_run again, saving torchtitan's own DCP model state at the last step instead of HF, and
    failing the first-loss check: the tiny dir's weights are untrained."""
    run_dir = tmp_path_factory.mktemp("twin") / "run"
    summary = run(
        run_dir, *HF_EXPERIMENT, "checkpointing=[from_hf,periodic]", "checkpoint.interval=10",
        "checkpoint.last_save_model_only=true", "checkpoint.export_dtype=float32", "hf.first_loss_check=fail",
        ok=False,
    )  # fmt: skip
    return run_dir, summary


@pytest.fixture(scope="module")
def native_run(tmp_path_factory, assets):
    """Tiny native model from random init, 10 steps on 1 rank, exported."""
    run_dir = tmp_path_factory.mktemp("native") / "run"
    return run_dir, run(run_dir, "model=native", "checkpointing=export_hf", *TRAIN, "run.nproc_per_node=1")


def test_hf_run_trains_on_two_ranks_and_exports(hf_run, assets):
    run_dir, summary = hf_run
    assert summary["status"] == "completed" and summary["steps"] == 10
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, 11))
    assert "--nproc_per_node=2" in (run_dir / "command.sh").read_text()
    assert read_job(run_dir)["model"]["hf_model"] == str(assets.tiny_qwen3_dir)  # the experiment's model dir
    assert summary["export_dir"] == str(run_dir / "hf_export")
    assert summary["first_loss"] == pytest.approx(LN_VOCAB, abs=0.15)  # the tiny dir is untrained
    assert summary["random_init_loss_reference"] == pytest.approx(LN_VOCAB, abs=1e-4)
    assert summary["final_loss"] < summary["first_loss"] - 1.0
    assert summary["first_loss_check"] == "off"
    # what the workers ran: Transformers' attention, routed to SDPA on CPU in each of the 4 layers
    assert summary["attention"] == {"qwen3_neuron.kernels.attention.sdpa.hf_sdpa_attention_forward": 4}
    assert sorted(p.name for p in (run_dir / "hf_export").iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert not (run_dir / "checkpoint").exists()  # the raw HF save was consumed


def test_export_opens_with_from_pretrained_and_verify_passes(hf_run, assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export_dir = hf_run[0] / "hf_export"
    model = AutoModelForCausalLM.from_pretrained(export_dir)
    source = json.loads((assets.tiny_qwen3_dir / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "head_dim", "intermediate_size", "tie_word_embeddings"):
        assert getattr(model.config, key) == source[key]
    assert model.config.max_position_embeddings == source["max_position_embeddings"]  # not seq_len
    assert AutoTokenizer.from_pretrained(export_dir).eos_token == "<|endoftext|>"
    verify = subprocess.run(
        [sys.executable, "-m", "qwen3_neuron.hf_io.verify", str(export_dir)], cwd=REPO, capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "missing keys (0)" in verify.stdout and "unexpected keys (0)" in verify.stdout


def test_exported_tensors_equal_the_trained_ones(hf_run, twin_run, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    twin_dir, _ = twin_run
    assert [r["loss"] for r in read_jsonl(twin_dir / "metrics.jsonl")] == [
        r["loss"] for r in read_jsonl(hf_run[0] / "metrics.jsonl")
    ]  # same seed, same steps: the same model
    dcp_to_torch_save(twin_dir / "checkpoint" / "step-10", tmp_path / "trained.pt")
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    exported = weights(hf_run[0] / "hf_export")
    for key, value in exported.items():
        assert torch.equal(value, trained["model." + key]), key  # torchtitan's FQN: model.<HF name>
    assert set(trained) - {"model." + key for key in exported} == {"model.lm_head.weight"}  # tied


def test_untrained_initial_weights_fail_the_first_loss_check(twin_run):
    _, summary = twin_run
    assert summary["returncode"] == 1 and summary["status"] == "failed"
    assert "INITIAL WEIGHTS PROBABLY NOT LOADED" in summary["output"]
    assert summary["first_loss_check"] == "weights_probably_not_loaded"
    assert summary["first_loss"] > summary["random_init_loss_reference"] - 1.0


def test_hf_export_round_trips_into_native(hf_run, tmp_path):
    """The other backend's from_hf load of an export starts at the trained loss. (Each backend's
    load of an HF dir is every from_hf run's; both backends computing the same logits from one
    dir is tests/test_hf.py's.)"""
    run_dir, trained = hf_run
    as_native = first_loss_loading(tmp_path / "native", "native", run_dir / "hf_export")
    assert as_native["first_loss_check"] == "ok"
    # trained weights: far below the untrained start of the same architecture, near the last loss
    assert as_native["first_loss"] < trained["first_loss"] - 1.0
    assert abs(as_native["first_loss"] - trained["final_loss"]) < 1.0


def test_native_export_round_trips_into_hf(native_run, tmp_path):
    run_dir, trained = native_run
    assert trained["export_dir"] == str(run_dir / "hf_export")
    assert trained["first_loss_check"] == "no_initial_weights"
    as_hf = first_loss_loading(tmp_path / "hf", "hf", run_dir / "hf_export")
    assert as_hf["first_loss_check"] == "ok"
    assert as_hf["first_loss"] < trained["first_loss"] - 1.0  # trained["first_loss"]: random init
    assert abs(as_hf["first_loss"] - trained["final_loss"]) < 1.0


def test_a_missing_hf_config_stops_the_launch_naming_file_and_key(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = launch(tmp_path / "run", "model=hf", f"model.hf_model={empty}")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"model.hf_model={empty}: no config.json" in result.stderr
    assert not (tmp_path / "run").exists()  # nothing written, nothing started


def test_an_hf_dir_of_another_architecture_is_refused_at_plan_time(tmp_path, assets):
    """The plan's check (local rank 0's in a launch, which then stops every worker: the
    training.steps=0 row of tests/test_bad_inputs.py)."""
    moe = assets.tiny_qwen3_moe_dir
    overrides = ("model=native", "checkpointing=from_hf", f"checkpoint.initial_load_path={moe}")
    with pytest.raises(ConfigError) as error:
        plan_of(compose_job(*overrides), tmp_path / "run")
    expected = f"checkpoint.initial_load_path={moe}: {moe}/config.json does not describe the native flavour"
    assert expected in str(error.value)
    assert not (tmp_path / "run").exists()
