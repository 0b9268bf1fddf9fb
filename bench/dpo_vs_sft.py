"""A DPO step against an SFT step of the same length, same model, same method, on this machine.

Both runs start from the tiny HF Qwen3 dir's weights (model=hf, checkpointing=from_hf) on one
rank with the same seq_len, batch and steps: SFT on the bundled conversations (data=chat), DPO
on the bundled preference pairs (data=preference: each step also runs the reference forward,
the model with its adapters off for LoRA, the frozen copy's weights swapped in for full). The
two alternate, `--repeats` times, so drift on a shared machine hits both alike. Per run, from
summary.json: tokens_per_second (median after step 1), peak_memory_gib (the rank's peak RSS on a
CPU), tensor_memory_gib (parameters, gradients, optimizer states and saved activations measured
by rank 0; DPO's frozen copy is not a parameter and is not in it), memory_estimate_gib (the
plan's, which counts the copy). Ratios are DPO / SFT per repeat and of the medians.

    .venv/bin/python -m bench.dpo_vs_sft                       # from the repo root: LoRA, 6 runs
    .venv/bin/python -m bench.dpo_vs_sft --finetune full
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAME_RUN = (
    "model=hf", "model.hf_model=${assets:tiny_qwen3_dir}", "model.flavor=full", "checkpointing=from_hf",
    "parallelism=fsdp", "device=cpu", "kernels=none", "run.nproc_per_node=1", "training.steps=10",
    "training.seq_len=1024", "training.local_batch_size=4", "lr_scheduler.warmup_steps=1",
    "metrics.enable_tensorboard=false", "hf.first_loss_check=off", "data.val_files=null",
)  # fmt: skip
KINDS = {"sft": ["data=chat"], "dpo": ["data=preference"]}
FIELDS = ("tokens_per_second", "peak_memory_gib", "tensor_memory_gib", "memory_estimate_gib")


def run(kind: str, finetune: str, run_dir: Path) -> dict:
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *SAME_RUN, *KINDS[kind],
         f"finetune={finetune}"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {field: summary[field] for field in FIELDS}


def cpu_name() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = [flag for flag in ("avx512_bf16", "amx_bf16", "amx_tile") if flag in flags]
    return f"{name}; {', '.join(wanted) or 'no avx512_bf16/amx'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--finetune", choices=("lora", "full"), default="lora")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; finetune={args.finetune}; 1 rank, seq_len 1024 x 4 per step, 10 steps", flush=True)
    results: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="dpo-vs-sft-") as scratch:
        for repeat in range(args.repeats):
            for kind in KINDS:  # interleaved: sft, dpo, sft, dpo, ...
                results[kind].append(run(kind, args.finetune, Path(scratch) / f"{kind}-{repeat}"))
            sft, dpo = results["sft"][-1], results["dpo"][-1]
            ratios = "  ".join(f"{field} {dpo[field] / sft[field]:.3f}" for field in FIELDS)
            print(f"repeat {repeat + 1}: sft {sft}\n          dpo {dpo}\n          dpo/sft: {ratios}", flush=True)
    medians = {kind: {f: statistics.median(r[f] for r in runs) for f in FIELDS} for kind, runs in results.items()}
    for field in FIELDS:
        sft, dpo = medians["sft"][field], medians["dpo"][field]
        print(f"median {field}: sft {sft:.4g}  dpo {dpo:.4g}  dpo/sft {dpo / sft:.3f}")


if __name__ == "__main__":
    main()
