"""checkpointing=[periodic,export_hf]: the last step is a full checkpoint as well as the export.

torchtitan's last save is the HF export when `last_save_in_hf` (model only), so a run that also
checkpoints periodically would keep as its newest checkpoint the last one before its last step,
and extending it (`run.resume=<dir> training.steps=M`) would train those steps again. Every rank
also writes the full training state of the last step (the model or LoRA's adapters, optimizer,
lr scheduler, data position, step, DPO's frozen reference) as `full-N`, which torchtitan never
takes for a checkpoint; global rank 0 renames it `step-N` once the export has consumed (and
deleted) the HF save of that name. Until then a resume continues from the newest periodic one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

FULL_PREFIX = "full-"


def keeps_a_full_last_step(trainer_config, composed_checkpoint: Mapping) -> bool:
    """An HF export with periodic checkpoints (the only checkpointing option that sets an interval)."""
    checkpoint = trainer_config.checkpoint
    return bool(checkpoint.enable and checkpoint.last_save_in_hf and "interval" in composed_checkpoint)


def save_full_last_step(trainer) -> None:
    """Every rank: its part of the last step's full training state, beside the HF save."""
    from torchtitan.components.checkpointer.dcp import AsyncMode

    checkpointer = trainer.checkpointer
    checkpointer.dcp_save(
        checkpointer._flattened_model_states_sd(),
        checkpoint_id=str(Path(checkpointer.folder) / f"{FULL_PREFIX}{trainer.step}"),
        async_mode=AsyncMode.DISABLED,
        enable_garbage_collection=True,
    )


def promote_full_last_step(checkpoint_dir: Path) -> None:
    """Global rank 0, after the export: `full-N` becomes the run's newest checkpoint, `step-N`."""
    for full in checkpoint_dir.glob(f"{FULL_PREFIX}*"):
        step_dir = checkpoint_dir / f"step-{full.name.removeprefix(FULL_PREFIX)}"
        if not step_dir.exists():  # the HF save of that step is gone (exported)
            full.rename(step_dir)
