"""The bench's side-by-side runner: it reads torchtitan's step lines and speaks torchtitan's CLI."""

from __future__ import annotations

import pytest
from torchtitan.config.manager import ConfigManager

from bench.side_by_side import bare_flag, parse_step_line

# torchtitan 0.3.0's step and validation lines as a run prints them (colour codes included)
TRAIN_LINE = (
    "[rank0]:[titan] 2026-12-03 03:45:14,910 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss:  7.67214  "
    "\x1b[38;2;180;60;0mgrad_norm:  4.9148  \x1b[38;2;54;234;195mmemory:  1.12GiB(4.76%)  \x1b[34mtps: 1,515  "
    "\x1b[36mtflops: 310.25  \x1b[35mmfu: 31.37%\x1b[39m"
)
VALIDATION_LINE = (
    "[rank0]:[titan] 2026-12-03 03:45:20,001 - root - INFO - \x1b[33mvalidate step:  5  \x1b[32mloss:  7.1234  "
    "\x1b[36mmemory:  1.20GiB(5.00%)  \x1b[34mtps: 9,000\x1b[39m"
)


def test_step_lines_give_step_loss_tokens_per_second_and_tflops():
    assert tuple(parse_step_line(TRAIN_LINE)) == (1, 7.67214, 1515.0, 310.25)
    assert parse_step_line(VALIDATION_LINE) is None  # validation throughput is not training throughput
    assert parse_step_line("step: warm-up done") is None


@pytest.mark.parametrize("enable", [True, False])
def test_bare_flags_set_the_fields_torchtitan_reads(enable):
    args = ["--module", "qwen3", "--config", "qwen3_debugmodel"]
    flags = [bare_flag("compile.enable", enable), bare_flag("training.seq_len", 64), bare_flag("debug.seed", 7)]
    config = ConfigManager().parse_args([*args, *flags])
    assert (config.compile.enable, config.training.seq_len, config.debug.seed) == (enable, 64, 7)
