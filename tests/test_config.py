"""Unit tests of compose -> plan: no process is started here."""

from __future__ import annotations

import dataclasses
import json
import shutil
from typing import Literal

import pytest
from conftest import compose_config, compose_job, launch, launch_of, plan_of
from torchtitan.trainer import Trainer

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.fields import hint_from_text, hint_text
from qwen3_neuron.job import trainer_keys as trainer_keys_module
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.settings import parse_settings
from qwen3_neuron.job.trainer_config import build_trainer_config
from qwen3_neuron.job.trainer_keys import KEYS_FILE, check_trainer_keys, installed_torchtitan, trainer_keys
from qwen3_neuron.launch.hydra_setup import TRAINER_SECTIONS
from qwen3_neuron.run_dir import earlier_run


def plan_for(tmp_path, *overrides):
    return plan_of(compose_job(*overrides), tmp_path / "run")


def test_default_config_plans_tiny_native_on_two_cpu_ranks(tmp_path, assets):
    plan = plan_for(tmp_path)
    config = plan.trainer_config
    assert (plan.device, launch_of(plan).nproc_per_node) == ("cpu", 2)
    assert config.model_spec.name == "qwen3" and config.model_spec.flavor == "tiny"
    assert (config.training.steps, config.training.seq_len, config.training.local_batch_size) == (30, 256, 4)
    assert config.dump_folder == str(tmp_path / "run")
    assert config.hf_assets_path == str(assets.tokenizer_dir)
    assert config.dataloader.dataset_path == str(assets.text_dataset_dir)
    assert "--nproc_per_node=2" in launch_of(plan).command and launch_of(plan).command[-2:] == ["qwen3_neuron.worker.train", str(tmp_path / "run")]
    # fields nobody set keep the base config function's (qwen3_32b) values
    assert config.checkpoint.export_dtype == "float16"
    assert config.optimizer.param_groups[0].optimizer_kwargs["weight_decay"] == 0.1


def test_the_tokenizer_is_the_loaded_hf_dirs_own_unless_hf_assets_path_is_given(tmp_path, assets):
    """checkpointing=from_hf into model=native trains with the tokenizer its weights came with."""
    load = f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}"
    assert compose_config("checkpointing=from_hf", load)["hf_assets_path"] == str(assets.tiny_qwen3_dir)
    assert compose_config("checkpointing=from_hf", load, "hf_assets_path=/mine")["hf_assets_path"] == "/mine"
    # not loaded as HF weights (a torchtitan checkpoint), or a dir without tokenizer: the tiny one
    assert compose_config("checkpointing=periodic", load)["hf_assets_path"] == str(assets.tokenizer_dir)
    no_tokenizer = f"checkpoint.initial_load_path={tmp_path}"
    assert compose_config("checkpointing=from_hf", no_tokenizer)["hf_assets_path"] == str(assets.tokenizer_dir)


def test_hydra_opens_exactly_torchtitans_trainer_sections():
    sections = [
        f.name for f in dataclasses.fields(Trainer.Config)
        if f.name != "model_spec" and f.default_factory is not dataclasses.MISSING
    ]  # fmt: skip
    assert list(TRAINER_SECTIONS) == sections


def test_the_launchers_trainer_keys_are_torchtitans_own():
    # stale after a torchtitan upgrade: python -m qwen3_neuron.job.trainer_keys rewrites it
    assert json.loads(KEYS_FILE.read_text())[installed_torchtitan()] == trainer_keys()


@pytest.fixture
def keys_schema(monkeypatch):
    """trainer_keys' schema lookup, read afresh in the test and after it (it is cached)."""
    trainer_keys_module._schema.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    trainer_keys_module._schema.cache_clear()


def test_for_a_torchtitan_it_has_no_keys_of_the_launcher_says_once_that_the_plan_checks_them(keys_schema, capsys):
    keys_schema.setattr(trainer_keys_module, "installed_torchtitan", lambda: "0.2.2+neuron.2")  # AWS's fork
    composed = compose_config("training.stpes=3")
    for _ in range(2):  # a sweep's launcher checks each of its jobs
        check_trainer_keys(composed, parse_settings(composed))
    assert capsys.readouterr().err == (
        "[qwen3-neuron] note: trainer_keys.json has no keys of torchtitan 0.2.2+neuron.2 (it has 0.3.0): a "
        "misspelled key of torchtitan's sections is found by the plan, in torchrun's local rank 0, instead of "
        "before torchrun starts (python -m qwen3_neuron.job.trainer_keys writes them)\n"
    )


def test_the_plan_says_when_the_launchers_keys_disagree_with_torchtitans_classes(tmp_path, assets, keys_schema):
    assert not [note for note in plan_for(tmp_path).notes if KEYS_FILE.name in note]
    schema = json.loads(KEYS_FILE.read_text())[installed_torchtitan()]
    training = schema["configs"]["qwen3:qwen3_32b"]["training"]
    training["stpes"] = training.pop("steps")  # a stale schema: one key renamed
    keys_schema.setattr(trainer_keys_module, "_schema", lambda: schema)
    (note,) = [note for note in plan_for(tmp_path).notes if KEYS_FILE.name in note]
    assert note == (
        "trainer_keys.json's keys of torchtitan 0.3.0 for qwen3:qwen3_32b are not the installed classes' (only in "
        "the file: training.stpes (int); only in torchtitan: training.steps (int)): the launcher may refuse a valid key, or "
        "leave a misspelled one to this plan. Rewrite them: python -m qwen3_neuron.job.trainer_keys"
    )


@pytest.mark.parametrize("overrides", [
    ["training.stpes=3"], ["checkpoint.intervall=2"], ["optimizer.lrr=1e-3"], ["dataloader.sources=[]"],
    ["data=text", "data.files={text}", "dataloader.datset=x"], ["model=hf", "training.stpes=3"],
])  # fmt: skip
def test_the_launcher_names_a_misspelled_torchtitan_key_as_the_plan_does(tmp_path, assets, overrides):
    composed = compose_config(*(o.replace("{text}", str(assets.text_train_file)) for o in overrides))
    with pytest.raises(ConfigError) as at_launch:
        check_trainer_keys(composed, parse_settings(composed))
    assert str(at_launch.value).startswith("Unknown config key")
    if "model=hf" not in overrides:  # the plan needs the HF dir too
        with pytest.raises(ConfigError) as in_plan:
            plan_of(Job.parse(composed), tmp_path / "run")
        assert str(in_plan.value) == str(at_launch.value)


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.lr=fast"], "Wrong type for 'optimizer.lr': expected float, got str 'fast'."),
    (["optimizer.weight_decay=abc"], "Wrong type for 'optimizer.weight_decay': expected float, got str 'abc'."),
    (["training.dtype=fp16"], "Wrong value for 'training.dtype': expected one of 'bfloat16', 'float32', got 'fp16'."),
    # bool is an int subclass in Python: true is not the int 1
    (["training.steps=true"], "Wrong type for 'training.steps': expected int, got bool True."),
    (["data=text", "data.files={text}", "dataloader.seed=x"], "Wrong type for 'dataloader.seed': expected int, got str 'x'."),
])  # fmt: skip
def test_the_launcher_names_a_wrong_type_in_torchtitans_sections_as_the_plan_does(tmp_path, assets, overrides, message):
    composed = compose_config(*(o.replace("{text}", str(assets.text_train_file)) for o in overrides))
    with pytest.raises(ConfigError) as at_launch:
        check_trainer_keys(composed, parse_settings(composed))
    with pytest.raises(ConfigError) as in_plan:
        plan_of(Job.parse(composed), tmp_path / "run")
    assert str(at_launch.value) == str(in_plan.value) == message


def test_the_launchers_schema_reads_back_the_types_the_plan_checks():
    # every type written into trainer_keys.json reads back as the annotation it was written from
    for hint in (int, float | int, int | None, Literal["a", "b"], list[str | tuple[str, dict]], tuple[int, ...], dict):
        assert hint_from_text(hint_text(hint)) == hint


def test_the_launcher_leaves_valid_and_swapped_torchtitan_keys_to_the_plan():
    for overrides in (
        ["optimizer.lr=1e-3", "checkpointing=periodic"],
        ["data=text", "data.files=rows.jsonl", "data.val_fraction=0.1", "dataloader.streaming=true"],
        ["+activation_checkpoint._target_=torchtitan.distributed.activation_checkpoint.FullAC.Config",
         "+activation_checkpoint.anything=1"],
        ["model.config_fn=qwen3_8b", "training.stpes=3"],  # a base config the file does not know
    ):  # fmt: skip
        composed = compose_config(*overrides)
        check_trainer_keys(composed, parse_settings(composed))


def test_overrides_reach_the_trainer_config(tmp_path, assets):
    config = plan_for(
        tmp_path,
        "training.seq_len=128",                 # nested field
        "lr_scheduler.warmup_steps=5",
        "optimizer.lr=3e-4",                    # shorthand onto every param group
        "compile.components=[loss]",            # list field
        "debug.seed=7",
    ).trainer_config
    assert config.training.seq_len == 128
    assert config.lr_scheduler.warmup_steps == 5
    assert [g.optimizer_kwargs["lr"] for g in config.optimizer.param_groups] == [3e-4]
    assert config.compile.components == ["loss"]
    assert config.debug.seed == 7


def test_section_class_swap_with_target(tmp_path, assets):
    config = plan_for(
        tmp_path, "+activation_checkpoint._target_=torchtitan.distributed.activation_checkpoint.FullAC.Config"
    ).trainer_config
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_flavor_swap_to_4b_has_the_published_dimensions(tmp_path, assets):
    # 4B does not fit 2 CPU ranks here (the plan would refuse it): only its dimensions matter
    model = plan_for(tmp_path, "model.flavor=4B", "run.memory_check=off").trainer_config.model_spec.model
    layer = model.layers[0]
    assert (model.vocab_size, model.dim, len(model.layers)) == (151936, 2560, 36)
    assert (layer.attention.n_heads, layer.attention.n_kv_heads, layer.attention.head_dim) == (32, 8, 128)
    assert (layer.feed_forward.w1.in_features, layer.feed_forward.w1.out_features) == (2560, 9728)
    assert model.enable_weight_tying is True
    assert model.norm.eps == 1e-6 and layer.attention.qk_norm.eps == 1e-6
    assert layer.attention.rope.theta == 1e6
    instruct = plan_for(tmp_path, "model.flavor=4B-Instruct-2507", "run.memory_check=off").trainer_config.model_spec.model
    assert {layer.attention.rope.theta for layer in instruct.layers} == {5e6}


def test_loss_vocab_follows_the_swapped_flavor(tmp_path, assets):
    config = plan_for(tmp_path).trainer_config
    assert config.loss.loss_fn.global_vocab_size == config.model_spec.model.vocab_size == 2048


def test_missing_assets_fail_at_plan_time(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*qwen3_neuron.assets"):
        plan_for(tmp_path, f"hf_assets_path={tmp_path}/nowhere")


def test_dry_run_records_the_run_and_starts_nothing(tmp_path, assets):
    run_dir = tmp_path / "run"
    result = launch(run_dir, "run.dry_run=true", "training.steps=7", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "forked_torchrun --standalone --nproc_per_node=2" in result.stdout
    assert {"job.yaml", "trainer_config.json", "command.sh", "versions.json"} <= {p.name for p in run_dir.iterdir()}
    assert not (run_dir / "train.log").exists() and not (run_dir / "metrics.jsonl").exists()
    assert '"steps": 7' in (run_dir / "trainer_config.json").read_text()
    assert "qwen3_neuron.worker.train" in (run_dir / "command.sh").read_text()
    # the record says what it is: no run a new launch must keep out of
    assert (run_dir / "PLAN_ONLY.txt").read_text().startswith("run.dry_run=true: the plan recorded here")
    assert earlier_run(run_dir) is None
    # the plan, one line per fact: the override list summarised, each warning once, no JSON
    out = result.stdout + result.stderr
    assert "[qwen3-neuron] override: 4 x model_spec.model.layers.*.attention.inner_attention" in out
    assert "[Override]" not in out and '"training": {' not in out
    assert "[qwen3-neuron] weights: a random init (seed " in out  # the default job loads nothing
    assert 5 <= len(out.splitlines()) <= 13, out
    assert len(set(out.splitlines())) == len(out.splitlines()), out
    assert out.splitlines()[-1].startswith("[qwen3-neuron] memory per rank: ")  # the verdict, last
    # nothing on the console a user has to learn to ignore: the project's own lines only;
    # torchtitan's warning of its own base config is kept in the run's log, off the screen
    assert [line for line in out.splitlines() if not line.startswith("[qwen3-neuron] ")] == [], out
    assert "initial_load_model_only=True has no effect" in (run_dir / "launch.log").read_text()


def test_torchtitans_note_on_a_dtype_it_records_as_text_stays_off_the_launchers_screen():
    """model=hf's config holds a torch.dtype; torchtitan's to_dict (trainer_config.json) writes it
    as text and says so: nothing for a user to act on, shown only in launch.log."""
    import io
    import logging
    from dataclasses import dataclass

    import torch
    from torchtitan.config.configurable import Configurable

    from qwen3_neuron.launch import console

    @dataclass(kw_only=True, slots=True)
    class WithDtype(Configurable.Config):
        dtype: torch.dtype = torch.bfloat16

    screen, log = io.StringIO(), io.StringIO()
    shown, kept = logging.StreamHandler(screen), logging.StreamHandler(log)
    shown.addFilter(console._Quiet(verbose=False))
    root = logging.getLogger()
    root.addHandler(shown), root.addHandler(kept)
    try:
        assert WithDtype().to_dict() == {"dtype": "torch.bfloat16"}
    finally:
        root.removeHandler(shown), root.removeHandler(kept)
    assert "may not be JSON serializable" in log.getvalue() and screen.getvalue() == ""


def test_the_plan_names_the_weights_a_run_starts_from(tmp_path, assets):
    """SFT -> DPO -> GRPO: each run starts from the export of the one before, and the dry run says which."""
    from qwen3_neuron.job.plan import starting_weights

    grpo = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo"), tmp_path / "grpo").trainer_config
    assert starting_weights(grpo) == (f"{assets.tiny_qwen3_dir} (HF safetensors, model.hf_model); a checkpoint of "
                                      "this run dir, when there is one, comes first")  # fmt: skip
    export = tmp_path / "dpo_run" / "hf_export"
    shutil.copytree(assets.tiny_qwen3_dir, export)  # a DPO run's export, as export_hf writes it
    chained = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo", f"checkpoint.initial_load_path={export}"),
                      tmp_path / "chained").trainer_config  # fmt: skip
    assert starting_weights(chained).startswith(f"{export} (HF safetensors, checkpoint.initial_load_path)")


def test_a_dry_run_shows_a_plan_that_does_not_fit_then_refuses_it(tmp_path, assets):
    """A dry run is how a plan for a bigger machine is looked at: shown whole, the memory verdict
    last, and exit code 2 saying a launch here would be refused."""
    run_dir = tmp_path / "run"
    result = launch(run_dir, "run.dry_run=true", "model.flavor=32B", timeout=300)
    assert result.returncode == 2, result.stderr
    assert "[qwen3-neuron] model: qwen3 32B (model=native)" in result.stdout
    assert "forked_torchrun --standalone --nproc_per_node=2" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("[qwen3-neuron] memory per rank: ")
    assert "Config error: the plan does not fit" in result.stderr
    assert "a launch would stop here" in result.stderr
    assert (run_dir / "trainer_config.json").exists()


def test_chat_validation_follows_the_users_data(tmp_path, assets):
    """data=chat validates on the bundled conversations only while it trains on them: a user's own
    files are validated on what the user names, and `data.val_fraction` alone names it."""
    shutil.copy(assets.chat_train_file, tmp_path / "mine.jsonl")  # the bundled rows, by another name
    mine = f"data.files={tmp_path / 'mine.jsonl'}"
    bundled = plan_for(tmp_path, "data=chat").trainer_config.validator
    assert bundled.enable and bundled.dataloader.sources[0].files == str(assets.chat_validation_file)
    assert not plan_for(tmp_path, "data=chat", mine).trainer_config.validator.enable
    carved = plan_for(tmp_path, "data=chat", mine, "data.val_fraction=0.05").trainer_config.validator
    assert carved.enable and carved.dataloader.sources[0].val_fraction == 0.05
    with pytest.raises(ConfigError, match="data.val_fraction and data.val_files both"):
        plan_for(tmp_path, "data=chat", mine, "data.val_fraction=0.05", f"data.val_files={tmp_path / 'mine.jsonl'}")


@pytest.mark.parametrize(
    ("checkpointing", "interval", "last_step_full"),
    [("periodic", 10, True), ("[periodic,export_hf]", 10, False), ("[from_hf,export_hf]", 31, False)],
)
def test_only_periodic_checkpointing_saves_on_the_way_and_its_last_step_is_a_full_checkpoint(
    assets, tmp_path, checkpointing, interval, last_step_full
):
    """checkpointing=periodic saves every checkpoint.interval steps and its last step in full (a
    resume with a larger training.steps continues from it); an export alone saves nothing before
    its last step (its interval lies past the 30 steps), where it writes the HF save."""
    initial = [f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}"] if "from_hf" in checkpointing else []
    job = compose_job(f"checkpointing={checkpointing}", *initial).settled()
    checkpoint = build_trainer_config(job, tmp_path).checkpoint
    assert (checkpoint.interval, not checkpoint.last_save_model_only) == (interval, last_step_full)
