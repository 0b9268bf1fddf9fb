"""Prepare the GPU check for a lent machine that has no network (the `device` tool's H200).

    .venv/bin/python bench/gpu_check_prepare.py                  # for the H200 image: cp312, manylinux x86_64
    .venv/bin/python bench/gpu_check_prepare.py --call-s 12      # re-plan with a measured call cost (no download)

The machine's image has Python 3.12, torch 2.11 (cu130), transformers 5.17, no Hydra, no torchtitan, no
`datasets`, and nothing can be installed there from a registry; torchtitan 0.3.0 cannot run on torch 2.11.
A call carries at most 64 MiB in all (the project's tree and the carried paths), and ignored files stay on
a warm machine between calls. So this script writes, into OUT (default `.gpu_check/`, ignored by git):

  download/       torch's wheel as downloaded (never carried)
  parts/          that wheel in parts, each sized so that a call's whole tree stays under the limit
  wheels/         the project's other wheels the image lacks (CARRIED; antlr4's runtime built here)
  SHA256SUMS      each part, each wheel and the joined torch wheel (`sha256sum -c` reads it there)
  plan.json, plan.md   the calls: what each carries, its command, the device-time budget

The calls run `bench/gpu_check_offline.sh` there: `receive` checks the parts that have arrived, `run`
joins and checks them, installs everything with `pip install --no-index --no-deps --target` into a
temporary site dir and runs the GPU check (`bench/gpu_check.sh`) with the image's python3.

The NVIDIA libraries and Triton come from the image: carrying what torch 2.13's wheel asks for (cuDNN
9.20 366 MB, NCCL 2.29.7 206 MB, cuSPARSELt 0.8.1 170 MB, Triton 3.7.1 198 MB) would take as many calls
again. The image's (torch 2.11's: cuDNN 9.19.0.56, NCCL 2.28.9, cuSPARSELt 0.8.0, cuBLAS 13.1.0.3; the
first call's `receive --probe` reads them there) were checked here against the functions torch 2.13's
libraries import (`nm -D`): all there but 8 of NCCL's, which `gpu_check_offline.sh run` binds lazily.
Triton 3.6 against 3.7.1 matters to the compile row alone, which runs last.

`--python-version` and `--platform` choose the wheels' target (defaults: the H200 image's); with
`--torch-wheel` a wheel already here is split instead of downloading one (the CPU proof: this
machine's Python and the CPU wheel).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MiB = 1024 * 1024
CALL_LIMIT_BYTES = 64 * MiB  # the device tool: the tree that travels, carried paths included
TREE_MARGIN_BYTES = 2 * MiB  # the tree may grow between preparing and calling
DEVICE_BUDGET_S = 900  # a session's device time, the machine's start and every idle wait included
COMMAND_LIMIT_S = 600  # one command's run

# The H200 image's python3 and its platform tags (manylinux wheels up to glibc 2.28 install there).
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip

# What the check needs beyond the image, at the versions this checkout is tested with (read from the
# environment that runs this script: the project's venv). The rest it needs (numpy, pyarrow, pandas,
# pyyaml, safetensors, tokenizers, huggingface_hub, tensorboard, psutil, einops, pytest, ...) the
# image has at versions the project accepts.
CARRIED = {
    "torchtitan": "not in the image",
    "tyro": "torchtitan's config CLI",
    "docstring-parser": "tyro's",
    "typeguard": "tyro's",
    "typing-extensions": "typeguard needs >= 4.14",
    "spmd-types": "torchtitan imports it",
    "torchdata": "torchtitan imports it",
    "torch-checkpointing": "torchtitan imports it",
    "datasets": "torchtitan's and the project's data loading; not in the image",
    "dill": "datasets'",
    "multiprocess": "datasets'",
    "fsspec": "datasets pins fsspec <= 2026.2.0",
    "hydra-core": "launch.py; not in the image",
    "omegaconf": "Hydra's",
    "antlr4-python3-runtime": "OmegaConf's parser (an sdist only: built into a wheel here)",
    "transformers": "the project needs >= 5.23; the image has 5.17",
}
BUILT_HERE = {"antlr4-python3-runtime"}  # pure Python, no wheel on PyPI

# Device-time estimates for the budget until the first calls measure them (plan.md says which).
ESTIMATES_S = {
    "start": 90,  # the machine's start (the tool's README: "a minute or more")
    "call": 20,  # one warm call: sending a full tree, the short command, the reply
    "gap": 10,  # the caller's turn between a reply and the next call (the machine is held meanwhile)
    "install": 60,  # join and check 500 MB, pip install into the site dir (~1.5 GB unpacked)
    "tests": 40,  # pytest -m cuda on the test files that hold CUDA tests (imports torchtitan)
    "setup": 20,  # gpu_check.py's start: assets, the generated HF dir, the torchtitan import
    "close": 5,  # give_back after the last call
}
# The GPU check's rows in the order it runs them (most important first; bench/gpu_check.py) and the
# estimated seconds of each on one H200 (DEVELOPING.md: an eager run ~25 s, a compiled one ~70 s).
ROWS_S = {
    "native": 2 * 25,
    "hf": 2 * 25,
    "moe kernels=none": 2 * 25,
    "moe kernels=blockwise": 25,  # its bare side is the row above's
    "native compile": 2 * 70,
}


@dataclass
class Call:
    number: int
    carry: list[str]
    carried_bytes: int  # the tree's bytes plus the carried paths'
    command: str
    estimate_s: float  # device time this call holds: transfer + command (+ the start for the first)


def part_sizes(total: int, cap: int, last_room: int) -> list[int]:
    """Sizes of the parts that split `total` bytes into calls of at most `cap` bytes each, the last
    call also carrying `last_room` bytes (the other wheels): full parts, then the remainder."""
    if cap <= last_room:
        raise ValueError(f"a call holds {cap:,} bytes, less than the {last_room:,} the last call carries besides")
    count = math.ceil((total + last_room) / cap)
    sizes = [cap] * (count - 1) + [total - cap * (count - 1)]
    if sizes[-1] <= 0:  # the wheels alone fill the last call: it carries no part
        sizes.pop()
    return sizes


def split(path: Path, sizes: list[int], out_dir: Path) -> list[Path]:
    """`path` cut into consecutive files of `sizes` bytes: `<name>.part01`, ... (joined with `cat`)."""
    if sum(sizes) != path.stat().st_size:
        raise ValueError(f"the parts' sizes add up to {sum(sizes):,} bytes, {path.name} has {path.stat().st_size:,}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{path.name}.part*"):
        old.unlink()
    parts = []
    with open(path, "rb") as source:
        for number, size in enumerate(sizes, 1):
            part = out_dir / f"{path.name}.part{number:02d}"
            with open(part, "wb") as sink:
                left = size
                while left:
                    chunk = source.read(min(left, 16 * MiB))
                    sink.write(chunk)
                    left -= len(chunk)
            parts.append(part)
    return parts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def tree_bytes(repo: Path) -> int:
    """What every call sends besides its carried paths: tracked and untracked-not-ignored files, and
    shared/ where the checkout has one."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    files = {repo / name for name in listed if name}
    if (repo / "shared").is_dir():
        files |= {p for p in (repo / "shared").rglob("*")}
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def carried_versions() -> dict[str, str]:
    """name==version for CARRIED, from this environment (the versions the project's tests pass with)."""
    pins = {}
    for name in CARRIED:
        try:
            pins[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed in {sys.executable}: run this script with the project's "
                             f"venv (.venv/bin/python), which has every package the check carries") from None  # fmt: skip
    return pins


def download_wheels(pins: dict[str, str], wheels: Path, python_version: str, platforms: tuple[str, ...]) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    target = ["--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        target += ["--platform", platform]
    binary = [f"{name}=={version}" for name, version in pins.items() if name not in BUILT_HERE]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", wheels, *binary],
                   check=True)  # fmt: skip
    built = [f"{name}=={version}" for name, version in pins.items() if name in BUILT_HERE]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", wheels, *built], check=True)


def download_torch(version: str, out_dir: Path, python_version: str, platforms: tuple[str, ...]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        target += ["--platform", platform]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *target,
                    "-d", out_dir, f"torch=={version}"], check=True)  # fmt: skip
    return _one(out_dir.glob(f"torch-{version}-*.whl"), f"torch {version}'s wheel in {out_dir}")


def _one(paths, what: str) -> Path:
    found = sorted(paths)
    if len(found) != 1:
        raise SystemExit(f"expected one {what}, found {len(found)}: {[p.name for p in found]}")
    return found[0]


# ---- the plan ----------------------------------------------------------------------------------


def plan_calls(out: Path, repo: Path, tree: int, parts: list[Path], wheels: list[Path],
               estimates: dict[str, float]) -> list[Call]:  # fmt: skip
    """One call per part, the wheels with the last; the first probes the image; the last runs."""
    rel = _carry_path(out, repo)
    sums = f"{rel}/SHA256SUMS"
    wheel_bytes = sum(w.stat().st_size for w in wheels)
    calls = []
    for number, part in enumerate(parts, 1):
        last = number == len(parts)
        carry = [sums, f"{rel}/parts/{part.name}"] + ([f"{rel}/wheels"] if last else [])
        size = tree + (out / "SHA256SUMS").stat().st_size + part.stat().st_size + (wheel_bytes if last else 0)
        command = f"bash bench/gpu_check_offline.sh receive {rel}" + (" --probe" if number == 1 else "")
        estimate = estimates["call"] + estimates["gap"] + (estimates["start"] if number == 1 else 0)
        if last:
            command = f"bash bench/gpu_check_offline.sh run {rel} --budget-s BUDGET_LEFT_S"
        calls.append(Call(number, carry, size, command, estimate))
    return calls


def _carry_path(out: Path, repo: Path) -> str:
    try:
        return str(out.resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(out.resolve())  # not carried from there: the tool carries paths inside the checkout only


def budget(calls: list[Call], estimates: dict[str, float], budget_s: float = DEVICE_BUDGET_S,
           from_call: int = 1) -> dict[str, object]:  # fmt: skip
    """Device time from call `from_call` on, with `budget_s` left: the calls' transfers and gaps, then
    the last command (install, tests, rows) in what is left; rows in their order while they fit."""
    transfers = sum(call.estimate_s for call in calls[from_call - 1 :])
    left = budget_s - transfers - estimates["close"]
    command_s = min(left, COMMAND_LIMIT_S)
    rows_left = command_s - estimates["install"] - estimates["tests"] - estimates["setup"]
    fits, skipped = [], []
    for row, seconds in ROWS_S.items():
        if seconds <= rows_left and not skipped:
            fits.append(row)
            rows_left -= seconds
        else:
            skipped.append(row)
    return {
        "budget_s": budget_s,
        "from_call": from_call,
        "transfers_s": transfers,
        "last_command_s": command_s,
        "rows_that_fit": fits,
        "rows_skipped": skipped,
        "spare_s": rows_left,
    }


def write_plan(out: Path, calls: list[Call], budgeted: dict[str, object], facts: dict[str, object],
               estimates: dict[str, float]) -> str:  # fmt: skip
    (out / "plan.json").write_text(json.dumps(
        {"facts": facts, "estimates_s": estimates, "budget": budgeted, "calls": [asdict(c) for c in calls]},
        indent=2) + "\n")  # fmt: skip
    lines = [
        f"GPU check plan: {len(calls)} calls, each under {CALL_LIMIT_BYTES // MiB} MiB "
        f"(tree {facts['tree_bytes']:,} bytes + carried paths)",
        f"torch wheel {facts['torch_wheel']} ({facts['torch_bytes']:,} bytes) in {len(calls)} parts of at most "
        f"{facts['part_bytes']:,} bytes; {facts['wheel_count']} other wheels, {facts['wheel_bytes']:,} bytes",
        "",
        "| call | carries | MiB | command | device s (est.) |",
        "|---|---|---|---|---|",
    ]
    for call in calls:
        carried = ", ".join(Path(c).name for c in call.carry)
        lines.append(f"| {call.number} | {carried} | {call.carried_bytes / MiB:.1f} | `{call.command}` | "
                     f"{call.estimate_s:.0f} |")  # fmt: skip
    if budgeted["rows_that_fit"]:
        verdict = f"torch {facts['torch_wheel'].split('-')[1]} and the check fit: make the calls in a row"
    else:
        verdict = ("NO ROW FITS after the transfers: send no (more) parts; run the image-only fallback in one call "
                   "(`bash bench/gpu_check_offline.sh probe`)")  # fmt: skip
    lines += [
        "",
        verdict,
        f"device time from call {budgeted['from_call']}: {budgeted['budget_s']:g} s = calls "
        f"{budgeted['transfers_s']:.0f} s (call 1: the machine's start too) + last command {budgeted['last_command_s']:.0f} s (install {estimates['install']}, tests "
        f"{estimates['tests']}, set-up {estimates['setup']}, rows) + give_back {estimates['close']}",
        f"rows that fit, in order: {', '.join(budgeted['rows_that_fit']) or 'none'}; "
        f"skipped: {', '.join(budgeted['rows_skipped']) or 'none'} (spare {budgeted['spare_s']:.0f} s)",
        "estimates, not measurements: "
        + ", ".join(f"{k} {v:g} s" for k, v in estimates.items())
        + ". Call 1's reply: lease.held_s - wall_s = the start + one part's transfer; call 2's: the growth "
        "of held_s - wall_s = one warm call (--call-s); re-plan with both before the rest.",
        "BUDGET_LEFT_S: status's budget_left_s just before the last call, less a minute (a run started in "
        "time may end that much later) and the give_back; that call's timeout_s: budget_left_s, at most 600.",
        "Call in a row, each within the 30 s the machine stays warm; a receive that reports missing parts "
        "means a fresh machine: send those again (each a call) or stop at the image-only fallback "
        "(`bash bench/gpu_check_offline.sh probe`: the image, the matmul peak, no torchtitan).",
    ]
    text = "\n".join(lines)
    (out / "plan.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu_check")
    parser.add_argument("--python-version", default=TARGET_PYTHON, help="the target's Python (default: the image's)")
    parser.add_argument("--platform", action="append", help="the target's platform tags (default: the image's)")
    parser.add_argument("--torch", default=metadata.version("torch").split("+")[0], help="torch version to download")
    parser.add_argument("--torch-wheel", type=Path, help="split this wheel instead of downloading one")
    parser.add_argument("--plan-only", action="store_true", help="re-plan from what OUT holds (no download)")
    parser.add_argument("--budget-s", type=float, default=DEVICE_BUDGET_S, help="device time left (status)")
    parser.add_argument("--from-call", type=int, default=1, help="the next call's number (re-planning midway)")
    for name, seconds in ESTIMATES_S.items():
        parser.add_argument(f"--{name}-s", type=float, default=seconds, help=f"estimate (default {seconds} s)")
    args = parser.parse_args(argv)
    platforms = tuple(args.platform or TARGET_PLATFORMS)
    out = args.out.resolve()
    estimates = {name: getattr(args, f"{name}_s") for name in ESTIMATES_S}
    tree = tree_bytes(REPO)

    if args.plan_only:
        facts = {**json.loads((out / "plan.json").read_text())["facts"], "tree_bytes": tree}
        parts = sorted((out / "parts").glob("*.part*"))
    else:
        pins = carried_versions()
        download_wheels(pins, out / "wheels", args.python_version, platforms)
        torch_wheel = args.torch_wheel or download_torch(args.torch, out / "download", args.python_version, platforms)
        wheels = sorted((out / "wheels").glob("*.whl"))
        wheel_bytes = sum(w.stat().st_size for w in wheels)
        # every call carries SHA256SUMS too: a line per file, well under 4 KiB
        cap = CALL_LIMIT_BYTES - tree - TREE_MARGIN_BYTES - 4096
        parts = split(torch_wheel, part_sizes(torch_wheel.stat().st_size, cap, wheel_bytes), out / "parts")
        joined = f"joined/{torch_wheel.name}"  # where `run` writes the joined wheel
        listed = [(sha256(p), f"{p.parent.name}/{p.name}") for p in [*parts, *wheels]]
        listed.append((sha256(torch_wheel), joined))
        (out / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for digest, name in listed))
        facts = {
            "python_version": args.python_version, "platforms": list(platforms),
            "torch_wheel": torch_wheel.name, "torch_bytes": torch_wheel.stat().st_size, "part_bytes": cap,
            "wheels": {w.name: w.stat().st_size for w in wheels}, "wheel_count": len(wheels),
            "wheel_bytes": wheel_bytes, "tree_bytes": tree, "pins": pins,
        }  # fmt: skip
    wheels = sorted((out / "wheels").glob("*.whl"))
    calls = plan_calls(out, REPO, tree, parts, wheels, estimates)
    over = [c.number for c in calls if c.carried_bytes > CALL_LIMIT_BYTES]
    if over:
        raise SystemExit(f"calls {over} would carry over {CALL_LIMIT_BYTES // MiB} MiB: the tree grew to {tree:,} "
                         f"bytes; prepare again (without --plan-only) to cut smaller parts")  # fmt: skip
    print(write_plan(out, calls, budget(calls, estimates, args.budget_s, args.from_call), facts, estimates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
