"""finetune=lora checkpoints: the adapters (and a reward model's score head, trained whole beside
them; with optimizer, lr scheduler, data position, step), never the frozen base.

torchtitan's `CheckpointManager` saves `ModelWrapper(model_parts)`: every weight. Under LoRA the
base never changes and is loaded at every start anyway (checkpointing=from_hf, which the plan
requires), so a periodic checkpoint needs only the adapters: `LoRACheckpointManager` swaps in a
wrapper that holds them alone. The whole model stays in use where torchtitan needs it:

- the initial load (the base from HF safetensors, adapters keep their init);
- a resume: torchtitan ignores `initial_load_*` once the run's folder holds a checkpoint, so the
  base is loaded first, exactly as the first launch did, then the adapter checkpoint on top;
- the last model-only save (the HF save the export reads, or a final model-only DCP).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

from torchtitan.components.checkpointer.base import MODEL, ModelWrapper
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.tools import filesystem
from torchtitan.tools.logging import logger

from qwen3_neuron.finetune.adapter_save import is_adapter_key
from qwen3_neuron.finetune.names import MODULES_TO_SAVE


class AdapterModelWrapper(ModelWrapper):
    """The model's LoRA adapters and the modules trained whole beside them (a reward model's score
    head) only (torchtitan's canonical keys)."""

    def _get_state_dict(self):
        return {key: value for key, value in super()._get_state_dict().items() if is_trained_key(key)}


def is_trained_key(key: str) -> bool:
    """A LoRA run's trained weight: an adapter's, or one of a module saved whole (`MODULES_TO_SAVE`)."""
    return is_adapter_key(key) or key.split(".", 1)[0] in MODULES_TO_SAVE


class LoRACheckpointManager(CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def __init__(self, config: Config, *, model_parts, **kwargs) -> None:
        super().__init__(config, model_parts=model_parts, **kwargs)
        if not self.enable:
            return
        self._whole = self.states[MODEL]
        self.states[MODEL] = AdapterModelWrapper(model_parts)

    @contextlib.contextmanager
    def _whole_model(self):
        adapters, self.states[MODEL] = self.states[MODEL], self._whole
        try:
            yield
        finally:
            self.states[MODEL] = adapters

    def _load(self, step: int = -1) -> bool:
        if not self._resuming(step):
            with self._whole_model():  # the base from initial_load_*
                return super()._load(step)
        self._load_base()
        return super()._load(step)  # adapters, optimizer, lr scheduler, data position, step

    def _save_last_step(self, curr_step: int) -> None:
        if not self.last_save_model_only:  # a full training state: adapters, like the others
            return super()._save_last_step(curr_step)
        with self._whole_model():  # a final model: base + adapters (the HF save drops the adapters)
            return super()._save_last_step(curr_step)

    def _resuming(self, step: int) -> bool:
        if not filesystem.exists(self.folder):
            return False
        return (self._find_load_step() if step == -1 else step) != -1

    def _load_base(self) -> None:
        """The base weights, from where the first launch loaded them."""
        source = self.initial_load_path or (self.sd_adapter.hf_assets_path if self.initial_load_in_hf else None)
        if source is None:
            return  # the plan refuses finetune=lora without a base to load
        logger.info(f"finetune=lora: resuming; loading the base weights from {source} first")
        with self._whole_model():
            self.dcp_load(
                self.states[MODEL].state_dict(),
                checkpoint_id=source,
                from_hf=self.initial_load_in_hf,
                from_quantized=self.initial_load_in_hf_quantized,
            )


def lora_checkpoint_config(checkpoint: CheckpointManager.Config) -> LoRACheckpointManager.Config:
    """The same checkpoint settings, for the adapter-only manager."""
    return LoRACheckpointManager.Config(**{f.name: getattr(checkpoint, f.name) for f in fields(checkpoint) if f.init})
