"""Build once, check once: the workers rebuild the planned Trainer.Config from the run dir's
job.yaml without the plan's checks. No process is started here."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose_config, compose_job, launch, plan_of

from qwen3_neuron.job.job import Job
from qwen3_neuron.job.record import record_job
from qwen3_neuron.job.trainer_config import build_trainer_config
from qwen3_neuron.run_dir import read_job

_opened: list[str] | None = None  # the files opened while a test records, else None


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, Path)):
        _opened.append(str(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one records only on demand


def cached_hub_snapshot(hub_cache: Path, repo_id: str, source: Path) -> Path:
    """`source` as the HF cache holds a downloaded Hub repo (refs/main -> snapshots/<commit>)."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_workers_rebuild_the_planned_config_without_the_plans_checks(tmp_path, assets, monkeypatch):
    import huggingface_hub
    import transformers

    repo_id = "someone/tiny-qwen3"
    snapshot = cached_hub_snapshot(tmp_path / "hub", repo_id, assets.tiny_qwen3_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    run_dir = tmp_path / "run"
    plan = plan_of(compose_job("experiment=cpu_qwen3_tiny_hf", f"model.hf_model={repo_id}"), run_dir)
    assert not torch.distributed.is_initialized()  # ParallelDims was checked, no process group made
    record_job(run_dir, plan.job, "torchrun")
    job = read_job(run_dir)
    assert job["model"]["hf_model"] == str(snapshot.resolve())  # the Hub id, resolved once, here

    def refuse(*args, **kwargs):
        raise AssertionError("a worker repeated a plan-time check")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    global _opened
    _opened = []
    try:
        config = build_trainer_config(Job.recorded(read_job(run_dir)), run_dir)
    finally:
        opened, _opened = _opened, None
    read_from_model_dir = [Path(p).name for p in opened if p.startswith(str(snapshot.resolve()))]
    assert read_from_model_dir == ["config.json"]  # once; no tokenizer.json, no safetensors index
    planned = json.dumps(plan.trainer_config.to_dict(), default=repr)
    assert json.dumps(config.to_dict(), default=repr) == planned  # the same config on both sides


def test_the_plan_checks_what_the_workers_no_longer_do(tmp_path, assets):
    """The tokenizer check runs at plan time only, so a bad tokenizer still stops the launch."""
    from qwen3_neuron.errors import ConfigError

    model_dir = tmp_path / "small_vocab"
    shutil.copytree(assets.tiny_qwen3_dir, model_dir)
    written = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**written, "vocab_size": 1024}))
    with pytest.raises(ConfigError, match=r"tokenizer.json has token id \d+, but the model's vocab_size is 1024"):
        plan_of(compose_job("experiment=cpu_qwen3_tiny_hf", f"model.hf_model={model_dir}"), tmp_path / "run")


# ---- integration: the worker runs torchtitan's trainer as torchtitan.train.main does ------------


def run(tmp_path, *overrides: str) -> tuple[Path, dict, str]:
    run_dir = tmp_path / "run"
    result = launch(run_dir, "run.nproc_per_node=1", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir, json.loads((run_dir / "summary.json").read_text()), (run_dir / "train.log").read_text()


@pytest.mark.integration
def test_create_seed_checkpoint_saves_step_0_instead_of_training(tmp_path, assets):
    run_dir, summary, log = run(tmp_path, "checkpointing=periodic", "checkpoint.create_seed_checkpoint=true")
    assert "Created seed checkpoint" in log
    assert (run_dir / "checkpoint" / "step-0" / ".metadata").exists()
    assert (summary["status"], summary["steps"]) == ("completed", 0)
    # torchtitan's structured logging is on by default: per-rank JSONL in the run dir
    (trace,) = (run_dir / "structured_logs").glob("training.global_rank_0.*.jsonl")
    events = [json.loads(line)["log_type_name"] for line in trace.read_text().splitlines()]
    assert "structured_logger_started" in events


@pytest.mark.integration
def test_local_tensor_mode_skips_training_as_torchtitan_does(tmp_path, assets):
    run_dir, summary, log = run(tmp_path, "comm.mode=local_tensor", "debug.enable_structured_logging=false")
    assert "Local tensor mode enabled - skipping training execution" in log
    assert (summary["status"], summary["steps"]) == ("completed", 0)
    assert not (run_dir / "checkpoint").exists() and not (run_dir / "structured_logs").exists()


@pytest.mark.parametrize("overrides", [[], ["experiment=cpu_qwen3_tiny_lora"]], ids=["default", "lora"])
def test_a_plan_parses_the_settings_builds_the_config_and_the_meta_model_once(tmp_path, assets, monkeypatch, overrides):
    """What local rank 0 does before it trains (with the plan's job and config, building nothing
    more); every other rank parses and builds once too (`Job.recorded`, `build_trainer_config`)."""
    from collections import Counter

    from qwen3_neuron.job import settings
    from qwen3_neuron.job import plan
    from qwen3_neuron.job import trainer_config as build
    from qwen3_neuron.job.checks import memory

    counts = Counter()

    def count(module, name, when=lambda *args: True):
        original = getattr(module, name)

        def counted(*args, **kwargs):
            counts[name] += when(*args)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    count(settings, "apply_fields", when=lambda node, values, path: path == "model")  # one per parse
    count(build, "base_config")  # one per Trainer.Config built
    count(plan, "meta_model")
    count(memory, "meta_model")
    composed = compose_config(*overrides)
    counts.clear()  # what composing cost is Hydra's
    planned = plan_of(Job.parse(composed), tmp_path / "run")
    # base_config: the one the config is built on, and one whose key names the launcher's key
    # schema is checked against (trainer_keys.schema_disagreement)
    assert counts == {"apply_fields": 1, "base_config": 2, "meta_model": 1}
    record_job(tmp_path / "run", planned.job, "torchrun")
    counts.clear()
    build_trainer_config(Job.recorded(read_job(tmp_path / "run")), tmp_path / "run")  # the other ranks
    assert counts == {"apply_fields": 1, "base_config": 1}
