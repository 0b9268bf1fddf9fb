"""The plan's memory estimate against a step's true peak, at the sizes people train.

Each point trains 2 steps through `launch.py` with `run.measure_memory=true`: step 2 runs under
torch's MemTracker (every live tensor, temporaries included: `step_memory.json`), the plan writes
its estimate (`memory_estimate.json`), and `summary.json` holds the process's peak RSS. Models: the
tiny Qwen3 body at Qwen3's real 151,936-token vocabulary (`build_real_vocab_model`, 42 M parameters:
the logits dominate, as at real sizes) and native 0.6B. Runs: SFT (data=chat), LoRA SFT, DPO
(data=preference, LoRA and full), GRPO (data=prompts, LoRA and full: the measured step samples its
completions on the KV cache before it trains). Points are interleaved over the repeats; memory is
deterministic, RSS is not.

    .venv/bin/python -m bench.memory_at_scale                      # the grid that fits 24 GiB, 3 repeats
    .venv/bin/python -m bench.memory_at_scale --points "hf sft 512 1" --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("training.steps=2", "lr_scheduler.warmup_steps=1", "metrics.enable_tensorboard=false",
         "run.measure_memory=true", "run.memory_check=off", "validator.enable=false")  # fmt: skip

GRPO = ("grpo.rewards=[examples.my_rewards.digit_share]", "grpo.num_generations=2", "grpo.max_completion_length=64")
RUNS = {
    "sft": ["data=chat"],
    "lora-sft": ["data=chat", "finetune=lora"],
    "lora-dpo": ["data=preference", "finetune=lora"],
    "full-dpo": ["data=preference"],
    # GRPO: the tracked step samples 2 completions of up to 64 tokens per prompt first (KV cache)
    "lora-grpo": ["data=prompts", "finetune=lora", *GRPO],
    "full-grpo": ["data=prompts", *GRPO],
}
# "model run seq_len ranks"; local batch 2 (1 for 0.6B)
GRID = [f"hf {run} {seq} {ranks}" for seq in (512, 2048) for run in RUNS for ranks in (1, 2)] + [
    "hf sft 4096 1", "hf lora-dpo 4096 1", "native sft 1024 1",
]  # fmt: skip


def overrides(point: str, real_vocab_dir: Path) -> list[str]:
    model, run, seq, ranks = point.split()
    if model == "hf":
        base = ["model=hf", f"model.hf_model={real_vocab_dir}", "checkpointing=[from_hf]", "training.local_batch_size=2"]
    else:
        base = ["model.flavor=0.6B", "training.local_batch_size=1"]
    return [*base, *RUNS[run], f"training.seq_len={seq}", f"run.nproc_per_node={ranks}", *STEPS]


def measure(point: str, real_vocab_dir: Path, work: Path, repeat: int) -> dict:
    run_dir = work / f"{point.replace(' ', '-')}-{repeat}"
    command = [sys.executable, "launch.py", *overrides(point, real_vocab_dir), f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    if done.returncode != 0 or "tracked_peak_gib" not in summary:
        return {"point": point, "repeat": repeat, "error": (summary.get("error") or done.stderr[-400:]).strip()}
    estimate = json.loads((run_dir / "memory_estimate.json").read_text())
    return {
        "point": point, "repeat": repeat,
        "estimate_gib": estimate["per_rank_gib"], "peak_at": estimate["peak_at"],
        "tracked_gib": summary["tracked_peak_gib"], "rss_gib": summary["peak_memory_gib"],
        "tracked_by_category_gib": summary["tracked_peak_by_category_gib"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="*", default=GRID, help='"model run seq_len ranks", e.g. "hf sft 512 1"')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON lines here")
    args = parser.parse_args(argv)
    from qwen3_neuron.assets.build import build_real_vocab_model

    real_vocab_dir = build_real_vocab_model()
    print("| point | repeat | estimate GiB | tracked peak GiB | RSS peak GiB | estimate / tracked | RSS / tracked | peak at |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="memory-at-scale-") as work:
        for repeat in range(1, args.repeats + 1):
            for point in args.points:  # interleaved: each repeat visits every point
                row = measure(point, real_vocab_dir, Path(work), repeat)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
                if "error" in row:
                    print(f"| {point} | {repeat} | error: {row['error'][:120]} | | | | | |", flush=True)
                    continue
                print(f"| {point} | {repeat} | {row['estimate_gib']:.3f} | {row['tracked_gib']:.3f} | {row['rss_gib']:.3f} "
                      f"| {row['estimate_gib'] / row['tracked_gib']:.3f} | {row['rss_gib'] / row['tracked_gib']:.3f} "
                      f"| {row['peak_at']} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
