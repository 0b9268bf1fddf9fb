"""One run's config as every stage takes it: the composed config (resolved), the framework's
settings parsed from it once, and model=hf's dir with its config.json read once.

The launcher parses it (`Job.parse`), checks torchtitan's keys, settles it (`Job.settled`: the
device resolved, model=hf's dir found as a local path, the NEFF cache chosen, the framework's
own checks made) and writes it, `job.yaml` (`job.record.record_job`), before torchrun starts.
Every rank reads that file once (`run_dir.read_job`): it learns its device from it
(`recorded_device`) before it imports torchtitan, then parses it (`Job.recorded`). So a worker
never resolves the device, looks a model up or checks the settings again.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError, DeviceUnavailableError
from qwen3_neuron.job.settings import Settings, check_model_logged, check_settings, parse_settings, tracking_store
from qwen3_neuron.job.user_paths import absolute_paths
from qwen3_neuron.models.hf.model_dir import HFModelDir, find_model_dir, read_model_dir


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
        """A settled job's serialised form (`job.yaml`, as `read_job` returns it) read back: its
        device resolved, and model=hf's dir the local path the launcher found."""
        job = cls.parse(composed)
        model = job.settings.model
        return dataclasses.replace(job, model_dir=read_model_dir(Path(model.hf_model))) if model.kind == "hf" else job

    @property
    def device(self) -> str:
        """The device type; resolved ("auto" no longer) once settled."""
        return self.settings.device.type

    def settled(self) -> Job:
        """The job as the workers take it: model=hf's dir found (a Hub id is never looked up
        again in a worker), the device resolved (auto -> neuron, cuda or cpu; an explicit one
        that is not here is refused, unless a dry run plans for it), device=neuron's NEFF cache
        dir chosen (a resumed run compiles into the same), every relative path the run reads made
        absolute (`user_paths`: a resume from another directory reads the same files), tracking=mlflow's
        store resolved (a relative path made absolute), and the framework's own sections checked on
        that device (`check_settings`: no torchtitan needed)."""
        composed = absolute_paths(self.composed, os.getcwd())
        job = self  # parsed again only where a path changed (the settings are parsed once a launch otherwise)
        if composed != self.composed:
            job = dataclasses.replace(self, composed=composed, settings=parse_settings(composed))
        if self.settings.model.kind == "hf":
            found = find_model_dir(self.settings.model.hf_model)
            job = dataclasses.replace(job._with("model", hf_model=str(found.path)), model_dir=found)
        try:
            device = devices.resolve_device(self.device, dry_run=self.settings.run.dry_run)
        except DeviceUnavailableError as e:
            raise ConfigError(f"device.type={self.device}: {e}") from e
        job = job._with("device", type=device)
        if self.settings.run.python_path is None:  # what a resume from another directory imports again
            job = job._with("run", python_path=devices.launch_python_path())
        if device == "neuron":
            job = job._with("device", cache_dir=str(devices.neff_cache_dir(self.settings.device.cache_dir)[0]))
        check_settings(job.settings, device)
        check_model_logged(job.settings.tracking, job.composed)
        if job.settings.tracking.kind == "mlflow":  # the store a resume from any directory logs to
            job = job._with("tracking", uri=tracking_store(job.settings.tracking.uri))
        return job

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
