"""What global rank 0 exports once every rank has finished training (`worker.train`): the
model (`export`), or finetune=lora's adapter and merged model (`adapter_export`)."""

from __future__ import annotations

from pathlib import Path

from qwen3_neuron.hf_io.adapter_export import export_lora
from qwen3_neuron.hf_io.export import export_after_training


def export_run(trainer_config, run_dir: Path, finetune, export_dir: str | None = None) -> dict[str, str | None]:
    """Export a run whose last save is in HF; return the summary's fields: `export_dir`, and for
    finetune=lora `adapter_dir` (`finetune`: the framework's FinetuneSettings)."""
    if finetune.method == "lora":
        return export_lora(trainer_config, run_dir, finetune, export_dir)
    exported = export_after_training(trainer_config, run_dir, export_dir)
    return {"export_dir": str(exported) if exported else None}
