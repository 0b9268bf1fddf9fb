"""model=hf and HF safetensors in and out, without the launcher: no process is started here
except one `python -m qwen3_neuron.hf_io.verify`.

The HF saves are made the way torchtitan makes them (its state-dict adapter, then DCP's
HuggingFaceStorageWriter and consolidation, as `DCPCheckpointManager.dcp_save(to_hf=True)` does),
in this process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from safetensors.torch import load_file, save_file

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.hf_io import export, verify
from qwen3_neuron.job.record import weights_were_loaded
from qwen3_neuron.models.flavors import native_model_spec
from qwen3_neuron.models.hf import model_dir as hf_model
from qwen3_neuron.models.hf import spec as hf_spec
from qwen3_neuron.models.hf import state_dict as hf_state_dict
from qwen3_neuron.report import loss_check

TINY_VOCAB = 2048


# ---- helpers -----------------------------------------------------------------------------------


def hf_trainer_config(model_dir, seq_len=256):
    """The Trainer.Config a model=hf run gets (base function + our spec), before any worker."""
    from torchtitan.experiments.transformers_modeling_backend.config_registry import (
        transformers_modeling_backend_full,
    )

    read = hf_model.read_model_dir(Path(model_dir))
    config = transformers_modeling_backend_full()
    config.model_spec = hf_spec.hf_model_spec(read, "full")
    config.training.seq_len = seq_len
    hf_spec.configure_hf_trainer(config, read)
    return config


def native_trainer_config(tokenizer_dir):
    from torchtitan.models.qwen3.config_registry import qwen3_32b

    config = qwen3_32b()
    config.model_spec = native_model_spec("tiny")
    config.hf_assets_path = str(tokenizer_dir)
    return config


@contextlib.contextmanager
def transformers_init_restored():
    """torchtitan's HFTransformerModel patches Transformers' weight init process-wide
    (`_patch_hf_llama_like`: PreTrainedModel._init_weights / _initialize_weights and the decoder
    layer's __init__). A worker never loads with from_pretrained afterwards; this test process
    does, so undo the patch once the model is built."""
    from transformers import PreTrainedModel
    from transformers.models.qwen3 import modeling_qwen3
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    patched = [(PreTrainedModel, "_init_weights"), (PreTrainedModel, "_initialize_weights"),
               (modeling_qwen3.Qwen3DecoderLayer, "__init__"), (modeling_qwen3_moe.Qwen3MoeDecoderLayer, "__init__")]  # fmt: skip
    saved = [(owner, name, owner.__dict__[name]) for owner, name in patched]
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def build_hf_model(config):
    """What a worker builds for model=hf, on one CPU process (MoE swapped in as parallelize does)."""
    with transformers_init_restored():
        return _build_hf_model(config)


def _build_hf_model(config):
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.experiments.transformers_modeling_backend.moe_replacement import (
        build_and_swap_native_moe,
    )

    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    if any(getattr(layer, "moe_enabled", False) for layer in model.layers.values()):
        one_rank = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
        build_and_swap_native_moe(model, one_rank)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def build_native_model(spec):
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def torchtitan_hf_save(hf_state_dict, step_dir: Path, fqn_to_index: dict[str, int] | None = None):
    """Write `hf_state_dict` as torchtitan's last HF save does (checkpointer/dcp.py dcp_save)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files_on_every_rank,
    )

    save_path = step_dir / "sharded" if fqn_to_index else step_dir
    writer = HuggingFaceStorageWriter(
        path=str(save_path), save_distributed=True, fqn_to_index_mapping=fqn_to_index,
        enable_consolidation=not fqn_to_index,
    )  # fmt: skip
    dcp.save(hf_state_dict, storage_writer=writer)
    if fqn_to_index:
        consolidate_safetensors_files_on_every_rank(
            input_dir=str(save_path), output_dir=str(step_dir), fqn_to_index_mapping=fqn_to_index, num_threads=1
        )


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(path))
    return out


def copy_model_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


# ---- model=hf spec: architecture from config.json ----------------------------------------------


def test_hf_spec_keeps_config_json_architecture(assets):
    config = hf_trainer_config(assets.tiny_qwen3_dir)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)  # what each worker does
    written = json.loads((assets.tiny_qwen3_dir / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "rms_norm_eps"):  # fmt: skip
        assert getattr(model_config, key) == written[key], key
    assert model_config.rope_parameters["rope_theta"] == written["rope_parameters"]["rope_theta"] == 1e6
    assert config.loss.global_vocab_size == TINY_VOCAB
    assert config.hf_model == config.hf_assets_path == str(assets.tiny_qwen3_dir)
    # the only training-time overwrite of an architecture field: positions follow seq_len
    assert model_config.max_position_embeddings == 256


def test_hf_spec_restores_biases_torchtitan_would_drop(assets, tmp_path):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "biased")
    written = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**written, "attention_bias": True}))
    config = hf_trainer_config(model_dir)
    config.model_spec.model.update_from_config(config=config)
    assert config.model_spec.model.attention_bias is True  # stock update_from_config forces False


def test_hf_spec_picks_the_moe_config_for_the_moe_dir(assets):
    assert hf_spec.hf_model_spec(hf_model.read_model_dir(assets.tiny_qwen3_moe_dir), "full").model.is_moe
    assert not hf_spec.hf_model_spec(hf_model.read_model_dir(assets.tiny_qwen3_dir), "full").model.is_moe


def test_hf_flavor_must_not_override_the_architecture(assets):
    with pytest.raises(ConfigError, match=r"model.flavor=debugmodel does not fit model=hf.*full"):
        hf_spec.hf_model_spec(hf_model.read_model_dir(assets.tiny_qwen3_dir), "debugmodel")


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_hf_model_init_fills_rope_and_moe_states(assets, moe):
    model_dir = assets.tiny_qwen3_moe_dir if moe else assets.tiny_qwen3_dir
    model = build_hf_model(hf_trainer_config(model_dir))
    rotary = model.model.model.rotary_emb
    expected = 1.0 / (1e6 ** (torch.arange(0, 64, 2).float() / 64))
    assert torch.allclose(rotary.inv_freq, expected) and torch.allclose(rotary.original_inv_freq, expected)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point():
            # uninitialised memory shows up as NaN or values like 3e14 (seen before the fix)
            assert torch.isfinite(tensor).all() and tensor.abs().max() < 10, name


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_hf_adapter_round_trips_the_files_exactly(assets, moe):
    model_dir = assets.tiny_qwen3_moe_dir if moe else assets.tiny_qwen3_dir
    config = hf_trainer_config(model_dir)
    model = build_hf_model(config)
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, config.hf_assets_path)
    on_disk = weights(model_dir)
    assert {k: tuple(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()} == {
        k: tuple(v.shape) for k, v in on_disk.items()
    }
    result = model.load_state_dict(adapter.from_hf(dict(on_disk)), strict=False)
    # only the MoE load-balancing bias (training state, no HF counterpart) stays unloaded
    assert all(key.endswith("expert_bias_E") for key in result.missing_keys) and not result.unexpected_keys
    back = adapter.to_hf(model.state_dict())
    assert all(torch.equal(back[key], on_disk[key]) for key in on_disk)


def test_split_and_fuse_experts_are_inverse():
    gate_up = torch.randn(4, 6, 5)  # E, 2F, D
    down = torch.randn(4, 5, 3)  # E, D, F
    fused = {"m.layers.0.mlp.experts.gate_up_proj": gate_up, "m.layers.0.mlp.experts.down_proj": down}
    split = hf_state_dict._split_experts(fused)
    assert split["m.layers.0.mlp.experts.3.up_proj.weight"].shape == (3, 5)
    assert len(split) == 12
    again = hf_state_dict._fuse_experts(split)
    assert all(torch.equal(again[k], fused[k]) for k in fused)


# ---- plan-time errors name the file or key -----------------------------------------------------


@pytest.fixture
def broken_dirs(assets, tmp_path):
    """name -> (model dir, text the error must contain)."""
    dirs = {}
    dirs["missing"] = (tmp_path / "nowhere", "no such directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    dirs["no_config"] = (empty, f"{empty}: no config.json")
    bad_json = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "bad_json")
    (bad_json / "config.json").write_text('{"model_type": "qwen3", ')
    dirs["bad_json"] = (bad_json, f"{bad_json / 'config.json'} is not valid JSON")
    not_object = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "not_object")
    (not_object / "config.json").write_text("[1, 2]")
    dirs["not_object"] = (not_object, "must hold a JSON object")
    no_vocab = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "no_vocab")
    written = json.loads((no_vocab / "config.json").read_text())
    del written["vocab_size"]
    (no_vocab / "config.json").write_text(json.dumps(written))
    dirs["no_vocab"] = (no_vocab, f"{no_vocab / 'config.json'}: key 'vocab_size' is missing")
    remote = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "remote")
    (remote / "config.json").write_text(json.dumps({**written, "vocab_size": 2048, "auto_map": {"AutoConfig": "x.Y"}}))
    dirs["remote_code"] = (remote, "model.trust_remote_code=true")
    dirs["hub_id_not_cached"] = ("nobody-here/no-such-model", "not in the Hugging Face cache")
    return dirs


@pytest.mark.parametrize(
    "case", ["missing", "no_config", "bad_json", "not_object", "no_vocab", "remote_code", "hub_id_not_cached"]
)
def test_malformed_hf_model_dir_is_refused_naming_file_and_key(broken_dirs, case):
    model_dir, expected = broken_dirs[case]
    with pytest.raises(ConfigError) as error:
        hf_model.open_model_dir(str(model_dir), trust_remote_code=False)
    assert expected in str(error.value)
    assert "model.hf_model" in str(error.value) or "trust_remote_code" in str(error.value)


def from_hf(config, load_path=None):
    config.checkpoint.enable = True
    config.checkpoint.initial_load_in_hf = True
    config.checkpoint.initial_load_path = str(load_path) if load_path else None
    return config


def test_from_hf_needs_safetensors_in_the_load_dir(assets, tmp_path):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "no_weights")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"model.hf_model=.*no_weights: no \*.safetensors weights"):
        hf_model.check_initial_hf_load(from_hf(hf_trainer_config(model_dir)), "hf")
    hf_model.check_initial_hf_load(from_hf(hf_trainer_config(assets.tiny_qwen3_dir)), "hf")  # fine


def test_from_hf_index_naming_missing_files_is_refused(assets, tmp_path):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "bad_index")
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(ConfigError, match="model.safetensors.index.json: names files that are not there"):
        hf_model.check_initial_hf_load(from_hf(hf_trainer_config(model_dir)), "hf")


def test_native_from_hf_needs_a_load_path(assets):
    with pytest.raises(ConfigError, match="checkpoint.initial_load_path"):
        hf_model.check_initial_hf_load(from_hf(native_trainer_config(assets.tokenizer_dir)), "native")


def test_native_from_hf_refuses_a_dir_of_another_architecture(assets):
    config = from_hf(native_trainer_config(assets.tokenizer_dir), assets.tiny_qwen3_moe_dir)
    with pytest.raises(ConfigError) as error:
        hf_model.check_initial_hf_load(config, "native")
    message = str(error.value)
    assert "checkpoint.initial_load_path=" in message
    assert "num_hidden_layers: 2 in config.json, 4 in model.flavor=tiny" in message
    assert "tie_word_embeddings: False in config.json, True" in message
    hf_model.check_initial_hf_load(from_hf(native_trainer_config(assets.tokenizer_dir), assets.tiny_qwen3_dir), "native")


def test_tokenizer_larger_than_the_vocab_is_refused(assets):
    with pytest.raises(ConfigError, match=r"tokenizer.json has token id 2047, but the model's vocab_size is 1024"):
        hf_model.check_tokenizer_fits(str(assets.tokenizer_dir), 1024)
    hf_model.check_tokenizer_fits(str(assets.tokenizer_dir), TINY_VOCAB)


# ---- export ------------------------------------------------------------------------------------


def make_run(tmp_path, config, hf_state_dict, step=5, fqn_to_index=None):
    run_dir = tmp_path / "run"
    config.dump_folder = str(run_dir)
    config.checkpoint.enable = True
    config.checkpoint.last_save_in_hf = True
    torchtitan_hf_save(hf_state_dict, run_dir / "checkpoint" / f"step-{step}", fqn_to_index)
    return run_dir


def test_export_of_a_model_hf_save_opens_with_from_pretrained(assets, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = hf_trainer_config(assets.tiny_qwen3_dir)
    config.checkpoint.export_dtype = "float32"
    model = build_hf_model(config)
    trained = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}  # "trained"
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, config.hf_assets_path)
    run_dir = make_run(tmp_path, config, adapter.to_hf(trained))

    export_dir = export.export_after_training(config, run_dir)

    assert export_dir == run_dir / "hf_export"
    assert sorted(p.name for p in export_dir.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert not (run_dir / "checkpoint").exists()  # the consumed HF save: no false resume point
    loaded = AutoModelForCausalLM.from_pretrained(export_dir)
    assert loaded.config.max_position_embeddings == 2048  # the published value, not seq_len
    state = loaded.state_dict()
    for key, value in adapter.to_hf(trained).items():
        assert torch.equal(state[key], value), key
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    assert tokenizer.decode(tokenizer("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"
    assert verify.main([str(export_dir)]) == 0


def test_export_of_a_moe_save_keeps_transformers_layout(assets, tmp_path):
    config = hf_trainer_config(assets.tiny_qwen3_moe_dir)
    config.checkpoint.export_dtype = "float32"
    model = build_hf_model(config)
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, config.hf_assets_path)
    model.load_state_dict(adapter.from_hf(weights(assets.tiny_qwen3_moe_dir)), strict=False)
    run_dir = make_run(tmp_path, config, adapter.to_hf(model.state_dict()))
    export_dir = export.export_after_training(config, run_dir)
    exported, source = weights(export_dir), weights(assets.tiny_qwen3_moe_dir)
    assert exported.keys() == source.keys() and all(torch.equal(exported[k], source[k]) for k in source)
    assert verify.check_model_dir(export_dir).ok


def test_export_of_several_files_writes_an_index(assets, tmp_path):
    from transformers import AutoModelForCausalLM

    config = hf_trainer_config(assets.tiny_qwen3_dir)
    config.checkpoint.export_dtype = "float32"
    state = weights(assets.tiny_qwen3_dir)
    layout = {key: 1 if ".layers.0." in key or "embed" in key else 2 for key in state}
    run_dir = make_run(tmp_path, config, state, fqn_to_index=layout)
    export_dir = export.export_after_training(config, run_dir)
    index = json.loads((export_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in state.values())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]  # fmt: skip
    loaded = AutoModelForCausalLM.from_pretrained(export_dir).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_export_honours_export_dtype(assets, tmp_path):
    from transformers import AutoModelForCausalLM

    config = hf_trainer_config(assets.tiny_qwen3_dir)
    config.checkpoint.export_dtype = "bfloat16"
    state = {k: v.to(torch.bfloat16) for k, v in weights(assets.tiny_qwen3_dir).items()}  # torchtitan casts
    export_dir = export.export_after_training(config, make_run(tmp_path, config, state))
    assert json.loads((export_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(export_dir).dtype == torch.bfloat16


def test_export_refuses_tensors_not_in_export_dtype(assets, tmp_path):
    config = hf_trainer_config(assets.tiny_qwen3_dir)
    config.checkpoint.export_dtype = "bfloat16"
    run_dir = make_run(tmp_path, config, weights(assets.tiny_qwen3_dir))  # float32
    with pytest.raises(export.ExportError, match="is F32, not export_dtype bfloat16"):
        export.export_after_training(config, run_dir)


def test_failed_export_leaves_nothing_that_looks_complete(assets, tmp_path):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "model")
    config = hf_trainer_config(model_dir)
    config.checkpoint.export_dtype = "float32"
    state = weights(model_dir)
    del state["model.layers.1.mlp.up_proj.weight"]  # a save that lost a tensor
    run_dir = make_run(tmp_path, config, state)
    old_export = run_dir / "hf_export"
    old_export.mkdir()
    (old_export / "marker").write_text("previous export")
    with pytest.raises(export.ExportError, match="missing keys \\(1\\): model.layers.1.mlp.up_proj.weight"):
        export.export_after_training(config, run_dir)
    assert (old_export / "marker").read_text() == "previous export"  # untouched
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []  # no half-made dir
    assert (run_dir / "checkpoint" / "step-5").is_dir()  # the save is kept for another try


def test_export_killed_midway_leaves_no_export(assets, tmp_path, monkeypatch):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "model")
    config = hf_trainer_config(model_dir)
    config.checkpoint.export_dtype = "float32"
    run_dir = make_run(tmp_path, config, weights(model_dir))
    # kill -9 after the weights, config and tokenizer are written, before the rename
    monkeypatch.setattr(export, "_check", lambda *args: os.kill(os.getpid(), signal.SIGKILL))
    pid = os.fork()
    if pid == 0:
        export.export_after_training(config, run_dir)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert not (run_dir / "hf_export").exists()  # nothing under the export's name
    assert all(p.name.startswith(".hf_export.") for p in run_dir.iterdir() if "export" in p.name)
    assert (run_dir / "checkpoint" / "step-5").is_dir()  # the save is kept for another try


def test_export_without_an_hf_save_says_why(assets, tmp_path):
    config = hf_trainer_config(assets.tiny_qwen3_dir)
    config.dump_folder = str(tmp_path)
    config.checkpoint.enable = config.checkpoint.last_save_in_hf = True
    with pytest.raises(export.ExportError, match="no HF save in .*last_save_in_hf"):
        export.export_after_training(config, tmp_path)
    config.checkpoint.last_save_in_hf = False
    assert export.export_after_training(config, tmp_path) is None  # nothing asked for


@pytest.mark.numerics
def test_native_export_computes_the_same_logits_in_transformers(assets, tmp_path):
    """The native tiny model exported is the same function as the HF model loaded from the export."""
    from transformers import AutoModelForCausalLM

    config = native_trainer_config(assets.tokenizer_dir)
    config.checkpoint.export_dtype = "float32"
    spec = config.model_spec
    model = build_native_model(spec)
    adapter = spec.state_dict_adapter(spec.model, None)
    export_dir = export.export_after_training(config, make_run(tmp_path, config, adapter.to_hf(model.state_dict())))

    written = json.loads((export_dir / "config.json").read_text())
    assert written["architectures"] == ["Qwen3ForCausalLM"] and written["tie_word_embeddings"] is True
    assert (written["eos_token_id"], written["pad_token_id"], written["bos_token_id"]) == (0, 0, None)
    hf = AutoModelForCausalLM.from_pretrained(export_dir)
    tokens_BL = torch.randint(0, TINY_VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    positions_BL = torch.arange(32).expand(2, 32)
    with torch.no_grad():
        native_logits = model(tokens_BL, positions=positions_BL, attention_masks=model.get_attention_masks(positions_BL))
        hf_logits = hf(tokens_BL).logits
    # float32 both, two libraries' order of sums: the longest, the MLP's 768 terms, rounds by at most
    # 768 x 2^-24 of the magnitudes summed
    torch.testing.assert_close(native_logits, hf_logits, atol=768 * 2**-24 * hf_logits.abs().max(), rtol=0)


# ---- verify -------------------------------------------------------------------------------------


def test_verify_passes_the_tiny_dirs(assets, capsys):
    assert verify.main([str(assets.tiny_qwen3_dir)]) == 0
    out = capsys.readouterr().out
    assert "missing keys (0)" in out and "lm_head.weight is tied" in out and out.rstrip().endswith("OK")
    assert verify.main([str(assets.tiny_qwen3_moe_dir)]) == 0  # per-expert files, fused in memory


def test_verify_names_missing_and_unexpected_keys(assets, tmp_path, capsys):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "broken")
    state = weights(model_dir)
    del state["model.layers.2.self_attn.k_norm.weight"]
    state["model.layers.9.mlp.gate_proj.weight"] = torch.zeros(2, 2)
    save_file(state, model_dir / "model.safetensors", metadata={"format": "pt"})
    assert verify.main([str(model_dir)]) == 1
    out = capsys.readouterr().out
    assert "missing keys (1): model.layers.2.self_attn.k_norm.weight" in out
    assert "unexpected keys (1): model.layers.9.mlp.gate_proj.weight" in out
    assert out.rstrip().endswith("FAILED")


def test_verify_names_shape_mismatches(assets, tmp_path, capsys):
    model_dir = copy_model_dir(assets.tiny_qwen3_dir, tmp_path / "reshaped")
    state = weights(model_dir)
    state["model.norm.weight"] = torch.ones(128)
    save_file(state, model_dir / "model.safetensors", metadata={"format": "pt"})
    assert verify.main([str(model_dir)]) == 1
    assert "model.norm.weight: file (128,) vs model (256,)" in capsys.readouterr().out


def test_verify_cli_exit_codes(assets, tmp_path):
    """`python -m qwen3_neuron.hf_io.verify` exits with main's code (its 0: tests/test_hf_integration.py)."""
    run = verify.main

    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    assert run([str(not_a_model)]) == 2
    untied = copy_model_dir(assets.tiny_qwen3_moe_dir, tmp_path / "moe_without_head")
    state = weights(untied)
    del state["lm_head.weight"]  # untied: the head is a real weight
    save_file(state, untied / "model.safetensors", metadata={"format": "pt"})
    assert run([str(untied)]) == 1


# ---- first-step loss check ---------------------------------------------------------------------


def test_loss_check_reference_and_verdicts():
    ln_v = math.log(TINY_VOCAB)
    fresh = loss_check.judge_first_loss(7.66, TINY_VOCAB, weights_loaded=False)
    assert fresh.ok and fresh.random_init_loss_reference == pytest.approx(7.6246, abs=1e-4)
    loaded = loss_check.judge_first_loss(6.16, TINY_VOCAB, weights_loaded=True)  # measured round trip
    assert loaded.ok and "loaded" in loaded.message
    not_loaded = loss_check.judge_first_loss(7.68, TINY_VOCAB, weights_loaded=True)  # untrained weights
    assert not not_loaded.ok and not_loaded.threshold == pytest.approx(ln_v - 1.0)
    assert "INITIAL WEIGHTS PROBABLY NOT LOADED" in not_loaded.message
    assert not loss_check.judge_first_loss(float("nan"), TINY_VOCAB, weights_loaded=True).ok
    assert not_loaded.summary_fields("fail") == {
        "first_loss": 7.68, "random_init_loss_reference": 7.6246,
        "first_loss_check": "weights_probably_not_loaded",
    }  # fmt: skip
    assert not_loaded.summary_fields("off")["first_loss_check"] == "off"
    assert fresh.summary_fields("warn")["first_loss_check"] == "no_initial_weights"


def test_loss_check_modes():
    verdict = loss_check.judge_first_loss(7.9, TINY_VOCAB, weights_loaded=True)
    printed = []
    loss_check.enforce(verdict, "warn", warn=printed.append)
    assert len(printed) == 1 and "PROBABLY NOT LOADED" in printed[0]
    loss_check.enforce(verdict, "off", warn=printed.append)
    assert len(printed) == 1
    with pytest.raises(loss_check.FirstLossError, match="checkpoint.initial_load_path"):
        loss_check.enforce(verdict, "fail")
    loss_check.enforce(loss_check.judge_first_loss(5.0, TINY_VOCAB, True), "fail")  # fine


def test_weights_were_loaded_follows_the_checkpoint_section(assets):
    config = native_trainer_config(assets.tokenizer_dir)
    config.checkpoint.enable = False
    assert not weights_were_loaded(config)
    assert weights_were_loaded(from_hf(config, assets.tiny_qwen3_dir))


# ---- checkpointing groups ----------------------------------------------------------------------


def checkpoint_section(*overrides):
    return compose_config(*overrides)["checkpoint"]


def test_checkpointing_options_combine_in_any_order(assets):
    both = checkpoint_section("checkpointing=[from_hf,export_hf]")
    assert both == checkpoint_section("checkpointing=[export_hf,from_hf]")
    assert both == {
        "enable": True, "initial_load_in_hf": True, "initial_load_model_only": True,
        "last_save_in_hf": True, "last_save_model_only": True, "export_dtype": "float32",
    }  # fmt: skip
    periodic = checkpoint_section("checkpointing=[periodic,export_hf]")
    assert periodic == checkpoint_section("checkpointing=[export_hf,periodic]")
    assert (periodic["interval"], periodic["keep_latest_k"], periodic["last_save_in_hf"]) == (10, 2, True)
    assert checkpoint_section("checkpointing=none") == {"enable": False}


def test_check_first_loss_warns_and_says_when_to_fail(assets):
    config = from_hf(native_trainer_config(assets.tokenizer_dir), assets.tiny_qwen3_dir)
    printed = []

    def check(first_loss, mode):
        vocab_size = config.model_spec.model.vocab_size
        return loss_check.check_first_loss(first_loss, vocab_size, True, mode, warn=printed.append)

    verdict = check(7.7, "fail")
    assert verdict.fails("fail") and not verdict.fails("warn")
    assert "marked failed (hf.first_loss_check=fail)" in printed[0]
    assert check(None, "warn").fails("fail") is False  # no step ran
    assert len(printed) == 1
    assert check(5.9, "fail").ok


# ---- an export ends a chat turn ----------------------------------------------------------------


def test_an_exports_generation_config_ends_generate_at_the_chat_templates_end_of_turn(assets, tmp_path):
    """The tiny dir, like a base model, stops at EOS only; made a chat export's, generate() stops
    at `<|im_end|>` (the token the chat template closes each turn with) as well as at EOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

    from qwen3_neuron.hf_io.generation import GENERATION_CONFIG_FILE, chat_stop_problem, stop_at_end_of_turn

    model_dir = shutil.copytree(assets.tiny_qwen3_dir, tmp_path / "export")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end != tokenizer.eos_token_id
    assert "not at the chat template's end of turn '<|im_end|>'" in chat_stop_problem(model_dir)

    assert stop_at_end_of_turn(model_dir) == [im_end, tokenizer.eos_token_id]
    written = json.loads((model_dir / GENERATION_CONFIG_FILE).read_text())
    assert written["eos_token_id"] == [im_end, tokenizer.eos_token_id] and chat_stop_problem(model_dir) is None
    assert stop_at_end_of_turn(model_dir) == [im_end, tokenizer.eos_token_id]  # a second call changes nothing

    class EndTurnAtThirdToken(LogitsProcessor):  # an untrained model: make it write the marker
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - prompt_length == 2:
                scores[:, :] = -math.inf
                scores[:, im_end] = 0.0
            return scores

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi."}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    prompt_length = prompt["input_ids"].shape[1]
    output = model.generate(**prompt, max_new_tokens=12, do_sample=False,
                            logits_processor=LogitsProcessorList([EndTurnAtThirdToken()]))  # fmt: skip
    assert output[0, prompt_length:].tolist()[-1] == im_end and output.shape[1] == prompt_length + 3
