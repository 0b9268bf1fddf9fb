"""finetune=lora after training: `<run dir>/hf_adapter` (PEFT) and `<run dir>/hf_export` (merged).

The run's last HF save (`checkpoint/step-N/`, torchtitan's) holds the frozen base in HF keys; the
workers wrote the trained adapters beside it (`finetune.adapter_save`). From the two:

- `hf_adapter/`: `adapter_config.json` (PEFT's own `LoraConfig.save_pretrained`) and
  `adapter_model.safetensors` in PEFT's keys (`finetune.peft_format`), in `export_dtype`
  (trainer=reward_model: with the score head, `hf_io.reward_model_export`);
  `peft.PeftModel.from_pretrained(base, dir)` loads it onto the base it was trained from, which
  `base_model_name_or_path` names (the HF dir the run loaded, when it loaded one);
- `hf_export/` (unless `finetune.merge_export=false`): the base with W + alpha/r B A merged in,
  one safetensors file at a time (memory: one file), then assembled like any export
  (`export.export_hf_model`: config.json, tokenizer, key/shape check).

Both are built aside and renamed into place (`assets.atomic_dir`); the consumed save is deleted
last, so a failed export leaves the save for a retry and never a dir that looks complete.
"""

from __future__ import annotations

import logging
from pathlib import Path

from qwen3_neuron.assets.atomic_dir import building
from qwen3_neuron.errors import ExportError
from qwen3_neuron.finetune.adapter_save import ADAPTER_SUBDIR, raw_adapter_path
from qwen3_neuron.finetune.names import MODULES_TO_SAVE
from qwen3_neuron.finetune.peft_format import (
    ADAPTER_WEIGHTS_FILE,
    PEFT_PREFIX,
    covered_hf_modules,
    lora_config,
    merged,
    to_peft,
)
from qwen3_neuron.hf_io.export import EXPORT_DIR_NAME, export_hf_model, last_hf_save, remove_hf_save
from qwen3_neuron.hf_io.reward_model_export import peft_head
from qwen3_neuron.models.hf.model_dir import score_head_path

logger = logging.getLogger(__name__)

ADAPTER_DIR_NAME = "hf_adapter"
_MERGED_SUBDIR = "merged"  # inside step-N/lora/: the merged safetensors, until linked into hf_export


def export_lora(trainer_config, run_dir: Path, finetune, export_dir: str | None = None) -> dict[str, str | None]:
    """Write hf_adapter (and the merged hf_export); return {"adapter_dir": ..., "export_dir": ...}."""
    from safetensors.torch import load_file, save_file

    checkpoint_dir = Path(trainer_config.dump_folder) / trainer_config.checkpoint.folder
    _, step_dir = last_hf_save(checkpoint_dir)
    raw = raw_adapter_path(step_dir)
    if not raw.is_file():
        raise ExportError(f"{raw}: the workers wrote no adapters beside the last HF save.")
    dtype = _torch_dtype(trainer_config.checkpoint.export_dtype)
    peft_state = to_peft(load_file(raw), trainer_config.model_spec, trainer_config.hf_assets_path)
    head = score_head_path(step_dir)  # trainer=reward_model: the score head, trained whole
    saved_whole = peft_head(head, PEFT_PREFIX) if head.is_file() else {}
    peft_state = {key: value.to(dtype) for key, value in {**peft_state, **saved_whole}.items()}
    adapter_dir = run_dir / ADAPTER_DIR_NAME
    with building(adapter_dir) as tmp_dir:
        write_adapter(peft_state, finetune, _base_model(trainer_config), tmp_dir,
                      sequence_classification=bool(saved_whole))  # fmt: skip
    logger.info("exported the LoRA adapter to %s", adapter_dir)
    if not finetune.merge_export:
        remove_hf_save(checkpoint_dir, step_dir)
        return {"adapter_dir": str(adapter_dir), "export_dir": None}
    merged_dir = step_dir / ADAPTER_SUBDIR / _MERGED_SUBDIR
    merged_dir.mkdir(exist_ok=True)
    scaling = finetune.alpha / finetune.rank
    for path in sorted(step_dir.glob("*.safetensors")):
        weights = load_file(path)
        save_file(_merge_file(weights, peft_state, scaling), str(merged_dir / path.name), metadata={"format": "pt"})
    target = run_dir / (export_dir or EXPORT_DIR_NAME)
    export_hf_model(trainer_config, target, weights_dir=merged_dir)
    return {"adapter_dir": str(adapter_dir), "export_dir": str(target)}


def write_adapter(peft_state: dict, finetune, base_model: str | None, out_dir: Path,
                  sequence_classification: bool = False) -> None:  # fmt: skip
    """adapter_config.json (PEFT's LoraConfig.save_pretrained) + adapter_model.safetensors
    (`sequence_classification`: the score head among them, PEFT's `modules_to_save`)."""
    from safetensors.torch import save_file

    adapters = {key: value for key, value in peft_state.items() if ".lora_" in key}
    saved_whole = list(MODULES_TO_SAVE) if sequence_classification else None
    lora_config(finetune, covered_hf_modules(adapters), base_model, saved_whole).save_pretrained(str(out_dir))
    save_file(peft_state, str(Path(out_dir) / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})


def _merge_file(weights: dict, peft_state: dict, scaling: float) -> dict:
    """The base weights of one safetensors file with their adapters merged in."""
    out = {}
    for key, weight in weights.items():
        module = PEFT_PREFIX + key.removesuffix(".weight")
        lora_a, lora_b = peft_state.get(f"{module}.lora_A.weight"), peft_state.get(f"{module}.lora_B.weight")
        out[key] = weight if lora_a is None else merged(weight, lora_a, lora_b, scaling)
    return out


def _base_model(trainer_config) -> str | None:
    """The HF dir the base weights were loaded from, for PEFT's `base_model_name_or_path`."""
    checkpoint = trainer_config.checkpoint
    if checkpoint.initial_load_in_hf:
        return checkpoint.initial_load_path or trainer_config.hf_assets_path
    return checkpoint.initial_load_path


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
