"""How much of each sample is padding, per packing, and what that does to trained tokens per second.

    .venv/bin/python -m bench.packing [--repeats 3] [--steps 8] [--conversations 1500]

1. Packing efficiency (tokens that are not padding / all tokens) of `data.packing=greedy` and
   `best_fit` (the default, `data.pack_buffer=64`), through the very dataset the workers use
   (`PackedDataset`, one rank, the whole set once), on
   - the tiny chat set at the default shape (seq_len 256), and
   - a synthetic long-tailed chat set at seq_len 2048: one user and one assistant turn of the
     tiny assets' docstring words, lengths drawn log-normal (median about 250 tokens: many short
     conversations, a few near or past seq_len, truncated as data.overlong=truncate does),
   beside two bounds no packer can beat: the issue's, total tokens / (ceil(total / seq_len) x
   seq_len), and Martello and Toth's L2 lower bound on the number of samples, which also counts
   that no two documents longer than seq_len / 2 share a sample. data=text (documents flow on
   across samples) is measured on the tiny text set for comparison. Each pass also gives the
   pipeline's tokens/s; the packings alternate, `--repeats` times. Then best fit's efficiency
   per `data.pack_buffer` (16 to 256), from the same documents in the same order.
2. A short training run per packing on the long-tailed set (launch.py, 2 CPU ranks, seq_len 2048,
   batch 1), alternating, `--repeats` times: the trainer's tokens/s per rank (median of steps >= 2)
   and the trained tokens/s: that times the share of the tokens handed out that carry a loss
   (summary.json's data_stats: label_tokens / tokens), the run's own and the whole set's (from
   part 1: a short best-fit run starts on the longest conversations of its first buffer, whose
   share of assistant tokens is higher). Their ratio best_fit / greedy, and the pipeline's
   tokens/s over the trainer's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen3_neuron.assets.build import build_assets, stdlib_docstrings

PACKINGS = ("greedy", "best_fit")
TINY_SEQ_LEN, LONG_SEQ_LEN = 256, 2048
BUFFERS = (16, 32, 64, 128, 256)  # data.pack_buffer values compared


def write_long_tailed(path: Path, conversations: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = " ".join(stdlib_docstrings()).split()
    rows = []
    for _ in range(conversations):
        length = int(rng.lognormvariate(math.log(100), 1.0))  # words, about two tokens each
        start = rng.randrange(len(words) - length - 40)
        question, answer = words[start : start + 20], words[start + 20 : start + 20 + length]
        rows.append({"messages": [{"role": "user", "content": " ".join(question)},
                                  {"role": "assistant", "content": " ".join(answer)}]})  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pack(files: Path, form: str, seq_len: int, packing: str, cache_dir: str) -> dict:
    """One pass over the whole set on one rank: its data_stats, the pipeline's tokens/s and, per
    sample, where its documents (and its padding) start."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from qwen3_neuron.data.dataset import PackedDataset
    from qwen3_neuron.data.source import DataSource

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(build_assets().tokenizer_dir))
    overlong = "split" if form == "text" else "truncate"
    source = DataSource(files=str(files), format=form, overlong=overlong, packing=packing)
    started = time.perf_counter()  # opening the files is part of it (the Arrow cache is warm after pass 1)
    dataset = PackedDataset(source, tokenizer, seq_len=seq_len, infinite=False, cache_dir=cache_dir)
    samples = list(dataset)
    seconds = time.perf_counter() - started
    starts = [[i for i, p in enumerate(sample["positions"].tolist()) if p == 0] for sample, _ in samples]
    return {"stats": dataset.data_stats(), "tokens_per_second": len(samples) * seq_len / seconds, "starts": starts}


def document_lengths(files: Path, seq_len: int, cache_dir: str) -> list[int]:
    """The length of each document as packed (truncated to seq_len): packing=none puts each at
    the start of its own sample, its padding after it."""
    starts = pack(files, "chat", seq_len, "none", cache_dir)["starts"]
    return [s[1] if len(s) > 1 else seq_len for s in starts]


def bounds(lengths: list[int], seq_len: int) -> tuple[float, float]:
    """(the issue's bound, the L2 bound) on the packing efficiency of documents of `lengths`.

    L2 (Martello and Toth): for each alpha <= seq_len / 2, documents longer than seq_len - alpha
    and those longer than seq_len / 2 each need a sample of their own; the documents of alpha to
    seq_len / 2 tokens fit only in what the latter leave free, or in further samples."""
    total = sum(lengths)
    least = math.ceil(total / seq_len)
    over_half = [n for n in lengths if n > seq_len / 2]
    samples = least
    for alpha in range(seq_len // 2 + 1):
        room = sum(seq_len - n for n in over_half if n <= seq_len - alpha)
        small = sum(n for n in lengths if alpha <= n <= seq_len / 2)
        samples = max(samples, len(over_half) + max(0, math.ceil((small - room) / seq_len)))
    return total / (least * seq_len), total / (samples * seq_len)


def efficiency_by_buffer(lengths: list[int], seq_len: int) -> dict[int, float]:
    """Best fit's packing efficiency for documents of `lengths` in this order, per data.pack_buffer."""
    from qwen3_neuron.data.packing import Packer

    efficiency = {}
    for size in BUFFERS:
        packer = Packer(seq_len, pad_id=0, packing="best_fit", buffer_size=size)
        samples = [sample for n in lengths for sample in packer.add([0] * n, [0] * n)] + packer.flush()
        efficiency[size] = sum(lengths) / (len(samples) * seq_len)
    return efficiency


def train(files: Path, packing: str, steps: int, run_dir: Path) -> dict:
    """A short 2-rank run on `files` at seq_len 2048: tokens/s per rank, share of tokens with a loss."""
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", "data=chat", f"data.files={files}",
         "data.val_files=null", f"data.packing={packing}", f"training.steps={steps}",
         f"training.seq_len={LONG_SEQ_LEN}", "training.local_batch_size=1", "validator.enable=false",
         "metrics.enable_tensorboard=false"],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"data.packing={packing} run failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r["tps_per_device"] for r in records if "loss" in r and r["step"] >= 2]
    stats = json.loads((run_dir / "summary.json").read_text())["data_stats"]
    return {"tps": statistics.median(steady), "fastest": max(steady), "share": stats["label_tokens"] / stats["tokens"],
            "efficiency": stats["packing_efficiency"], "buffered": stats["buffered_documents"]}


def cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    bf16 = "native bf16 (avx512_bf16)" if "avx512_bf16" in info or "amx_bf16" in info else "no native bf16"
    return f"{model}, {bf16}"


def floor(value: float) -> float:
    """4 decimals, never rounded up: 0.99996 is not shown as 1.0000."""
    return math.floor(value * 10**4) / 10**4


def values(runs: list[float], form: str = "{:.4f}") -> str:
    return " ".join(form.format(floor(v) if form == "{:.4f}" else v) for v in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="training steps per run")
    parser.add_argument("--conversations", type=int, default=1500, help="in the long-tailed set")
    parser.add_argument("--no-training", action="store_true", help="packing efficiency only")
    args = parser.parse_args()
    assets = build_assets()
    with tempfile.TemporaryDirectory(prefix="packing-bench-") as scratch:
        cache = f"{scratch}/cache"
        long_tailed = write_long_tailed(Path(scratch) / "long_tailed.jsonl", args.conversations)
        sets = {"tiny chat": (assets.chat_train_file, TINY_SEQ_LEN), "long-tailed": (long_tailed, LONG_SEQ_LEN)}
        passes = {(name, packing): [] for name in sets for packing in PACKINGS}
        text = []
        for _ in range(args.repeats):
            for name, (files, seq_len) in sets.items():
                for packing in PACKINGS:
                    passes[name, packing].append(pack(files, "chat", seq_len, packing, cache))
            text.append(pack(assets.text_train_file, "text", TINY_SEQ_LEN, "best_fit", cache))
        lengths = {name: document_lengths(files, seq_len, cache) for name, (files, seq_len) in sets.items()}
        trained = {packing: [] for packing in PACKINGS}
        for repeat in range(0 if args.no_training else args.repeats):
            for packing in PACKINGS:
                trained[packing].append(train(long_tailed, packing, args.steps, Path(scratch) / f"run-{packing}-{repeat}"))

    print(f"CPU: {cpu()}; a shared machine, other jobs running: timings are noisy")
    for name, (_, seq_len) in sets.items():
        docs = sorted(lengths[name])
        print(f"{name}: {len(docs)} conversations at seq_len {seq_len}: median {docs[len(docs) // 2]} tokens, "
              f"90th percentile {docs[len(docs) * 9 // 10]}, {sum(n > seq_len / 2 for n in docs)} longer than "
              f"seq_len / 2, {sum(n == seq_len for n in docs)} at seq_len (truncated or exact)")  # fmt: skip
    print(f"\n{'set':12} {'packing':9} {'efficiency per repeat':>24} {'bound':>7} {'L2 bound':>8}   "
          "pipeline tok/s per repeat")  # fmt: skip
    for name, (_, seq_len) in sets.items():
        bound, l2 = bounds(lengths[name], seq_len)
        for packing in PACKINGS:
            runs = passes[name, packing]
            efficiency = [1 - r["stats"]["padding_tokens"] / r["stats"]["tokens"] for r in runs]
            speed = values([r["tokens_per_second"] for r in runs], "{:,.0f}")
            print(f"{name:12} {packing:9} {values(efficiency):>24} {floor(bound):7.4f} {floor(l2):8.4f}   {speed}")
    efficiency = [1 - r["stats"]["padding_tokens"] / r["stats"]["tokens"] for r in text]
    speed = values([r["tokens_per_second"] for r in text], "{:,.0f}")
    print(f"{'tiny text':12} {'(flow)':9} {values(efficiency):>24} {'':>7} {'':>8}   {speed}")
    print(f"\nbest_fit per data.pack_buffer: {' '.join(f'{size:>7}' for size in BUFFERS)}")
    for name, (_, seq_len) in sets.items():
        by_buffer = efficiency_by_buffer(lengths[name], seq_len)
        print(f"{name:29} {' '.join(f'{floor(e):7.4f}' for e in by_buffer.values())}")
    if args.no_training:
        return
    print(f"\nlong-tailed set, training: 2 ranks, seq_len {LONG_SEQ_LEN}, batch 1, {args.steps} steps; tok/s per "
          "rank of steps >= 2: median, and the fastest step (the least disturbed on a shared machine); "
          "trained tok/s: that x the share of tokens with a loss")  # fmt: skip
    print(f"{'packing':9} {'run: efficiency':>15} {'loss share':>10} {'buffered':>8} {'tok/s/rank per repeat':>24} "
          f"{'fastest step':>20} {'trained tok/s/rank per repeat':>30}")  # fmt: skip
    for packing in PACKINGS:
        runs = trained[packing]
        print(f"{packing:9} {floor(runs[-1]['efficiency']):15.4f} {floor(runs[-1]['share']):10.4f} "
              f"{runs[-1]['buffered']:8} {values([r['tps'] for r in runs], '{:,.1f}'):>24} "
              f"{values([r['fastest'] for r in runs], '{:,.1f}'):>20} "
              f"{values([r['tps'] * r['share'] for r in runs], '{:,.1f}'):>30}")  # fmt: skip
    # Best fit hands out the longest conversations of its first buffer first, whose share of
    # assistant tokens is higher; the whole set's share is what a long run trains at.
    whole = {p: passes["long-tailed", p][-1]["stats"] for p in PACKINGS}
    share = {p: whole[p]["label_tokens"] / whole[p]["tokens"] for p in PACKINGS}
    for speed in ("tps", "fastest"):
        for name, of in (("this run's", lambda r, p: r["share"]), ("the whole set's", lambda r, p: share[p])):
            ratios = [b[speed] * of(b, "best_fit") / (g[speed] * of(g, "greedy"))
                      for g, b in zip(trained["greedy"], trained["best_fit"])]  # fmt: skip
            print(f"trained tok/s best_fit / greedy ({'median' if speed == 'tps' else 'fastest'} step, {name} "
                  f"loss share), per repeat: {values(ratios, '{:.3f}')}; median {statistics.median(ratios):.3f}")
    print(f"whole set's loss share: greedy {floor(share['greedy']):.4f}, best_fit {floor(share['best_fit']):.4f}")
    pipeline = [r["tokens_per_second"] for r in passes["long-tailed", "best_fit"]]
    trainer = [r["tps"] for r in trained["best_fit"]]
    print(f"pipeline (best_fit, long-tailed) tok/s over the trainer's tok/s per rank: "
          f"{statistics.median(pipeline) / statistics.median(trainer):,.1f}x (medians)")


if __name__ == "__main__":
    main()
