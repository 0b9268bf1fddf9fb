"""LoRA against full fine-tuning, same model, same batch, on this machine.

Both runs load the same base (checkpointing=from_hf): a native flavour (`--flavor`, default the
project's tiny Qwen3, 3.8 M parameters) written once as a seeded, untrained HF dir with
Transformers. Each run trains a few steps on one rank through `launch.py`; the two methods
alternate, `--repeats` times, so drift on a shared machine hits both alike. Per run, from
summary.json: peak_memory_gib (the rank's peak RSS: what the device reports on a CPU, where the
Python and torch runtime are most of it for a small model), tensor_memory_gib (parameters,
gradients, optimizer states and saved activations, measured by rank 0), tokens_per_second
(median after step 1), trainable/total parameters. Ratios are LoRA / full of the medians.

    .venv/bin/python -m bench.lora_vs_full                       # from the repo root: 6 runs
    .venv/bin/python -m bench.lora_vs_full --flavor debugmodel   # 32 M parameters: weights decide the peak
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAME_RUN = (
    "run.nproc_per_node=1", "training.steps=6", "training.seq_len=128",
    "training.local_batch_size=2", "lr_scheduler.warmup_steps=1", "metrics.enable_tensorboard=false",
    "hf.first_loss_check=off", "checkpointing=from_hf",
)  # fmt: skip
METHODS = {"full": ["finetune=full"], "lora": ["finetune=lora"]}
FIELDS = ("peak_memory_gib", "tensor_memory_gib", "tokens_per_second", "trainable_parameters", "total_parameters")


def write_base(flavor: str, out_dir: Path) -> Path:
    """A native flavour as a seeded HF Qwen3 dir (Transformers' own model and save), with the
    project's tiny tokenizer (tiny and debugmodel have its 2048-token vocabulary)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from qwen3_neuron.assets.build import EOS_TOKEN, build_assets
    from qwen3_neuron.models.flavors import native_model_spec
    from qwen3_neuron.models.hf.model_dir import native_architecture

    tokenizer_dir = build_assets().tokenizer_dir
    eos = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(EOS_TOKEN)
    config = Qwen3Config(**native_architecture(native_model_spec(flavor).model), eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out_dir)
    for path in tokenizer_dir.iterdir():
        shutil.copy2(path, out_dir / path.name)
    return out_dir


def run(method: str, flavor: str, base: Path, run_dir: Path) -> dict:
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", f"model.flavor={flavor}", *SAME_RUN,
         f"checkpoint.initial_load_path={base}", *METHODS[method]],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{method}: launch.py exited {result.returncode}\n{result.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {field: summary[field] for field in FIELDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flavor", default="tiny", help="a dense native Qwen3 flavour with a 2048-token vocabulary")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lora-vs-full-") as tmp:
        root = Path(tmp)
        base = write_base(args.flavor, root / "base")
        results: dict[str, list[dict]] = {method: [] for method in METHODS}
        print(f"{args.flavor}, 1 CPU rank, {' '.join(SAME_RUN[1:4])}, base from HF; interleaved x{args.repeats}")
        print(f"{'repeat':>6} {'method':>6} {'peak RSS GiB':>13} {'tensor GiB':>11} {'tok/s':>9} {'trainable':>11} {'total':>11}")
        for repeat in range(1, args.repeats + 1):
            for method in METHODS:  # full, lora, full, lora, ...
                r = run(method, args.flavor, base, root / f"{method}-{repeat}")
                results[method].append(r)
                print(f"{repeat:>6} {method:>6} {r['peak_memory_gib']:>13.3f} {r['tensor_memory_gib']:>11.4f} "
                      f"{r['tokens_per_second']:>9.0f} {r['trainable_parameters']:>11,} {r['total_parameters']:>11,}")  # fmt: skip
        print("\nLoRA / full (medians over repeats):")
        for field, label in [
            ("peak_memory_gib", "peak memory (RSS)"), ("tensor_memory_gib", "tensor memory"),
            ("tokens_per_second", "tokens/s"), ("trainable_parameters", "trainable parameters"),
        ]:  # fmt: skip
            lora = statistics.median(r[field] for r in results["lora"])
            full = statistics.median(r[field] for r in results["full"])
            print(f"  {label:<22} {lora:>12.4g} / {full:<12.4g} = {lora / full:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
