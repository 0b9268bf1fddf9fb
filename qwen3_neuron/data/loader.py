"""`PackedDataLoader`: torchtitan's dataloader component for local files and cached HF data sets.

A torchtitan `ParallelAwareDataloader` (a `StatefulDataLoader`: its position is checkpointed)
with its own `Config`, so it is set as `dataloader` (training) or `validator.dataloader`
(validation) like any torchtitan loader; `job.trainer_config` makes it from the `data` section. One
source is one `PackedDataset`; several (data=mix) are weighted through torchtitan's own
`InterleavedDataset`, each source packed on its own, so a weight is a share of samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets.interleaved import InterleavedDataset

from qwen3_neuron.data.dataset import PackedDataset
from qwen3_neuron.data.source import DataSource


class PackedDataLoader(ParallelAwareDataloader):
    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        sources: list[DataSource] = field(default_factory=list)
        """Where rows come from; several are interleaved by their `weight`."""

        role: Literal["train", "validation"] = "train"
        """Which side of each source's `val_fraction` carve this loader reads."""

        infinite: bool = True
        """Re-loop each source when it runs out (torchtitan's Validator sets this itself)."""

        streaming: bool = False
        """Stream rows instead of reading them map-style (corpora larger than memory)."""

        cache_dir: str | None = None
        """Where `datasets` keeps the Arrow cache of local files (the run dir's data_cache/)."""

        seed: int = 42
        """Interleaving seed (data=mix)."""

        def __post_init__(self) -> None:
            if not self.sources:
                raise ValueError("at least one data source is needed")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs,
    ):
        datasets = [
            PackedDataset(
                source, tokenizer, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size,
                infinite=config.infinite, streaming=config.streaming, role=config.role, cache_dir=config.cache_dir,
            )
            for source in config.sources
        ]  # fmt: skip
        if len(datasets) == 1:
            dataset = datasets[0]
        else:
            dataset = InterleavedDataset(datasets, weights=[s.weight for s in config.sources], seed=config.seed)
        self.packed_datasets = datasets
        dataloader_kwargs = {
            "num_workers": config.num_workers,
            "persistent_workers": config.persistent_workers,
            "pin_memory": config.pin_memory,
            "prefetch_factor": config.prefetch_factor,
            "snapshot_every_n_steps": snapshot_every_n_steps,
            "batch_size": local_batch_size,
        }
        super().__init__(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, **dataloader_kwargs)

    def data_stats(self) -> dict[str, int] | None:
        """The counts of this rank's sources added up (None with num_workers > 0: the datasets
        then live in the worker processes, which keep their own counts)."""
        if self._num_workers_in_use():
            return None
        per_source = [d.data_stats() for d in self.packed_datasets]
        counts = {name: sum(stats[name] for stats in per_source) for name in per_source[0] if name != "examples"}
        examples: dict[str, list[str]] = {}
        for stats in per_source:
            for fate, rows in stats["examples"].items():
                examples.setdefault(fate, []).extend(rows)
        return {**counts, "examples": examples}

    def _num_workers_in_use(self) -> int:
        return getattr(self, "num_workers", 0)
