"""Worker side of finetune=lora: after the last step, the adapters as trained, for the export.

torchtitan's last HF save (checkpointing=export_hf) goes through the model's state-dict adapter,
whose `to_hf` knows no `lora_a`/`lora_b` keys and drops them: the save holds the frozen base
only. So every rank gathers the adapters (rank x (in + out) per projection: small) and rank 0
writes them, under torchtitan's own keys, into that save's step dir
(`step-N/lora/adapter.safetensors`), where rank 0's export (`hf_io.adapter_export`) turns them
into PEFT's format and merges them into the base.
"""

from __future__ import annotations

from pathlib import Path

from qwen3_neuron.finetune.names import ADAPTER_MODULES

ADAPTER_SUBDIR = "lora"
RAW_ADAPTER_FILE = "adapter.safetensors"
LORA_KEY_PARTS = tuple(f".{name}." for name in ADAPTER_MODULES)


def is_adapter_key(key: str) -> bool:
    return any(part in key for part in LORA_KEY_PARTS)


def raw_adapter_path(step_dir: Path) -> Path:
    return step_dir / ADAPTER_SUBDIR / RAW_ADAPTER_FILE


def save_adapters_for_export(trainer, config) -> Path | None:
    """Write the trained adapters beside the last HF save; None when the run exports nothing.
    Every rank must call it (gathering a sharded adapter is a collective); rank 0 writes, and the
    worker's barrier before the export waits for it."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    checkpoint = config.checkpoint
    if not (checkpoint.enable and checkpoint.last_save_in_hf):
        return None
    adapters = {}
    for part in trainer.model_parts:
        for key, value in part.state_dict().items():  # torchtitan's canonical keys, a fixed order
            if is_adapter_key(key):
                full = value.full_tensor() if isinstance(value, DTensor) else value
                adapters[key] = full.detach().to("cpu", torch.float32).contiguous()
    step_dir = Path(config.dump_folder) / checkpoint.folder / f"step-{trainer.step}"
    path = raw_adapter_path(step_dir)
    if not dist.is_initialized() or dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(adapters, str(path), metadata={"format": "pt", "step": str(trainer.step)})
    return path
