"""Is the input pipeline ever what the trainer waits for? Measured on the tiny assets.

    .venv/bin/python bench/data_throughput.py [--samples 200] [--repeats 3] [--steps 8]

1. Reading + tokenizing + packing on one rank, in this process, through the very dataset the
   workers use (`PackedDataset`): tokens/s for data=text and data=chat, `--repeats` runs
   interleaved (text, chat, text, chat, ...) so machine noise hits both alike; the median.
2. One short training run per kind (`launch.py`, 2 CPU ranks, the same seq_len and batch): the
   trainer's tokens/s per rank (median of steps >= 2) and the share of step time torchtitan
   measured waiting for data (`time_metrics/data_loading(%)`, median of steps >= 2).

Printed per kind: pipeline tokens/s, trainer tokens/s per rank, their ratio (> 1: the pipeline
is faster than the trainer consumes), and the data-wait share. On a Trainium or GPU node the
trainer is far faster than here: the ratio there is what to watch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen3_neuron.assets.build import build_assets

SEQ_LEN, BATCH = 256, 4  # the default job's


def pipeline_tokens_per_second(kind: str, samples: int, cache_dir: str) -> float:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from qwen3_neuron.data.dataset import PackedDataset
    from qwen3_neuron.data.source import DataSource

    paths = build_assets()
    files = paths.text_train_file if kind == "text" else paths.chat_train_file
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(paths.tokenizer_dir))
    source = DataSource(files=str(files), format=kind, overlong="split" if kind == "text" else "truncate")
    started = time.perf_counter()  # opening the files is part of it (the Arrow cache is warm after run 1)
    dataset = PackedDataset(source, tokenizer, seq_len=SEQ_LEN, cache_dir=cache_dir)
    iterator = iter(dataset)
    for _ in range(samples):
        next(iterator)
    return samples * SEQ_LEN / (time.perf_counter() - started)


def trainer_numbers(kind: str, steps: int, run_dir: Path) -> tuple[float, float | None]:
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", f"data={kind}",
         f"training.steps={steps}", f"training.seq_len={SEQ_LEN}", f"training.local_batch_size={BATCH}",
         "validator.enable=false", "metrics.enable_tensorboard=false"],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"data={kind} run failed:\n{result.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if "loss" in r and r["step"] >= 2]
    tps = statistics.median(r["tps_per_device"] for r in steady)
    waits = [r["data_loading_pct"] for r in steady if "data_loading_pct" in r]
    return tps, statistics.median(waits) if waits else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="packed samples per pipeline measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="training steps per trainer run")
    args = parser.parse_args()
    kinds = ("text", "chat")
    with tempfile.TemporaryDirectory(prefix="data-bench-") as scratch:
        pipeline = {kind: [] for kind in kinds}
        for _ in range(args.repeats):
            for kind in kinds:
                pipeline[kind].append(pipeline_tokens_per_second(kind, args.samples, f"{scratch}/cache"))
        trainer = {kind: trainer_numbers(kind, args.steps, Path(scratch) / f"run-{kind}") for kind in kinds}
    print(f"seq_len {SEQ_LEN}, batch {BATCH}, {args.samples} samples x {args.repeats} repeats (one rank)")
    print(f"{'data':6} {'pipeline tok/s':>16} {'trainer tok/s/rank':>19} {'ratio':>8} {'data wait':>10}")
    for kind in kinds:
        piped = statistics.median(pipeline[kind])
        trained, wait = trainer[kind]
        spread = ", ".join(f"{v:,.0f}" for v in pipeline[kind])
        wait_text = f"{wait:.2f}%" if wait is not None else "n/a"
        print(f"{kind:6} {piped:16,.0f} {trained:19,.0f} {piped / trained:8.1f} {wait_text:>10}   (runs: {spread})")


if __name__ == "__main__":
    main()
