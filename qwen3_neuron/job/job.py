"""One run's config as every stage takes it: the composed config (resolved), the framework's
settings parsed from it once, and model=hf's dir with its config.json read once.

The launcher parses it (`Job.parse`), checks torchtitan's keys, and settles it (`Job.settled`:
the device resolved, model=hf's dir found as a local path) before torchrun starts. The settled
job travels to local rank 0 in the plan request (`run_dir.Handoff`), which plans, records and
trains with it; every other rank reads it back from its record, `job.yaml` (`Job.read`). So a
worker never resolves the device or looks a model up again, and each learns its device from the
job (`recorded_device`) before it imports torchtitan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError, DeviceUnavailableError
from qwen3_neuron.job.settings import Settings, parse_settings
from qwen3_neuron.models.hf.model_dir import HFModelDir, find_model_dir, read_model_dir
from qwen3_neuron.run_dir import read_job


@dataclass(frozen=True)
class Job:
    composed: dict[str, Any]
    """The composed config, resolved: torchtitan's sections and the framework's (job.yaml)."""

    settings: Settings
    """The framework's own sections, parsed from `composed`."""

    model_dir: HFModelDir | None = None
    """model=hf's dir and its config.json, once settled; None for the other models."""

    @classmethod
    def parse(cls, composed: Mapping[str, Any]) -> Job:
        """Checks every key and type of the framework's sections (ConfigError)."""
        return cls(dict(composed), parse_settings(composed))

    @classmethod
    def recorded(cls, composed: Mapping[str, Any]) -> Job:
        """A settled job's serialised form (job.yaml, the plan request) read back: its device
        resolved, and model=hf's dir the local path the launcher found."""
        job = cls.parse(composed)
        model = job.settings.model
        return dataclasses.replace(job, model_dir=read_model_dir(Path(model.hf_model))) if model.kind == "hf" else job

    @classmethod
    def read(cls, run_dir: Path) -> Job:
        """The job a run dir recorded (`job.yaml`)."""
        return cls.recorded(read_job(run_dir))

    @property
    def device(self) -> str:
        """The device type; resolved ("auto" no longer) once settled."""
        return self.settings.device.type

    def settled(self) -> Job:
        """The job as the workers take it: model=hf's dir found (a Hub id is never looked up
        again in a worker) and the device resolved (auto -> neuron, cuda or cpu; an explicit one
        that is not here is refused, unless a dry run plans for it)."""
        job = self
        if self.settings.model.kind == "hf":
            found = find_model_dir(self.settings.model.hf_model)
            job = dataclasses.replace(job._with("model", hf_model=str(found.path)), model_dir=found)
        try:
            device = devices.resolve_device(self.device, dry_run=self.settings.run.dry_run)
        except DeviceUnavailableError as e:
            raise ConfigError(f"device.type={self.device}: {e}") from e
        return job._with("device", type=device)

    def with_neff_cache(self, cache_dir: str | None) -> Job:
        """The NEFF cache dir the plan settled, recorded: a resumed run compiles into the same."""
        return self._with("device", cache_dir=cache_dir)

    def _with(self, name: str, **values: Any) -> Job:
        """This job with `values` set in one of the framework's sections, in both its forms."""
        composed = {**self.composed, name: {**(self.composed.get(name) or {}), **values}}
        section = dataclasses.replace(getattr(self.settings, name), **values)
        settings = dataclasses.replace(self.settings, **{name: section})
        return dataclasses.replace(self, composed=composed, settings=settings)


def recorded_device(job: Mapping[str, Any]) -> str:
    """The resolved device of a settled job's serialised form: what a worker installs its
    device's fixes for before it imports torchtitan (no parse needed for that)."""
    return job["device"]["type"]
