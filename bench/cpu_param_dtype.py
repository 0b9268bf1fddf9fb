"""What FSDP's parameter dtype costs on this CPU: the default job in bf16 vs float32 parameters.

    .venv/bin/python bench/cpu_param_dtype.py [--steps 10] [--repeats 3]

`device=cpu` picks `training.mixed_precision_param=float32` on a CPU without bf16 matmul units
(qwen3_neuron.devices.policy.mixed_precision_param). This measures why: the default tiny Qwen3 on
2 CPU ranks, launched alternately with each dtype (bf16, fp32, bf16, ...), printing the job's
tokens/s (`summary.json`, median after step 1) and the wall time of each launch, per repeat, and
the fp32 / bf16 ratio of the medians.
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
DTYPES = ("bfloat16", "float32")


def launch(run_dir: Path, dtype: str, steps: int) -> tuple[float, float]:
    """(tokens/s of the job, wall seconds of the launch)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", f"training.steps={steps}",
         f"training.mixed_precision_param={dtype}", "metrics.enable_tensorboard=false"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    return json.loads((run_dir / "summary.json").read_text())["tokens_per_second"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {dtype: [] for dtype in DTYPES}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for dtype in DTYPES:
                results[dtype].append(launch(Path(scratch) / f"{dtype}-{repeat}", dtype, args.steps))
            print(f"repeat {repeat}: " + ", ".join(
                f"{dtype} {results[dtype][-1][0]:.0f} tok/s in {results[dtype][-1][1]:.1f} s" for dtype in DTYPES
            ), flush=True)  # fmt: skip
    for index, name in ((0, "tokens/s"), (1, "launch wall s")):
        medians = {dtype: statistics.median(r[index] for r in results[dtype]) for dtype in DTYPES}
        print(f"{name:<14} bf16 {medians['bfloat16']:8.1f}  fp32 {medians['float32']:8.1f}"
              f"  fp32/bf16 {medians['float32'] / medians['bfloat16']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
