"""Live progress of one job in the launcher's terminal, read from rank 0's `metrics.jsonl`.

    [qwen3-neuron] #2 model=moe  step 3/5  loss 7.2871  val 7.3012 (step 2)  tok/s 1,234  mfu 1.20%  ETA 0:00:04

(`val`: the last validation loss and the step it was measured at, when the run validates;
data=prompts: `reward`, the step's mean reward, and `val reward`, the held-out prompts';
`rows not trained`: rank 0's share of the rows it read that were dropped or skipped, once above
1 % - the end-of-run lines say which and why.)

A thread polls the file (every 0.5 s) while torchrun runs. On a terminal the line is rewritten in
place (`\\r`); otherwise (a pipe, a CI log) one plain line is printed per logged step, once the
next step's record (or the end) shows that step complete with its validation, if any. The numbers
are the ones torchtitan logged (see qwen3_neuron.worker.metrics); torchtitan's full log is in the run
dir's train.log, and on screen with run.verbose=true instead of this line.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from qwen3_neuron.report.summary import NO_SIGNAL, without_signal

POLL_SECONDS = 0.5
WARN_NOT_TRAINED = 0.01  # as the end-of-run lines (report.summary): a share of rows dropped or skipped
PREFIX = "[qwen3-neuron]"


class Progress:
    def __init__(
        self, metrics_path: Path, total_steps: int, label: str = "", stream: TextIO | None = None, earlier_bytes: int = 0
    ):
        """`earlier_bytes`: the size of metrics.jsonl before this launch's torchrun started (a
        resumed run appends to it), not shown. What the workers logged since is, even when they
        logged it before the line started."""
        self._path = Path(metrics_path)
        self._total = total_steps
        self._label = label
        self._stream = stream or sys.stdout
        self._tty = self._stream.isatty()
        self._offset = earlier_bytes  # bytes of metrics.jsonl already read
        self._pending = b""  # a line the writer has not finished yet
        self._first: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None
        self._validation: tuple[int, str, float] | None = None  # the last validation: step, label, figure
        self._unprinted = False  # not on a terminal: the last step's line is still to print
        self._silent = 0  # GRPO steps in a row without a learning signal, up to the last
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._width = 0  # of the line last drawn on a terminal

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._start = time.monotonic()
        if not self._tty:
            self._emit(self.line())  # "starting": a pipe sees the job begin
        self._thread.start()

    def stop(self) -> None:
        """Read what is left, draw the last state and end the line."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._poll()
        if self._tty:
            self._draw(self.line())
            self._stream.write("\n")
            self._stream.flush()
        elif self._unprinted:
            self._emit(self.line())

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._poll()
            if self._tty:
                self._draw(self.line())  # redrawn even without news: the clock moves

    def _poll(self) -> bool:
        """Read records appended since the last poll; True when there were any."""
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return False
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        for record in records:  # in the order logged: a step's validation follows its training record
            if "val_loss" in record:
                self._validation = record["step"], "val", record["val_loss"]
            elif "val_reward" in record:  # data=prompts: the held-out prompts' reward
                self._validation = record["step"], "val reward", record["val_reward"]
            if "loss" in record:  # a training step: the one before it is complete
                if self._unprinted:
                    self._emit(self.line())
                self._say_signal(record)
                self._first = self._first or record
                self._last, self._unprinted = record, not self._tty
        return bool(records)

    def line(self) -> str:
        label = f" {self._label}" if self._label else ""
        last = self._last
        if last is None:
            return f"{PREFIX}{label}  starting ({_clock(time.monotonic() - self._start)})"
        parts = [f"step {last['step']}/{self._total}"]
        grpo = last.get("reward") is not None
        if grpo:  # the reward is what moves, not the surrogate loss (in metrics.jsonl): the line keeps 80 columns
            held_out = f" val {self._validation[2]:.3f}" if self._validation is not None else ""
            parts.append(f"reward {last['reward']:.3f}{held_out}")
        else:
            parts.append(f"loss {last.get('loss', float('nan')):.4f}")
            if self._validation is not None:
                step, figure, value = self._validation
                parts.append(f"{figure} {value:.4f} (step {step})")
        if last.get("tools/call_frequency") is not None:  # grpo.tools: calls per completion, the share failed
            parts.append(f"tools {last['tools/call_frequency']:.2f} ({last['tools/failure_frequency']:.0%} failed)")
        if last.get("reward_accuracy") is not None:  # data=preference
            parts.append(f"acc {last['reward_accuracy']:.2f}  margin {last['reward_margin']:.3f}")
        elif "units" in last:  # trainer=kto: its KL estimate, and the margin when the step had both kinds
            margin = last.get("reward_margin")
            parts.append(f"kl {last['kl']:.4f}" + (f"  margin {margin:.3f}" if margin is not None else ""))
        if last.get("tokens_per_second") is not None:
            parts.append(f"tok/s {last['tokens_per_second']:,.0f}")
        if last.get("mfu") is not None and not grpo:
            parts.append(f"mfu {100 * last['mfu']:.2f}%")
        if last.get("rows_not_trained", 0) > WARN_NOT_TRAINED:
            parts.append(f"WARNING {100 * last['rows_not_trained']:.1f}% rows not trained")
        eta = self._eta()
        parts.append(f"ETA {_clock(eta)}" if eta is not None else "ETA --")
        return f"{PREFIX}{label}  " + "  ".join(parts)

    def _say_signal(self, record: dict[str, Any]) -> None:
        """data=prompts: a step without a learning signal said at once, and again as the streak doubles."""
        self._silent = self._silent + 1 if without_signal(record) else 0
        if self._silent and self._silent & (self._silent - 1) == 0:
            label = f" {self._label}" if self._label else ""
            step = record["step"]
            steps = f"step {step}" if self._silent == 1 else f"steps {step - self._silent + 1}-{step}, {self._silent} in a row"
            self._say(f"{PREFIX}{label}  no learning signal at {steps}: {NO_SIGNAL}.")

    def _say(self, text: str) -> None:
        """A line of its own above the live line."""
        if self._tty:
            self._stream.write("\r" + text.ljust(self._width) + "\n")
            self._stream.flush()
            self._width = 0
        else:
            self._emit(text)

    def _eta(self) -> float | None:
        """Seconds left at the pace since the first logged step (step 1 carries start-up)."""
        first, last = self._first, self._last
        if first is None or last is None or last["step"] >= self._total:
            return 0.0 if last is not None and last["step"] >= self._total else None
        steps_done = last["step"] - first["step"]
        if steps_done <= 0 or "elapsed_seconds" not in last:
            return None
        per_step = (last["elapsed_seconds"] - first["elapsed_seconds"]) / steps_done
        return per_step * (self._total - last["step"])

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size().columns - 1
        text = text[:width]  # a wrapped line cannot be redrawn with \r
        pad = " " * max(0, self._width - len(text))
        self._stream.write(f"\r{text}{pad}")
        self._stream.flush()
        self._width = len(text)

    def _emit(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))
