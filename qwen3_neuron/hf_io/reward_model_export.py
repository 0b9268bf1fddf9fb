"""trainer=reward_model's export: the causal LM's last HF save and the trained score head -> a
Qwen3ForSequenceClassification dir that `AutoModelForSequenceClassification.from_pretrained` loads.

The HF save holds the causal LM's weights (the state-dict adapter leaves the head out:
`models.score_head`); the trainer wrote the head beside it (`score_head_path`). The export
(`export.export_hf_model`, which calls this when the head is there) writes the weights without
`lm_head.weight` and with `score.weight` (Transformers' keys for the class: `model.*` and `score`),
and config.json with the class's architecture, `num_labels` 1 and a `pad_token_id`: Transformers
reads a sequence's score at its last token that is not the pad token, so it must be set (the
tokenizer's pad token, else its end-of-sequence token, as TRL sets it).

finetune=lora (`adapter_export`): the PEFT adapter dir holds the head beside the adapters, as PEFT
saves a `modules_to_save` module (`base_model.model.score.weight`, `task_type` SEQ_CLS), so
`PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base, num_labels=1),
dir)` scores as the run did; the merged dir is this export of the merged weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

LM_HEAD_KEY = "lm_head.weight"
SCORE_KEY = "score.weight"


def sequence_classification_config(config: dict[str, Any], pad_token_id: int | None) -> dict[str, Any]:
    """A causal LM's config.json as the sequence-classification class with one label."""
    causal = config.get("architectures") or []
    architectures = [name.replace("ForCausalLM", "ForSequenceClassification") for name in causal]
    scored = {**config, "architectures": architectures, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    if scored.get("pad_token_id") is None:
        scored["pad_token_id"] = pad_token_id
    return scored


def write_scored_weights(source_dir: Path, head_file: Path, out_dir: Path, dtype_name: str) -> None:
    """The source dir's safetensors without the LM head, the score head added to the last file (in
    `dtype_name`, the export's dtype); an index when there are several files."""
    import torch
    from safetensors.torch import load_file, save_file

    files = sorted(Path(source_dir).glob("*.safetensors"))
    head = load_file(head_file)[SCORE_KEY].to(getattr(torch, dtype_name))
    weight_map, total_size = {}, 0
    for index, path in enumerate(files):
        weights = {key: value for key, value in load_file(path).items() if key != LM_HEAD_KEY}
        if index == len(files) - 1:
            weights[SCORE_KEY] = head
        name = "model.safetensors" if len(files) == 1 else path.name
        save_file(weights, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(weights, name))
        total_size += sum(math.prod(value.shape) * value.element_size() for value in weights.values())
    if len(files) > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def peft_head(head_file: Path, prefix: str) -> dict:
    """The score head under PEFT's key for a `modules_to_save` module."""
    from safetensors.torch import load_file

    return {f"{prefix}{SCORE_KEY}": load_file(head_file)[SCORE_KEY]}
