"""The generated assets: what torchtitan and Transformers users rely on, built into tmp dirs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: never the hub

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from qwen3_neuron.assets import build as assets
from qwen3_neuron.models.tiny import TINY_DENSE, TINY_MOE, TINY_VOCAB_SIZE

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "Grüße aus Köln — 世界, こんにちは 🙂",
    "  leading spaces,\ttabs\r\nand a trailing newline\n",
    "",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> assets.AssetPaths:
    return assets.build_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(autouse=True)
def datasets_cache_in_tmp(tmp_path, monkeypatch):
    """Keep `datasets`' Arrow cache of the tmp data sets out of the user's HF cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets_cache")


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_asset_paths_touches_nothing_and_root_follows_env(tmp_path, monkeypatch):
    paths = assets.asset_paths(tmp_path / "not_built")
    assert not paths.root.exists()
    assert paths.missing() == paths.artifacts()
    monkeypatch.setenv(assets.ASSETS_ENV_VAR, str(tmp_path / "from_env"))
    assert assets.default_root() == tmp_path / "from_env"
    assert assets.asset_paths().tokenizer_dir == tmp_path / "from_env" / "tokenizer"


def test_tokenizer_round_trips_text_and_has_qwen_special_tokens(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built.tokenizer_dir)
    assert len(tokenizer) == TINY_VOCAB_SIZE
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    for special in assets.SPECIAL_TOKENS:
        assert len(tokenizer.encode(special)) == 1, special
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


def test_torchtitan_tokenizer_loads_dir_and_finds_eos(built):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(built.tokenizer_dir))
    assert tokenizer.get_vocab_size() == TINY_VOCAB_SIZE
    assert tokenizer.eos_id == tokenizer.token_to_id("<|endoftext|>")
    ids = tokenizer.encode(TEXTS[1], add_bos=True, add_eos=True)
    assert ids[-1] == tokenizer.eos_id
    assert tokenizer.decode(ids[:-1]) == TEXTS[1]


def test_torchtitan_text_dataset_yields_token_sequences(built):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import (
        HuggingFaceTextDataLoader,
        HuggingFaceTextDataset,
    )

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(built.tokenizer_dir))
    dataset_path = str(built.text_dataset_dir)
    dataset = HuggingFaceTextDataset(assets.DATASET_NAME, dataset_path, tokenizer, seq_len=64)
    inputs, labels = next(iter(dataset))
    assert inputs["input"].shape == labels.shape == (64,)
    assert torch.equal(inputs["input"][1:], labels[:-1])  # labels are the next tokens
    assert int(inputs["input"].max()) < TINY_VOCAB_SIZE
    text = tokenizer.decode(inputs["input"].tolist())
    assert "def " in text or "class " in text  # Python source

    validation = HuggingFaceTextDataset(
        assets.VALIDATION_DATASET_NAME, dataset_path, tokenizer, seq_len=64
    )
    assert not torch.equal(next(iter(validation))[0]["input"], inputs["input"])  # a held-out split

    config = HuggingFaceTextDataLoader.Config(
        dataset=assets.DATASET_NAME, dataset_path=dataset_path
    )
    loader = HuggingFaceTextDataLoader(
        config, dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=32, local_batch_size=2
    )
    batch_inputs, batch_labels = next(iter(loader))
    assert batch_inputs["input"].shape == batch_labels.shape == (2, 32)


def test_tiny_models_load_offline_with_their_tokenizer(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dense = AutoModelForCausalLM.from_pretrained(built.tiny_qwen3_dir)
    for key, value in TINY_DENSE.items():
        if key != "rope_theta":  # Transformers 5 moves it into rope_parameters
            assert getattr(dense.config, key) == value, key
    assert dense.config.rope_parameters["rope_theta"] == TINY_DENSE["rope_theta"]

    moe = AutoModelForCausalLM.from_pretrained(built.tiny_qwen3_moe_dir)
    assert type(moe).__name__ == "Qwen3MoeForCausalLM"
    assert moe.config.num_experts == TINY_MOE["num_experts"]

    for model, model_dir in ((dense, built.tiny_qwen3_dir), (moe, built.tiny_qwen3_moe_dir)):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        assert tokenizer.eos_token_id == model.config.eos_token_id
        ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
        logits = model(ids).logits
        assert logits.shape == (1, ids.shape[1], TINY_VOCAB_SIZE)
        assert torch.isfinite(logits).all()


def test_safetensors_use_standard_hf_key_names(built):
    with safe_open(built.tiny_qwen3_dir / "model.safetensors", "pt") as dense:
        dense_keys = set(dense.keys())
    assert "model.layers.3.self_attn.q_proj.weight" in dense_keys
    assert "lm_head.weight" not in dense_keys  # tied to the embedding

    with safe_open(built.tiny_qwen3_moe_dir / "model.safetensors", "pt") as moe:
        moe_keys = set(moe.keys())
    assert "lm_head.weight" in moe_keys
    assert "model.layers.1.mlp.gate.weight" in moe_keys
    last_expert = TINY_MOE["num_experts"] - 1
    assert f"model.layers.1.mlp.experts.{last_expert}.gate_proj.weight" in moe_keys


def test_forced_rebuild_over_a_complete_root_replaces_everything_byte_identically(built, tmp_path):
    shutil.copytree(built.root, tmp_path / "again")
    for artifact in assets.asset_paths(tmp_path / "again").artifacts():
        (artifact / "stale").write_text("left by an older build")
    rebuilt = assets.build_assets(tmp_path / "again", force=True)
    for original_dir, rebuilt_dir in zip(built.artifacts(), rebuilt.artifacts()):
        assert file_bytes(rebuilt_dir) == file_bytes(original_dir), original_dir.name
    assert sorted(rebuilt.root.iterdir()) == sorted(rebuilt.artifacts())  # no temp dirs left behind


def test_missing_lists_a_removed_artifact_and_a_rebuild_restores_only_it(built, tmp_path):
    paths = assets.asset_paths(tmp_path / "copy")
    shutil.copytree(built.root, paths.root)
    shutil.rmtree(paths.tiny_qwen3_moe_dir)
    assert paths.missing() == [paths.tiny_qwen3_moe_dir]
    kept_mtime = paths.tiny_qwen3_dir.stat().st_mtime_ns

    assets.build_assets(paths.root)
    assert paths.missing() == []
    assert file_bytes(paths.tiny_qwen3_moe_dir) == file_bytes(built.tiny_qwen3_moe_dir)
    assert paths.tiny_qwen3_dir.stat().st_mtime_ns == kept_mtime  # present ones are not rebuilt


def test_interrupted_build_leaves_no_finished_looking_dir(tmp_path, monkeypatch):
    def write_half_then_die(out_dir):
        (out_dir / "train.jsonl").write_text('{"text": "half a fi')
        raise KeyboardInterrupt

    monkeypatch.setattr(assets, "write_text_dataset", write_half_then_die)
    def write_fake_tokenizer(out_dir):
        (out_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(assets, "write_tokenizer", write_fake_tokenizer)
    paths = assets.asset_paths(tmp_path / "root")
    with pytest.raises(KeyboardInterrupt):
        assets.build_assets(paths.root)
    assert not paths.text_dataset_dir.exists()
    assert paths.text_dataset_dir in paths.missing()
    assert list(paths.root.iterdir()) == [paths.tokenizer_dir]  # its temp dir is gone too


def test_cli_prints_each_path(built):
    result = subprocess.run(
        [sys.executable, "-m", "qwen3_neuron.assets", "--root", str(built.root)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    for path in built.artifacts():
        assert str(path) in result.stdout
    assert f"dataset: {assets.DATASET_NAME}" in result.stdout
