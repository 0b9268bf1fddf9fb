"""The offline GPU check's preparation and its receiving end: parts that join to the wheel, calls that
stay under the device tool's limit, the budget's row order, the shell side's checksums, and MFU against
torchtitan's data-sheet peak."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
from pathlib import Path

import pytest

from bench.gpu_check import Row, table_lines
from bench.gpu_check_prepare import (
    CALL_LIMIT_BYTES,
    ESTIMATES_S,
    ROWS_S,
    budget,
    part_sizes,
    plan_calls,
    sha256,
    split,
)
from bench.side_by_side import Timing
from qwen3_neuron.report.peak_flops import datasheet_peak_flops

REPO = Path(__file__).resolve().parents[1]
OFFLINE = REPO / "bench" / "gpu_check_offline.sh"


def prepared(tmp_path: Path, wheel_bytes: int = 1_000_003, cap: int = 300_000) -> tuple[Path, Path, list[Path]]:
    """A prepared dir as bench/gpu_check_prepare.py writes it, for a random 'wheel' and one other wheel."""
    out = tmp_path / "prep"
    wheel = tmp_path / "torch-0.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(wheel_bytes))
    (out / "wheels").mkdir(parents=True)
    other = out / "wheels" / "tiny-1.0-py3-none-any.whl"
    other.write_bytes(os.urandom(50_000))
    parts = split(wheel, part_sizes(wheel_bytes, cap, other.stat().st_size), out / "parts")
    listed = {f"{p.parent.name}/{p.name}": p for p in [*parts, other]}
    listed[f"joined/{wheel.name}"] = wheel  # where `run` writes the joined wheel
    (out / "SHA256SUMS").write_text("".join(f"{sha256(path)}  {name}\n" for name, path in listed.items()))
    return out, wheel, parts


def test_parts_join_to_the_wheel_in_as_few_calls_as_the_limit_allows(tmp_path):
    out, wheel, parts = prepared(tmp_path)
    assert len(parts) == math.ceil((1_000_003 + 50_000) / 300_000) == 4
    assert [p.name[-6:] for p in parts] == ["part01", "part02", "part03", "part04"]  # `cat *.part*` order
    assert max(p.stat().st_size for p in parts) == 300_000
    assert parts[-1].stat().st_size + 50_000 <= 300_000  # the last call has room for the other wheels
    joined = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == sha256(wheel)


def test_a_call_cannot_hold_the_other_wheels_alone():
    with pytest.raises(ValueError, match="less than the 400,000"):
        part_sizes(1_000_000, cap=300_000, last_room=400_000)


def test_each_call_carries_the_sums_and_stays_under_the_limit(tmp_path):
    out, _, parts = prepared(tmp_path)
    calls = plan_calls(out, tmp_path, tree=1_000, parts=parts, wheels=sorted((out / "wheels").glob("*.whl")),
                       estimates=ESTIMATES_S)  # fmt: skip
    assert [c.carry[1].rsplit(".", 1)[-1] for c in calls] == ["part01", "part02", "part03", "part04"]
    assert all(c.carry[0] == "prep/SHA256SUMS" for c in calls)
    assert calls[-1].carry[2] == "prep/wheels" and all(len(c.carry) == 2 for c in calls[:-1])
    assert calls[0].command.endswith("receive prep --probe") and "run prep --budget-s" in calls[-1].command
    assert all(c.carried_bytes <= 300_000 + 1_000 + 4096 for c in calls) and 300_000 < CALL_LIMIT_BYTES
    assert calls[0].estimate_s == ESTIMATES_S["start"] + ESTIMATES_S["call"] + ESTIMATES_S["gap"]


def test_the_budget_keeps_the_rows_in_order_and_skips_from_the_first_that_does_not_fit(tmp_path):
    out, _, parts = prepared(tmp_path)
    calls = plan_calls(out, tmp_path, 1_000, parts, [], ESTIMATES_S)
    fixed = sum(c.estimate_s for c in calls) + ESTIMATES_S["close"] + ESTIMATES_S["install"] + ESTIMATES_S["tests"]
    fixed += ESTIMATES_S["setup"]
    two_rows = fixed + ROWS_S["native"] + ROWS_S["hf"] + 1
    planned = budget(calls, ESTIMATES_S, budget_s=two_rows)
    assert planned["rows_that_fit"] == ["native", "hf"]
    assert planned["rows_skipped"] == ["moe kernels=none", "moe kernels=blockwise", "native compile"]
    assert budget(calls, ESTIMATES_S, budget_s=900)["last_command_s"] <= 600  # one command's limit
    assert budget(calls, ESTIMATES_S, budget_s=fixed)["rows_that_fit"] == []  # the plan then says: no parts
    midway = budget(calls, ESTIMATES_S, budget_s=two_rows, from_call=2)  # call 1 (the start) made already
    assert midway["transfers_s"] == sum(c.estimate_s for c in calls[1:])
    assert midway["rows_that_fit"][:3] == ["native", "hf", "moe kernels=none"]


def run_offline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(OFFLINE), *args], capture_output=True, text=True, timeout=60)


def test_receive_names_the_parts_here_and_missing_and_refuses_a_bad_one(tmp_path):
    out, _, parts = prepared(tmp_path)
    parts[2].unlink()
    parts[3].unlink()
    done = run_offline("receive", str(out))
    assert done.returncode == 0  # parts still to come are no error while receiving
    assert "parts here: 01 02 (2 of 4); missing: 03 04" in done.stdout
    with open(parts[1], "r+b") as part:  # a part that broke on the way
        part.write(b"x")
    bad = run_offline("receive", str(out))
    assert bad.returncode == 1 and "does not match SHA256SUMS: send it again" in bad.stderr


def test_run_stops_before_installing_while_parts_are_missing(tmp_path):
    out, _, parts = prepared(tmp_path)
    parts[0].unlink()
    done = run_offline("run", str(out), "--device", "cpu")
    assert done.returncode == 2
    assert "missing: 01" in done.stdout and "send the missing parts first" in done.stderr
    assert "install into" not in done.stdout


@pytest.mark.parametrize(
    "name", ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB",
             "NVIDIA H20", "NVIDIA B200", "NVIDIA GB200"],
)  # fmt: skip
def test_datasheet_peak_is_torchtitans(name, monkeypatch):
    from torchtitan.tools import utils

    monkeypatch.setattr(utils.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=""))
    assert datasheet_peak_flops(name) == utils.get_peak_flops(name)  # lspci lists no H100: the name decides


def test_mfu_against_the_data_sheet_sits_beside_the_measured_one():
    assert datasheet_peak_flops("NVIDIA H200") == 989e12
    assert datasheet_peak_flops("AMD EPYC 7B13") is None  # torchtitan would take A100's: no column then
    timing = Timing(first_step_s=10.0, tps=40_000.0, tflops=None, wall_s=30.0, losses=(), last_step_to_exit_s=1.0)
    row = Row("native", "qwen3", "qwen3_0_6b", [], {}, bare=timing, ours=timing, peak_flops=790e12,
              flops_per_token=5e9)  # fmt: skip
    header, _, line = table_lines([row], sheet_peak=989e12)
    assert header.split(" | ")[-2:] == ["bare MFU sheet", "ours MFU sheet |"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:6] == ["25.32%", "25.32%"]  # 40,000 x 5e9 / 790e12
    assert cells[-2:] == ["20.22%", "20.22%"]  # / 989e12
    assert "MFU sheet" not in table_lines([row])[0]
