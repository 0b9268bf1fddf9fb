"""Bare torchtitan and launch.py on the same torchtitan settings: the two commands and the reader of
torchtitan's step lines that bench/launch_overhead.py and bench/gpu_check.py share.

`settings` is one dict of torchtitan fields by their dotted names (`training.steps`: 20). The bare
side gets them as torchtitan's own CLI flags (`--training.steps=20`, a true bool as `--compile.enable`)
through `torchrun -m qwen3_neuron.worker.torchtitan_cli` (stock `torchtitan.train` + the device
fixes); launch.py gets them as Hydra overrides (`training.steps=20`), plus the selection that names
the same base config function (`model.config_fn=...`) and torchtitan's own activation checkpointing
(conf/config.yaml turns it off for the tiny models; torchtitan's config functions have it on).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]

# torchtitan's step line: "step:  5  loss:  7.2  ...  tps: 1,234  tflops: 5.67  mfu: 0.57%" (colour codes
# between); never its "validate step: ..." line
STEP = re.compile(
    r"(?<!validate )step:\s*(\d+)\s.*?loss:\s*([-+0-9.eE]+|nan|inf).*?tps: ([0-9,]+)(?:.*?tflops: ([0-9,.]+))?"
)
SELECTIVE_AC = "torchtitan.distributed.activation_checkpoint.SelectiveAC.Config"


class StepLine(NamedTuple):
    step: int
    loss: float
    tps: float  # tokens/s per device, torchtitan's own figure since the previous logged step
    tflops: float | None  # model TFLOP/s per device (torchtitan's FLOPs per token x tps)


def parse_step_line(line: str) -> StepLine | None:
    match = STEP.search(line)
    if not match:
        return None
    step, loss, tps, tflops = match.groups()
    return StepLine(
        int(step), float(loss), float(tps.replace(",", "")), float(tflops.replace(",", "")) if tflops else None
    )


def bare_flag(key: str, value: object) -> str:
    """One torchtitan CLI flag: tyro takes bools as `--a.b` / `--a.no-b`, everything else `--a.b=v`."""
    if isinstance(value, bool):
        head, _, last = key.rpartition(".")
        return f"--{key}" if value else f"--{head + '.' if head else ''}no-{last}"
    return f"--{key}={value}"


def bare_command(
    settings: dict[str, object],
    *,
    module: str = "qwen3",
    config: str = "qwen3_debugmodel",
    device: str = "cpu",
    nproc: int = 2,
) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "--local-ranks-filter=0", "--tee=3", "--role=rank",
        "-m", "qwen3_neuron.worker.torchtitan_cli", "--device", device,
        "--module", module, "--config", config, *(bare_flag(k, v) for k, v in settings.items()),
    ]  # fmt: skip


def hydra_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def launch_command(settings: dict[str, object], run_dir: Path, selection: list[str]) -> list[str]:
    """launch.py with `selection` (groups, model.config_fn, run.nproc_per_node, ...) and `settings`."""
    return [
        sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *selection,
        # the same torchtitan config as the bare run: its AC, no TensorBoard
        f"+activation_checkpoint._target_={SELECTIVE_AC}", "metrics.enable_tensorboard=false",
        "run.verbose=true",  # torchtitan's step lines on stdout, as the bare run prints them
        *(f"{key}={hydra_value(value)}" for key, value in settings.items()),
    ]  # fmt: skip


class Timing(NamedTuple):
    first_step_s: float  # process start -> torchtitan's `step:  1` line
    tps: float  # median tokens/s per device over the steps after `warmup`
    tflops: float | None  # median TFLOP/s per device over the same steps
    wall_s: float  # the whole command
    losses: tuple[float, ...]  # every logged step's loss, warm-up included
    last_step_to_exit_s: float  # the last `step:` line -> the command's exit (the run's end: save, report, teardown)


class RunFailed(RuntimeError):
    pass


def timed_training(
    command: list[str], cwd: Path, *, warmup: int = 1, log: Path | None = None, timeout_s: float | None = None
) -> Timing:
    """Run `command`, read torchtitan's step lines; steps <= `warmup` are not timed.

    The whole output goes to `log` when given. A run past `timeout_s` is killed (its whole process
    group: torchrun and its workers) and raises RunFailed, as does a failed one."""
    start = time.perf_counter()
    first_step, last_step, timed, losses = None, None, [], []
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    timer = threading.Timer(timeout_s, os.killpg, (process.pid, signal.SIGKILL)) if timeout_s else None
    if timer:
        timer.start()
    tail: list[str] = []
    with open(log, "w", encoding="utf-8", buffering=1) if log else open(os.devnull, "w") as sink:
        for line in process.stdout:
            sink.write(line)
            tail = [*tail[-39:], line]
            step = parse_step_line(line)
            if step is None:
                continue
            losses.append(step.loss)
            last_step = time.perf_counter() - start
            if step.step == 1 and first_step is None:
                first_step = time.perf_counter() - start
            if step.step > warmup:
                timed.append(step)
    code = process.wait()
    if timer:
        timer.cancel()
    wall = time.perf_counter() - start
    if code != 0 or first_step is None or not timed:
        why = f"killed after {timeout_s:.0f} s" if timer and wall >= timeout_s else f"exit code {code}"
        error = next((line.strip() for line in reversed(tail) if re.search(r"\w+Error\b", line)), "")
        raise RunFailed(f"{why}, {len(timed)} timed steps: {error}\n{' '.join(command)}\n" + "".join(tail[-15:]))
    tflops = [s.tflops for s in timed if s.tflops is not None]
    return Timing(
        first_step,
        statistics.median(s.tps for s in timed),
        statistics.median(tflops) if tflops else None,
        wall,
        tuple(losses),
        wall - last_step,
    )
