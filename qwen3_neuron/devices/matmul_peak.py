"""The matrix-multiply benchmark behind a measured peak FLOP/s (`report.peak_flops`): the best
dense square matmul rate at a dtype, run the way a rank runs (CPU: the rank's thread count).

It runs in a process of its own, which prints its `PeakFlops` as one JSON line (the launcher then
holds no CUDA context):

    python -m qwen3_neuron.devices.matmul_peak --device cpu --dtype bfloat16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CPU_SIZES = (256, 512, 1024, 2048)
CUDA_SIZES = (4096, 8192)
PROBE_SECONDS = 0.75  # per size, after a warm-up product
MIN_REPEATS = 3  # per size; on a CPU 1 where one product alone takes longer than PROBE_SECONDS


@dataclass
class PeakFlops:
    flops_per_second: float
    """Peak of one rank (one process), at `dtype`."""

    source: str
    """`measured` (the probe, on this machine) or `vendor` (a data-sheet figure)."""

    device: str
    device_name: str
    dtype: str
    threads: int | None
    """CPU: threads of the rank (and of the probe); None elsewhere."""

    detail: str
    """How the number came about, for people."""

    def describe(self) -> str:
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        return f"{self.flops_per_second / 1e12:.4g} TFLOP/s per rank ({self.source}: {self.device_name}, {self.dtype}{threads})"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe(device: str, dtype: str, threads: int | None) -> PeakFlops:
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as torchtitan trains it
        name = torch.cuda.get_device_name(0)
    else:
        name = cpu_name()
    sizes = CPU_SIZES if device == "cpu" else CUDA_SIZES
    rates = {}
    for n in sizes:
        rates[n], single = _best_rate(torch, device, torch_dtype, n)
        if device == "cpu" and single > PROBE_SECONDS:
            # one product outlasts a size's whole budget (bf16 on a CPU without bf16 units: about
            # 1 GFLOP/s, 17 s for one 2048^3 product): larger sizes would take minutes, more under
            # load, and on such a device they run no faster
            break
    best_size = max(rates, key=rates.get)
    load = f", load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores" if device == "cpu" else ""
    return PeakFlops(
        flops_per_second=rates[best_size],
        source="measured",
        device=device,
        device_name=name,
        dtype=dtype,
        threads=threads if device == "cpu" else None,
        detail=(
            f"best square matmul over sizes {list(rates)} (best at {best_size}), {PROBE_SECONDS:g} s each, "
            f"torch {torch.__version__}, measured {time.strftime('%Y-%m-%d %H:%M:%S')}{load}"
        ),
    )


def _best_rate(torch, device: str, dtype, n: int) -> tuple[float, float]:
    """The best FLOP/s of n x n products over PROBE_SECONDS, and the warm-up product's seconds."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    torch.mm(a, b)  # warm-up: kernel selection, first-touch allocations
    sync()
    single = time.perf_counter() - start
    # on a GPU one product is too short to time alone: time batches of about 20 ms
    batch = max(1, math.ceil(0.02 / max(single, 1e-6))) if device == "cuda" else 1
    min_repeats = 1 if device == "cpu" and single > PROBE_SECONDS else MIN_REPEATS
    best, repeats, deadline = 0.0, 0, time.perf_counter() + PROBE_SECONDS
    while repeats < min_repeats or time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(batch):
            torch.mm(a, b)
        sync()
        best = max(best, batch * 2 * n**3 / (time.perf_counter() - start))
        repeats += 1
    return best, single


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_neuron.devices.matmul_peak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of the rank")
    args = parser.parse_args(argv)
    print(json.dumps(asdict(probe(args.device, args.dtype, args.threads))))


if __name__ == "__main__":
    main()
