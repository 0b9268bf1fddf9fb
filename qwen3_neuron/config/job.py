"""One run's config as every stage takes it: the composed config (resolved), the framework's
settings parsed from it once, and model=hf's dir with its config.json read once.

The launcher parses it; local rank 0 gets it in the plan request (`run_dir.Handoff`) and plans,
records and trains with it; every other rank reads it back from its record, `job.yaml`
(`Job.read`). What the plan settles (the device, model=hf's local dir, the NEFF cache dir) is in
the recorded job (`Job.settled`), so a worker never resolves them again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from qwen3_neuron.config.settings import Settings, parse_settings
from qwen3_neuron.models.hf.model_dir import HFModelDir, read_model_dir
from qwen3_neuron.run_dir import read_job


@dataclass(frozen=True)
class Job:
    composed: dict[str, Any]
    """The composed config, resolved: torchtitan's sections and the framework's (job.yaml)."""

    settings: Settings
    """The framework's own sections, parsed from `composed`."""

    model_dir: HFModelDir | None = None
    """model=hf's dir and its config.json; None for the other models."""

    @classmethod
    def parse(cls, composed: Mapping[str, Any]) -> Job:
        """Checks every key and type of the framework's sections (ConfigError)."""
        return cls(dict(composed), parse_settings(composed))

    @classmethod
    def read(cls, run_dir: Path) -> Job:
        """The job a run dir recorded: its device and model dir already settled."""
        job = cls.parse(read_job(run_dir))
        model = job.settings.model
        return dataclasses.replace(job, model_dir=read_model_dir(Path(model.hf_model))) if model.kind == "hf" else job

    @property
    def device(self) -> str:
        """The device type; resolved ("auto" no longer) once settled."""
        return self.settings.device.type

    def settled(self, device: str, cache_dir: str | None, model_dir: HFModelDir | None) -> Job:
        """The job as the workers take it: the device and its NEFF cache dir resolved (a resumed
        run compiles into the same cache), and model=hf's dir as the local path found here (a Hub
        id is never looked up again in a worker)."""
        device_section = {**(self.composed.get("device") or {}), "type": device, "cache_dir": cache_dir}
        composed = {**self.composed, "device": device_section}
        settings = dataclasses.replace(
            self.settings, device=dataclasses.replace(self.settings.device, type=device, cache_dir=cache_dir)
        )
        if model_dir is not None:
            hf_model = str(model_dir.path)
            composed["model"] = {**composed["model"], "hf_model": hf_model}
            settings = dataclasses.replace(settings, model=dataclasses.replace(settings.model, hf_model=hf_model))
        return Job(composed, settings, model_dir)
