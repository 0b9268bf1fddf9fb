"""The peak FLOP/s that MFU is measured against: per rank, for the device and dtype in use.

MFU = model FLOPs per token x tokens per second / (peak per rank x ranks). Everything here is
per rank, i.e. per process torchrun starts:

- CPU: a matrix-multiply probe at the training dtype (`devices.matmul_peak`), run the way a rank runs: one process with
  the rank's thread count (`OMP_NUM_THREADS`, which `devices.worker_env` sets to cores // ranks).
  With 2 ranks on 2 cores that is 1 thread; the job-wide peak is then 2 x the 1-thread peak,
  which assumes the two ranks do not slow each other down (they share caches and memory
  bandwidth), so the job's MFU reads slightly low rather than high.
- CUDA: the same probe on one GPU (in a subprocess, so the launcher holds no CUDA context).
- Neuron: the vendor's dense figure for one logical NeuronCore (Trainium2: 667 BF16 / 181 FP32
  TFLOPS per chip of 8 NeuronCore-v3, LNC=2 cores per rank), marked `source: vendor`: no
  Trainium is reachable to measure one.

"Peak" for a measured device is the best dense GEMM throughput the probe reaches (best of
several sizes and repeats, so that a busy machine lowers it as little as possible). Other
processes on the same cores still pull it down, so a measurement never lowers the cached value:
`--refresh` on a quiet machine raises a low one, and the cache entry says the load it was
measured under. torchtitan's own table (`utils.get_peak_flops`, A100 numbers for any unknown
device) is not what MFU divides by; `datasheet_peak_flops` gives its figure for a GPU it names, so
that a measured MFU can also be put beside torchtitan's published ones (bench/gpu_check.py).

Measurements are cached per machine in `~/.cache/qwen3_neuron/peak_flops.json` (or
`$QWEN3_NEURON_CACHE/peak_flops.json`), keyed by device name, dtype, threads and torch version:

    python -m qwen3_neuron.report.peak_flops --device cpu --dtype bfloat16 --threads 1   # cached value
    python -m qwen3_neuron.report.peak_flops --device cpu --dtype float32 --threads 2 --refresh
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qwen3_neuron.devices.matmul_peak import PeakFlops, cpu_name
from qwen3_neuron.run_dir import PEAK_FLOPS_FILE, write_json

PEAK_CACHE_FILE = "peak_flops.json"
CACHE_ENV_VAR = "QWEN3_NEURON_CACHE"  # the cache dir instead of ~/.cache/qwen3_neuron (tests: a temp dir)

# Trainium2 (trn2): per chip, 8 physical NeuronCore-v3 (AWS Neuron docs, "Trainium2 Architecture").
TRN2_CHIP_TFLOPS = {"bfloat16": 667.0, "float32": 181.0}
TRN2_CORES_PER_CHIP = 8

# The dense bf16 data-sheet peaks per GPU that torchtitan 0.3.0's MFU divides by (utils.get_peak_flops),
# for the NVIDIA GPUs it names: (what the name contains, TFLOP/s), the first match wins, as there.
TORCHTITAN_GPU_TFLOPS = (
    (("A100",), 312.0), (("A6000",), 154.85), (("H100", "NVL"), 835.0), (("H100", "PCIe"), 756.0),
    (("H100",), 989.0), (("H200",), 989.0), (("H20",), 148.0), (("GB200",), 2500.0), (("GB300",), 2500.0),
    (("B300",), 2250.0), (("B200",), 2250.0),
)  # fmt: skip


def datasheet_peak_flops(device_name: str) -> float | None:
    """torchtitan's data-sheet peak FLOP/s for this GPU (bf16, dense), or None where it names none (it
    would then take A100's): MFU against it is comparable with torchtitan's published MFU."""
    for parts, tflops in TORCHTITAN_GPU_TFLOPS:
        if all(part in device_name for part in parts):
            return tflops * 1e12
    return None


# ---- launcher side ---------------------------------------------------------------------------


def peak_for_run(device: str, dtype: str, env: dict[str, str]) -> PeakFlops:
    """The per-rank peak for `device` at `dtype` with the workers' environment `env` (cached, or
    measured now)."""
    threads = None
    if device == "cpu":
        threads = int(env.get("OMP_NUM_THREADS") or 0) or None
    lnc = int(env.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    return peak_flops(device, dtype, threads=threads, neuron_cores_per_rank=lnc)


def write_run_dir_peak(run_dir: Path, peak: PeakFlops, ranks: int) -> None:
    """`<run dir>/peak_flops.json`: what the workers' metrics and the summary compute MFU with."""
    write_json(run_dir / PEAK_FLOPS_FILE, {**asdict(peak), "ranks": ranks})


def peak_flops(
    device: str,
    dtype: str,
    *,
    threads: int | None = None,
    neuron_cores_per_rank: int = 2,
    refresh: bool = False,
) -> PeakFlops:
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    if device == "neuron":
        return _neuron_vendor_peak(dtype, neuron_cores_per_rank)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}")
    if device == "cpu":
        threads = threads or max(1, len(os.sched_getaffinity(0)))
    name = cpu_name() if device == "cpu" else _cuda_name()
    key = _cache_key(device, name, dtype, threads)
    cached = _read_cache().get(key)
    if cached and not refresh:
        return PeakFlops(**cached)
    peak = _measure_in_subprocess(device, dtype, threads)
    cache = _read_cache()  # another launch may have written meanwhile
    if key in cache and cache[key]["flops_per_second"] > peak.flops_per_second:
        return PeakFlops(**cache[key])  # measured under less load before: the better estimate
    cache[key] = asdict(peak)
    _write_cache(cache)
    return peak


def _cuda_name() -> str:
    """GPU 0's name without creating a CUDA context in the launcher (nvidia-smi)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={visible}", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"
    return out.stdout.strip() or "unknown GPU"


def cache_path() -> Path:
    base = os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "qwen3_neuron"
    return Path(base) / PEAK_CACHE_FILE


def _cache_key(device: str, name: str, dtype: str, threads: int | None) -> str:
    from importlib.metadata import version

    return f"{device}|{name}|{dtype}|threads={threads}|torch={version('torch')}"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(cache: dict[str, Any]) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)  # atomic: concurrent launches never read half a file


def _neuron_vendor_peak(dtype: str, cores_per_rank: int) -> PeakFlops:
    per_core = TRN2_CHIP_TFLOPS[dtype] * 1e12 / TRN2_CORES_PER_CHIP
    return PeakFlops(
        flops_per_second=per_core * cores_per_rank,
        source="vendor",
        device="neuron",
        device_name=f"Trainium2 logical NeuronCore (LNC={cores_per_rank})",
        dtype=dtype,
        threads=None,
        detail=(
            f"AWS data sheet: {TRN2_CHIP_TFLOPS[dtype]:g} dense {dtype} TFLOPS per Trainium2 chip / "
            f"{TRN2_CORES_PER_CHIP} NeuronCore-v3 x {cores_per_rank} per logical core; not measured"
        ),
    )


def _measure_in_subprocess(device: str, dtype: str, threads: int | None) -> PeakFlops:
    """A fresh process, with the rank's thread count in its environment as torchrun gives it."""
    env = {**os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, "-m", "qwen3_neuron.devices.matmul_peak", "--device", device, "--dtype", dtype]
    if threads:
        command += ["--threads", str(threads)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"peak FLOPS probe failed ({' '.join(command)}):\n{out.stderr[-2000:]}")
    return PeakFlops(**json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qwen3_neuron.report.peak_flops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "neuron"], default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per rank (default: all cores)")
    parser.add_argument("--refresh", action="store_true", help="measure again (the cache keeps the higher value)")
    args = parser.parse_args(argv)
    peak = peak_flops(args.device, args.dtype, threads=args.threads, refresh=args.refresh)
    print(f"{peak.describe()}\n  {peak.detail}\n  cache: {cache_path()}")


if __name__ == "__main__":
    main()
