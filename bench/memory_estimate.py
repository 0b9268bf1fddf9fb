"""The plan's memory estimate per rank against what training runs measure, on this machine.

Each config trains a few steps through `launch.py`; the plan writes `memory_estimate.json`, rank 0
writes `tensor_memory.json` (qwen3_neuron.worker.tensor_memory: local parameter, gradient and
optimizer-state sizes + the peak of the bytes saved for backward; on CUDA the allocator's peak),
and `summary.json` carries both totals. Under activation checkpointing the estimate also counts
the block recomputed in backward, which the CPU measurement cannot see (it is held under torch
checkpoint's own saved-tensor hooks); the ratio compares like with like: measured / (estimate -
recompute).

    .venv/bin/python -m bench.memory_estimate             # from the repo root: 8 tiny runs, a few minutes
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL_AC = "+activation_checkpoint._target_=torchtitan.distributed.activation_checkpoint.FullAC.Config"
SHORT = ("training.steps=3", "metrics.enable_tensorboard=false", "lr_scheduler.warmup_steps=1")

# name -> overrides: models (tiny native, debugmodel, tiny_moe, hf tiny), layouts (1 rank, 2-rank
# FSDP, TP 2), activation checkpointing and seq_len differ
CONFIGS = {
    "tiny, 1 rank, seq 256": ["run.nproc_per_node=1", "training.seq_len=256"],
    "tiny, 1 rank, seq 512": ["run.nproc_per_node=1", "training.seq_len=512", "training.local_batch_size=2"],
    "tiny, FSDP 2, seq 256": ["run.nproc_per_node=2", "training.seq_len=256"],
    "tiny, 1 rank, full AC": ["run.nproc_per_node=1", "training.seq_len=256", FULL_AC],
    "tiny, TP 2, seq 256": [
        "run.nproc_per_node=2", "parallelism=tp", "parallelism.spmd_backend=partial_dtensor", "training.seq_len=256",
    ],
    "debugmodel, FSDP 2, seq 128": [
        "model.flavor=debugmodel", "run.nproc_per_node=2", "training.seq_len=128", "training.local_batch_size=2",
    ],
    "tiny_moe, 1 rank, seq 256": ["model=moe", "run.nproc_per_node=1", "training.seq_len=256"],
    "hf tiny, FSDP 2, seq 256": ["model=hf", "run.nproc_per_node=2", "training.seq_len=256"],
}  # fmt: skip


def measure(name: str, overrides: list[str], root: Path) -> dict:
    run_dir = root / name.replace(" ", "_").replace(",", "")
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *SHORT, *overrides],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{name}: launch.py exited {result.returncode}\n{result.stderr[-2000:]}")
    estimate = json.loads((run_dir / "memory_estimate.json").read_text())
    measured = json.loads((run_dir / "tensor_memory.json").read_text())
    comparable = estimate["per_rank_gib"] - estimate["recompute_gib"]
    return {
        "name": name,
        "estimate": estimate["per_rank_gib"] * 1024,
        "recompute": estimate["recompute_gib"] * 1024,
        "measured": measured["tensor_memory_gib"] * 1024,
        "ratio": measured["tensor_memory_gib"] / comparable,
        "static": (estimate["parameters_gib"] + estimate["gradients_gib"] + estimate["optimizer_gib"]) * 1024,
        "static_measured": (measured["parameters_gib"] + measured["gradients_gib"] + measured["optimizer_gib"]) * 1024,
        "activations": estimate["activations_gib"] * 1024,
        "activations_measured": measured["activations_gib"] * 1024,
    }


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="memory-estimate-") as root:
        for name, overrides in CONFIGS.items():
            rows.append(measure(name, overrides, Path(root)))
            print(f"measured {name}", file=sys.stderr, flush=True)
    print(
        "| config | estimate MiB | of it recompute | measured MiB | measured / (estimate - recompute) "
        "| static est. / meas. | activations est. / meas. |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['estimate']:.1f} | {r['recompute']:.1f} | {r['measured']:.1f} | {r['ratio']:.3f} "
            f"| {r['static']:.1f} / {r['static_measured']:.1f} | {r['activations']:.1f} / {r['activations_measured']:.1f} |"
        )
    missed = [r["name"] for r in rows if abs(r["ratio"] - 1) > 0.25]
    print(
        f"\nwithin 25%: {len(rows) - len(missed)} of {len(rows)}" + (f"; missed: {', '.join(missed)}" if missed else "")
    )


if __name__ == "__main__":
    main()
