"""What launch.py costs over bare torchtitan, measured in one run on one config and seed.

    .venv/bin/python bench/launch_overhead.py [--steps 20] [--repeats 2]

Both sides train torchtitan's `qwen3_debugmodel` on 2 CPU ranks with the same torchtitan settings:
bare torchtitan through `torchrun -m qwen3_neuron.worker.torchtitan_cli` (stock `torchtitan.train` + the
same CPU fixes), and `launch.py` with the same values as Hydra overrides. Runs alternate
(bare, launch, bare, launch, ...) so machine noise hits both alike. Printed:

- tokens/s per device: the median of torchtitan's own `tps` over steps >= 2, median over repeats
- time to first step: process start -> torchtitan's `step:  1` line, median over repeats
- end of run: the last `step:` line -> the command's exit (launch.py also writes its summary;
  its workers skip the interpreter's teardown), median over repeats
- dry run: `launch.py run.dry_run=true` wall time minus the time to import torchtitan
- config errors: wall time of a launch that stops on a typo, per typo (the first two need no
  torchtitan import to be found, the third does)

Targets: tokens/s ratio >= 0.99, time-to-first-step ratio <= 1.25, dry run < 1.5 s over import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.side_by_side import bare_command, launch_command, timed_training
from qwen3_neuron.assets.build import DATASET_NAME, build_assets
from qwen3_neuron.devices.policy import mixed_precision_param

# launch.py's side of the same torchtitan config function and flavour
SELECTION = ["model.config_fn=qwen3_debugmodel", "model.flavor=debugmodel"]


def shared_settings(steps: int) -> dict[str, object]:
    paths = build_assets()
    return {
        "training.steps": steps,
        "training.seq_len": 256,
        "training.local_batch_size": 2,
        "lr_scheduler.warmup_steps": 2,
        "debug.seed": 42,
        "metrics.log_freq": 1,
        # the dtype launch.py picks for this CPU, given to both sides (bare torchtitan keeps bf16)
        "training.mixed_precision_param": mixed_precision_param("cpu") or "bfloat16",
        "hf_assets_path": paths.tokenizer_dir,
        "dataloader.dataset": DATASET_NAME,
        "dataloader.dataset_path": paths.text_dataset_dir,
    }


CONFIG_ERRORS = ("model=nativ", "run.verbose=maybe", "training.stpes=3")


def wall_seconds(command: list[str], expect_failure: bool = False) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, check=False, cwd=REPO, capture_output=True)
    if (result.returncode != 0) != expect_failure:
        raise SystemExit(f"unexpected exit {result.returncode}: {' '.join(command)}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    settings = shared_settings(args.steps)
    results: dict[str, list[tuple[float, float, float]]] = {"bare": [], "launch": []}  # first step, tps, end
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for repeat in range(args.repeats):
            bare = timed_training(bare_command(settings), scratch)
            results["bare"].append((bare.first_step_s, bare.tps, bare.last_step_to_exit_s))
            launch = timed_training(launch_command(settings, scratch / f"launch-{repeat}", SELECTION), REPO)
            results["launch"].append((launch.first_step_s, launch.tps, launch.last_step_to_exit_s))
            print(f"repeat {repeat}: (first step s, tokens/s, end s) bare {results['bare'][-1]}, "
                  f"launch {results['launch'][-1]}", flush=True)  # fmt: skip
        dry_run = [
            wall_seconds([*launch_command(settings, scratch / f"dry-{i}", SELECTION), "run.dry_run=true"])
            for i in range(3)
        ]
        config_errors = {
            typo: [
                wall_seconds(
                    [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={scratch / 'error'}", typo], True
                )
                for _ in range(3)
            ]
            for typo in CONFIG_ERRORS
        }
    imports = [
        wall_seconds([sys.executable, "-c", "import torchtitan.trainer, torchtitan.models.qwen3.config_registry"])
        for _ in range(3)
    ]

    def median_of(side: str, index: int) -> float:
        return statistics.median(r[index] for r in results[side])

    tps_ratio = median_of("launch", 1) / median_of("bare", 1)
    first_step_ratio = median_of("launch", 0) / median_of("bare", 0)
    end_ratio = median_of("launch", 2) / median_of("bare", 2)
    dry_run_extra = statistics.median(dry_run) - statistics.median(imports)
    print(
        f"tokens/s per device   bare {median_of('bare', 1):8.0f}  launch.py {median_of('launch', 1):8.0f}"
        f"  ratio {tps_ratio:.3f}  (target >= 0.99)"
    )
    print(
        f"time to first step s  bare {median_of('bare', 0):8.2f}  launch.py {median_of('launch', 0):8.2f}"
        f"  ratio {first_step_ratio:.3f}  (target <= 1.25)"
    )
    print(
        f"end of run s          bare {median_of('bare', 2):8.2f}  launch.py {median_of('launch', 2):8.2f}"
        f"  ratio {end_ratio:.3f}"
    )
    print(
        f"dry run s             {statistics.median(dry_run):.2f}  import torchtitan {statistics.median(imports):.2f}"
        f"  extra {dry_run_extra:.2f}  (target < 1.5)"
    )
    for typo, seconds in config_errors.items():
        print(
            f"config error s         {typo:<20} median {statistics.median(seconds):.2f}"
            f"  repeats {' '.join(f'{x:.2f}' for x in seconds)}  (target < 3 without torchtitan)"
        )


if __name__ == "__main__":
    main()
