"""After training: torchtitan's last HF save -> a complete Hugging Face model dir.

With `checkpoint.last_save_in_hf` (checkpointing=export_hf) torchtitan writes, at the last step,
`<run dir>/checkpoint/step-N/` holding model safetensors with HF key names (its state-dict adapter
converts them) and an index, plus a duplicate `sharded/` folder, and nothing else: no config.json,
no tokenizer, so `from_pretrained` cannot open it. `export_hf_model` makes `<run dir>/hf_export/`:

- the safetensors (hard-linked when possible, never re-encoded): `model.safetensors` when there
  is one file, else the `model-0000i-of-0000n.safetensors` files + `model.safetensors.index.json`;
- config.json: for model=hf the source dir's own (the architecture as published, including the
  `max_position_embeddings` torchtitan overrides while training), for model=native one written
  from the native flavour; `dtype` set to `checkpoint.export_dtype`, which torchtitan cast to;
- generation_config.json (the source dir's, or one derived from config.json) and the tokenizer
  files of `hf_assets_path`; after chat training (a `chat` data source) the generation config
  also stops at the chat template's end of turn (`hf_io.generation`), or replies never end.

The dir is assembled beside its final place, checked with `verify.check_model_dir` (keys and
shapes, on the meta device), and only then renamed into place: a killed or failed export never
leaves a dir that looks complete. The consumed `step-N` HF save is then deleted: torchtitan
would otherwise take it for a resumable checkpoint on a relaunch in the same run dir (its
`_find_load_step` accepts a step dir holding a safetensors index) and fail to load it as DCP.

Called by global rank 0 once every rank has finished training (`run_export.export_run`, from
`worker.train`): that process holds the config and has imported torchtitan already.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from qwen3_neuron.assets.atomic_dir import building
from qwen3_neuron.errors import ExportError, UnsupportedModel
from qwen3_neuron.hf_backend import HF_BACKEND_NAME
from qwen3_neuron.hf_io.generation import GENERATION_CONFIG_FILE, stop_at_end_of_turn
from qwen3_neuron.hf_io.reward_model_export import sequence_classification_config, write_scored_weights
from qwen3_neuron.hf_io.verify import check_model_dir
from qwen3_neuron.models.hf.model_dir import CONFIG_FILE, INDEX_FILE, native_architecture, score_head_path

logger = logging.getLogger(__name__)

EXPORT_DIR_NAME = "hf_export"
# Tokenizer files of every kind Transformers reads; copied when present.
TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|chat_template\.(jinja|json)|"
    r"vocab\.(json|txt)|merges\.txt|.*\.tiktoken|.*\.model)$"
)
_STEP_DIR = re.compile(r"^step-(\d+)$")


def export_after_training(trainer_config, run_dir: Path, export_dir: str | None = None) -> Path | None:
    """Export when the run saved in HF, else None.

    `export_dir` (hf.export_dir): absolute, or relative to the run dir; default `hf_export`.
    """
    if not exports_hf(trainer_config):
        return None
    return export_hf_model(trainer_config, run_dir / (export_dir or EXPORT_DIR_NAME))


def trains_chat(trainer_config) -> bool:
    """Whether the run trained on conversations (data=chat or preference, or a chat source of data=mix)."""
    sources = getattr(trainer_config.dataloader, "sources", ())
    return any(getattr(source, "format", None) in ("chat", "preference", "prompts") for source in sources)


def exports_hf(trainer_config) -> bool:
    checkpoint = trainer_config.checkpoint
    return bool(checkpoint.enable and checkpoint.last_save_in_hf)


def export_hf_model(trainer_config, export_dir: Path, weights_dir: Path | None = None) -> Path:
    """Make `export_dir` a complete HF model dir from the run's last HF save; return it.

    `weights_dir`: where the safetensors come from instead of the save itself (finetune=lora:
    the base merged with the adapters, written inside the save's step dir)."""
    checkpoint_dir = Path(trainer_config.dump_folder) / trainer_config.checkpoint.folder
    step, step_dir = last_hf_save(checkpoint_dir)
    export_dtype = trainer_config.checkpoint.export_dtype
    export_dir = Path(export_dir)
    head = score_head_path(step_dir)  # trainer=reward_model: a sequence-classification model
    scored = head.is_file()
    with building(export_dir) as tmp_dir:
        config = _hf_config(trainer_config)
        if scored:
            write_scored_weights(weights_dir or step_dir, head, tmp_dir, export_dtype)
            pad_id = _special_token_ids(Path(trainer_config.hf_assets_path))["pad_token_id"]
            config = sequence_classification_config(config, pad_id)
        else:
            _write_weights(weights_dir or step_dir, tmp_dir)
        config["dtype"] = export_dtype
        config.pop("torch_dtype", None)  # the v4 name of the same key
        _write_json(tmp_dir / CONFIG_FILE, config)
        _copy_tokenizer(Path(trainer_config.hf_assets_path), tmp_dir)
        chat = trains_chat(trainer_config) and not scored  # a classifier generates nothing
        if not scored:
            _write_generation_config(trainer_config, config, tmp_dir)
        if chat:
            stop_at_end_of_turn(tmp_dir)
        _check(tmp_dir, export_dtype, chat)
    remove_hf_save(checkpoint_dir, step_dir)
    logger.info("exported step %d to %s", step, export_dir)
    return export_dir


def remove_hf_save(checkpoint_dir: Path, step_dir: Path) -> None:
    """Delete a consumed HF save (a relaunch would take it for a DCP checkpoint)."""
    shutil.rmtree(step_dir)
    if not any(checkpoint_dir.iterdir()):
        checkpoint_dir.rmdir()  # only the consumed HF save was there


def last_hf_save(checkpoint_dir: Path) -> tuple[int, Path]:
    """(step, dir) of the newest `step-N` holding top-level safetensors (an HF save)."""
    saves = []
    if checkpoint_dir.is_dir():
        for child in checkpoint_dir.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and any(child.glob("*.safetensors")):
                saves.append((int(match[1]), child))
    if not saves:
        raise ExportError(
            f"no HF save in {checkpoint_dir}: torchtitan writes one at the last training step "
            f"when checkpoint.last_save_in_hf=true (checkpointing=export_hf); a run that stopped "
            f"before its last step has none."
        )
    return max(saves)


def _write_weights(step_dir: Path, out_dir: Path) -> None:
    """One file -> `model.safetensors`; several -> their names + an index built from their
    headers (torchtitan's multi-file save, `consolidate_safetensors_files_on_every_rank`,
    writes no index, and the single-file one writes an index that HF does not need)."""
    from safetensors import safe_open

    files = sorted(step_dir.glob("*.safetensors"))
    if len(files) == 1:
        _link_or_copy(files[0], out_dir / "model.safetensors")
        return
    weight_map, total_size = {}, 0
    for path in files:
        _link_or_copy(path, out_dir / path.name)
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                tensor = f.get_slice(key)
                weight_map[key] = path.name
                total_size += math.prod(tensor.get_shape()) * _DTYPE_BYTES[tensor.get_dtype()]
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(out_dir / INDEX_FILE, index)


def _hf_config(trainer_config) -> dict[str, Any]:
    spec = trainer_config.model_spec
    if spec.name == HF_BACKEND_NAME:
        source = Path(trainer_config.hf_model) / CONFIG_FILE
        return json.loads(source.read_text(encoding="utf-8"))
    return native_hf_config(spec.model, Path(trainer_config.hf_assets_path))


def native_hf_config(model_config, tokenizer_dir: Path) -> dict[str, Any]:
    """config.json of a native torchtitan Qwen3 (dense) as Transformers' Qwen3Config writes it."""
    from transformers import Qwen3Config

    try:
        architecture = native_architecture(model_config)
    except UnsupportedModel as e:
        raise ExportError(f"cannot export this native model: {e}.") from e
    config = Qwen3Config(**architecture, architectures=["Qwen3ForCausalLM"], **_special_token_ids(tokenizer_dir))
    return config.to_diff_dict()  # what save_pretrained writes


def _special_token_ids(tokenizer_dir: Path) -> dict[str, int | None]:
    """eos/pad/bos ids as the tokenizer defines them (Qwen3: no bos, eos doubles as pad)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as e:
        raise ExportError(f"hf_assets_path={tokenizer_dir}: no tokenizer to export ({e}).") from e
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    }


def _write_generation_config(trainer_config, config: dict[str, Any], out_dir: Path) -> None:
    if trainer_config.model_spec.name == HF_BACKEND_NAME:
        source = Path(trainer_config.hf_model) / GENERATION_CONFIG_FILE
        if source.is_file():
            shutil.copy2(source, out_dir / GENERATION_CONFIG_FILE)
            return
    from transformers import GenerationConfig, PretrainedConfig

    generation = GenerationConfig.from_model_config(PretrainedConfig.from_dict(config))
    generation.save_pretrained(out_dir)


def _copy_tokenizer(tokenizer_dir: Path, out_dir: Path) -> None:
    copied = [p for p in sorted(tokenizer_dir.iterdir()) if p.is_file() and TOKENIZER_FILES.match(p.name)]
    if not copied:
        raise ExportError(f"hf_assets_path={tokenizer_dir}: no tokenizer files to export.")
    for path in copied:
        shutil.copy2(path, out_dir / path.name)


def _check(model_dir: Path, export_dtype: str, chat: bool) -> None:
    """Keys and shapes against config.json (meta device), the dtype torchtitan cast to, and for a
    chat model that generation stops at the end of a turn."""
    from safetensors import safe_open

    report = check_model_dir(model_dir, load=False, chat=chat)
    if not report.ok:
        raise ExportError("the export does not match its config.json:\n" + "\n".join(report.lines()))
    wanted = _SAFETENSORS_DTYPES[export_dtype]
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                dtype = f.get_slice(key).get_dtype()
                if dtype in _SAFETENSORS_DTYPES.values() and dtype != wanted:
                    raise ExportError(f"{path.name}: {key} is {dtype}, not export_dtype {export_dtype}.")


# bytes per element of the safetensors dtypes a model holds
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

# checkpoint.export_dtype -> the dtype name safetensors headers use
_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # same filesystem (the run dir): no bytes copied
    except OSError:
        shutil.copy2(source, target)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
