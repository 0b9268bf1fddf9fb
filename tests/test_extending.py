"""Extending a run (`run.resume=D training.steps=N`), in-process. The learning-rate rule
(qwen3_neuron.worker.lr_schedule) on torchtitan's own scheduler: past the schedule's end the last
step's rate holds, and a loaded checkpoint trains its next step at the schedule's rate, not at the
one its optimizer state was saved with. The resume (launch.resume): the schedule the run was
planned with stays, the rule in one line, and a run that only exported says it cannot go on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config
from omegaconf import OmegaConf
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.user_paths import absolute_paths
from qwen3_neuron.launch.resume import resumed_config, schedule_rule
from qwen3_neuron.worker.lr_schedule import follow_one_schedule

LR, WARMUP, END = 1e-3, 2, 10  # the default job's warmup, a 10-step schedule


def _trainer(checkpoint: dict | None = None):
    """A trainer's optimizer, schedulers and checkpointer: `load` restores `checkpoint` (the
    optimizer state and the schedulers' step count) as torchtitan's does."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=LR)
    schedulers = LRSchedulersContainer.Config(warmup_steps=WARMUP, total_steps=END).build(
        optimizers=[optimizer], training_steps=END
    )

    def load(step=-1):
        if checkpoint is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
            schedulers.load_state_dict(checkpoint["lr_scheduler"])
        return checkpoint is not None

    return SimpleNamespace(optimizer=optimizer, lr_schedulers=schedulers, checkpointer=SimpleNamespace(load=load))


def _rates(trainer, steps: int) -> list[float]:
    """The rate each of the next `steps` steps trains at."""
    rates = []
    for _ in range(steps):
        rates.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.lr_schedulers.step()
    return rates


def test_steps_past_the_schedules_end_train_at_its_last_steps_rate():
    planned = _rates(_trainer(), END)  # torchtitan's schedule, untouched
    ruled = _trainer()
    follow_one_schedule(ruled, END)
    ruled.checkpointer.load()
    rates = _rates(ruled, END + 3)
    assert rates[:END] == planned and rates[END:] == [planned[-1]] * 3
    assert planned[-1] > 0  # torchtitan's own next rate would be 0, then negative


@pytest.mark.parametrize("saved_at", [6, END])
def test_a_loaded_checkpoint_trains_on_at_the_schedules_rate(saved_at):
    """The optimizer state saved at step `saved_at` holds the rate torchtitan computed for the next
    step; a resume of an extended run (schedule held past END) takes the schedule's own."""
    first = _trainer()
    follow_one_schedule(first, END)
    first.checkpointer.load()
    _rates(first, saved_at)
    saved = {"optimizer": first.optimizer.state_dict(), "lr_scheduler": first.lr_schedulers.state_dict()}
    saved["optimizer"]["param_groups"][0]["lr"] = 0.0  # not the schedule's (torchtitan's own gives 0 at END)
    resumed = _trainer(saved)
    follow_one_schedule(resumed, END)
    assert resumed.checkpointer.load()
    uninterrupted = _trainer()
    follow_one_schedule(uninterrupted, END)
    uninterrupted.checkpointer.load()
    assert _rates(resumed, END + 2 - saved_at) == _rates(uninterrupted, END + 2)[saved_at:]


def test_an_extension_keeps_the_schedule_the_run_was_planned_with_and_says_the_rule(tmp_path):
    """run.resume=D training.steps=12 of a 10-step run: its schedule stays planned for 10 steps
    (lr_scheduler.total_steps), whichever checkpoint it loads; the rule in one line."""
    recorded = compose_config("checkpointing=periodic", "training.steps=10")
    OmegaConf.save(OmegaConf.create(recorded), tmp_path / "job.yaml")
    (tmp_path / "trainer_config.json").write_text(json.dumps({"lr_scheduler": {"total_steps": None}}))
    (tmp_path / "checkpoint" / "step-10").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-10" / ".metadata").touch()
    typed = [f"run.resume={tmp_path}", "training.steps=12"]
    resumed = resumed_config(tmp_path, compose_config(*typed), typed)
    assert (resumed["training"]["steps"], resumed["lr_scheduler"]["total_steps"]) == (12, 10)
    assert schedule_rule(10, 12) == (
        "learning rate: steps 1-10 keep the schedule planned for 10 steps; steps 11-12 train at its step-10 rate"
    )
    again = ["run.resume=" + str(tmp_path)]
    assert "total_steps" not in resumed_config(tmp_path, compose_config(*again), again).get("lr_scheduler", {})


def test_a_resume_on_another_number_of_nodes_is_refused(tmp_path):
    """The data position is saved per data-parallel rank: a resume runs on the nodes the run trained
    on (run.nproc_per_node: test_a_resume_keeps_the_recorded_rank_count_and_refuses_another)."""
    OmegaConf.save(OmegaConf.create(compose_config("checkpointing=periodic")), tmp_path / "job.yaml")
    (tmp_path / "trainer_config.json").write_text("{}")
    (tmp_path / "checkpoint" / "step-2").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-2" / ".metadata").touch()
    typed = [f"run.resume={tmp_path}", "run.nnodes=2"]
    with pytest.raises(ConfigError, match="the data position is saved per rank") as refused:
        resumed_config(tmp_path, compose_config(*typed), typed)
    assert "changes 'run.nnodes' (1 -> 2)" in str(refused.value)


def test_extending_a_run_that_only_exported_says_it_cannot_and_why(tmp_path):
    """checkpointing=[from_hf,export_hf] keeps no checkpoint/step-N: nothing to continue from."""
    OmegaConf.save(OmegaConf.create(compose_config("checkpointing=export_hf")), tmp_path / "job.yaml")
    typed = [f"run.resume={tmp_path}", "training.steps=40"]
    with pytest.raises(ConfigError) as refused:
        resumed_config(tmp_path, compose_config(*typed), typed)
    assert str(refused.value) == (
        f"run.resume={tmp_path}: no complete checkpoint in {tmp_path}/checkpoint: nothing to continue from. "
        "Checkpoints are written with checkpointing=periodic (every checkpoint.interval steps). It only "
        "exported its model (checkpointing=export_hf without periodic): the export holds the weights, not the "
        "optimizer, learning-rate schedule or data position a resume continues with. To train on from those "
        "weights: a new run with checkpointing=[from_hf,...] checkpoint.initial_load_path=<its hf_export dir>."
    )


def test_a_resume_keeps_the_recorded_rank_count_and_refuses_another(tmp_path):
    """A run launched with run.nproc_per_node=1 resumes on 1 rank though the resuming command does
    not say it (its data position is saved per rank: on 2, rank 1 would find none); setting
    another rank count is refused. Other run.* settings the command sets are this launch's."""
    OmegaConf.save(OmegaConf.create(compose_config("checkpointing=periodic", "run.nproc_per_node=1",
                                                   "run.memory_check=warn")), tmp_path / "job.yaml")  # fmt: skip
    (tmp_path / "checkpoint" / "step-10").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-10" / ".metadata").touch()
    typed = [f"run.resume={tmp_path}", "run.verbose=true"]
    resumed = resumed_config(tmp_path, compose_config(*typed), typed)["run"]
    assert (resumed["nproc_per_node"], resumed["memory_check"], resumed["verbose"]) == (1, "warn", True)
    assert resumed["resume"] == str(tmp_path)
    typed = [f"run.resume={tmp_path}", "run.nproc_per_node=2"]
    with pytest.raises(ConfigError) as refused:
        resumed_config(tmp_path, compose_config(*typed), typed)
    assert str(refused.value) == (
        "run.resume continues the recorded config, but this command changes 'run.nproc_per_node' (1 -> 2). "
        "Only run.* (not the rank count: the data position is saved per rank), training.steps, "
        "checkpoint.load_step, eval.* and tracking.* may change."
    )


def test_a_checkpoint_cut_while_saving_is_warned_of_unless_checkpoint_load_step_picked_one(tmp_path, capsys):
    """step-4 has no DCP .metadata (kill -9 while saving): the resume says it continues from step-2;
    a resume that names its checkpoint (checkpoint.load_step=2) chose it, and is not warned."""
    OmegaConf.save(OmegaConf.create(compose_config("checkpointing=periodic")), tmp_path / "job.yaml")
    (tmp_path / "checkpoint" / "step-2").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-2" / ".metadata").touch()
    (tmp_path / "checkpoint" / "step-4").mkdir()
    typed = [f"run.resume={tmp_path}"]
    resumed_config(tmp_path, compose_config(*typed), typed)
    assert capsys.readouterr().err == (
        f"[qwen3-neuron] warning: checkpoint {tmp_path}/checkpoint/step-4 was cut while saving (no DCP .metadata, "
        "which is written last: the run was killed or its disk filled while writing it); never loaded. The run "
        "continues from step-2, the newest complete checkpoint.\n"
    )
    typed.append("checkpoint.load_step=2")
    assert resumed_config(tmp_path, compose_config(*typed), typed)["checkpoint"]["load_step"] == 2
    assert capsys.readouterr().err == ""


def test_relative_paths_are_recorded_where_they_were_typed_and_typing_them_again_on_resume_changes_nothing(
    tmp_path, monkeypatch
):
    """Each path the run reads, relative to where the first launch ran, is made absolute there
    (a glob too); a Hub id, a path relative to nothing here and None stay as typed. A resume that
    types data.files again as the first launch did, in its directory, continues the recorded run."""
    first = tmp_path / "first"
    for folder in ("weights", "tasks", "shards"):
        (first / folder).mkdir(parents=True)
    for name in ("chats.jsonl", "val.jsonl", "shards/a.jsonl"):
        (first / name).write_text("{}\n")
    typed = {"data": {"files": "chats.jsonl", "val_files": ["val.jsonl", "gone.jsonl"],
                      "sources": [{"files": "shards/*.jsonl"}, {"files": "none/*.jsonl"}]},
             "model": {"hf_model": "Qwen/Qwen3-0.6B"}, "checkpoint": {"initial_load_path": "weights"},
             "hf_assets_path": "./weights/../weights", "eval": {"include_path": ["tasks"]},
             "dataloader": {"dataset_path": None}}  # fmt: skip
    assert absolute_paths(typed, str(first)) == {
        "data": {"files": f"{first}/chats.jsonl", "val_files": [f"{first}/val.jsonl", "gone.jsonl"],
                 "sources": [{"files": f"{first}/shards/*.jsonl"}, {"files": "none/*.jsonl"}]},
        "model": {"hf_model": "Qwen/Qwen3-0.6B"}, "checkpoint": {"initial_load_path": f"{first}/weights"},
        "hf_assets_path": f"{first}/weights", "eval": {"include_path": [f"{first}/tasks"]},
        "dataloader": {"dataset_path": None},
    }  # fmt: skip
    run = tmp_path / "run"
    recorded = compose_config("data=chat", f"data.files={first}/chats.jsonl", "checkpointing=periodic")
    (run / "checkpoint" / "step-2").mkdir(parents=True)
    (run / "checkpoint" / "step-2" / ".metadata").touch()
    OmegaConf.save(OmegaConf.create(recorded), run / "job.yaml")
    monkeypatch.chdir(first)
    again = [f"run.resume={run}", "data=chat", "data.files=chats.jsonl"]
    assert resumed_config(run, compose_config(*again), again)["data"]["files"] == f"{first}/chats.jsonl"
