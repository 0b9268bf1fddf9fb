"""The `data` section -> torchtitan's `dataloader` and `validator.dataloader` configs.

data=tiny / data=c4 leave both as the `dataloader` section wrote them (torchtitan's registered
data sets). The packed kinds (`settings.PACKED_KINDS`) make a `PackedDataLoader.Config` for
training and, when a validation set is named (`data.val_files` or `data.val_fraction`), another
one for torchtitan's `Validator`, which is then switched on. Both sides (plan and workers) call this through
`job.trainer_config`; it reads no data.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchtitan.trainer import Trainer

from qwen3_neuron.data.loader import PackedDataLoader
from qwen3_neuron.data.source import DataSource, SourceFields
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.fields import apply_fields
from qwen3_neuron.job.settings import PACKED_KINDS, DataSettings

DATA_CACHE_DIR = "data_cache"  # in the run dir: datasets' Arrow cache of local files
SOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(SourceFields))  # the defaults of each source


def apply_data(config: Trainer.Config, data: DataSettings, run_dir: Path, trainer: str | None = None,
               tools: list[dict] | None = None) -> None:  # fmt: skip
    """Set `config.dataloader` (and the validator's) from the data section, for packed kinds, as
    `trainer` reads them (trainer=kto: data=preference's rows as KTO's units); `tools`: data=prompts,
    the schemas of GRPO's tools, rendered with every prompt."""
    if data.kind not in PACKED_KINDS:
        _refuse_unused(data)
        return
    train_sources = training_sources(data, trainer)
    if trainer == "reward_model":  # each sequence whole, scored at its last token, the margin carried
        train_sources = [dataclasses.replace(source, scored_pairs=True) for source in train_sources]
    if tools and data.kind == "prompts":
        train_sources = [dataclasses.replace(source, tools=tools) for source in train_sources]
    cache_dir = str(Path(run_dir) / DATA_CACHE_DIR)
    common = {"streaming": data.streaming, "cache_dir": cache_dir}
    config.dataloader = PackedDataLoader.Config(sources=train_sources, role="train", **common)
    validation = validation_sources(data, train_sources)
    if validation:
        config.validator.enable = True
        config.validator.dataloader = PackedDataLoader.Config(sources=validation, role="validation", **common)


def training_sources(data: DataSettings, trainer: str | None = None) -> list[DataSource]:
    if not 0 <= data.val_fraction < 1:
        raise ConfigError(f"data.val_fraction={data.val_fraction}: a fraction of the rows, 0 <= f < 1")
    if data.val_fraction and data.val_files:
        raise ConfigError("data.val_fraction and data.val_files both name a validation set; set one")
    defaults = {name: getattr(data, name) for name in SOURCE_FIELDS}
    if data.kind != "mix":
        if data.sources:
            raise ConfigError(f"data.sources is for data=mix; data={data.kind} reads data.files or data.hf_dataset")
        row_format = "kto" if trainer == "kto" else data.kind
        source = _checked_source(DataSource(format=row_format, **defaults), "data")
        return [_checked_packing(source, data.packing != DataSettings.packing, "data")]
    if not data.sources:
        raise ConfigError("data=mix needs data.sources: a list of {files or hf_dataset, weight, format}")
    sources = []
    for index, values in enumerate(data.sources):
        base = DataSource(**{**defaults, "files": None, "hf_dataset": None})
        source = apply_fields(base, values, f"data.sources[{index}]")
        if not source.weight > 0:
            raise ConfigError(f"data.sources[{index}].weight={source.weight}: a weight must be > 0")
        source = _checked_source(source, f"data.sources[{index}]")
        sources.append(_checked_packing(source, "packing" in values, f"data.sources[{index}]"))
    return sources


def validation_sources(data: DataSettings, train_sources: list[DataSource]) -> list[DataSource]:
    if data.val_fraction:
        return train_sources  # the same sources, their other side of the carve
    if not data.val_files:
        return []
    first = train_sources[0]
    return [dataclasses.replace(first, files=data.val_files, hf_dataset=None, val_fraction=0.0, weight=1.0)]


def _checked_source(source: DataSource, key: str) -> DataSource:
    if bool(source.files) == bool(source.hf_dataset):
        raise ConfigError(f"{key}: set exactly one of files or hf_dataset (got {'both' if source.files else 'neither'}; "
                          f"e.g. {key}.files=/path/to/train.jsonl)")  # fmt: skip
    if source.format != "text" and source.overlong == "split":
        raise ConfigError(f"{key}.overlong=split is for text; a conversation cut in two loses its context. "
                          "Use truncate or drop")  # fmt: skip
    if source.format in ("preference", "kto") and key != "data":
        raise ConfigError(f"{key}.format={source.format}: preference rows train with their own objective; "
                          "use data=preference, not a source of data=mix")  # fmt: skip
    return source


def _checked_packing(source: DataSource, packing_set: bool, key: str) -> DataSource:
    if source.pack_buffer < 1:
        raise ConfigError(f"{key}.pack_buffer={source.pack_buffer}: the number of documents waiting to be "
                          "packed, at least 1 (default 64)")  # fmt: skip
    if packing_set and source.format == "text" and source.overlong == "split":
        raise ConfigError(f"{key}.packing={source.packing}: with overlong=split text documents run on across "
                          "samples (no padding to avoid); packing places whole documents: set "
                          f"{key}.overlong=truncate or drop to use it")  # fmt: skip
    return source


def _refuse_unused(data: DataSettings) -> None:
    """data=tiny / c4 read torchtitan's registered sets: a data.* key set for files would be ignored."""
    default = DataSettings(kind=data.kind)
    for f in dataclasses.fields(DataSettings):
        # max_dropped: conf/config.yaml sets it for every data option (data=tiny's too, unread)
        if f.name not in ("kind", "max_dropped") and getattr(data, f.name) != getattr(default, f.name):
            raise ConfigError(
                f"data.{f.name} applies to data={'|'.join(PACKED_KINDS)}; data={data.kind} reads torchtitan's "
                f"registered data set (the dataloader section). E.g. data=text data.{f.name}=..."
            )
