"""Did the initial weights load? Judge the first step's loss against a random-initialised model.

A model that knows nothing predicts about uniformly over its vocabulary: cross-entropy ln(V)
(7.62 nats for the tiny models' 2,048 tokens, 11.93 for Qwen3's 151,936). Measured on the tiny
models, random initialisations start at or above it: 7.66 (native tiny), 7.68 (the tiny HF dir's
own untrained weights), 14.2 (the Transformers backend's init of a tied model, whose embedding
rows predict the input token). Weights that learned anything start clearly below: the tiny dense
model after 10 steps at lr 3e-3 starts a new run at 5.7; a pretrained Qwen3 starts near 2-3.

So when initial weights were loaded, the first loss must be at least `MARGIN_NATS` below ln(V).
One nat (the model is e times more confident in the right token than a uniform guess) is far
outside the scatter of random starts (none below ln(V) - 0.1) and well inside what any trained
model reaches. A first loss above that line almost always means the weights did not arrive:
wrong dir, keys that did not match (so the model kept its init), or a run that resumed from a
fresh checkpoint instead. It can also mean the loaded weights are themselves untrained (the
project's tiny HF dirs are), which is why the default is to warn, not fail.

`hf.first_loss_check`: warn (default) | fail | off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from qwen3_neuron.errors import FirstLossError

MARGIN_NATS = 1.0

CheckMode = Literal["warn", "fail", "off"]


@dataclass(frozen=True)
class LossVerdict:
    first_loss: float | None
    random_init_loss_reference: float  # ln(vocab_size)
    threshold: float  # a loaded model's first loss should be below this
    weights_loaded: bool
    ok: bool  # False only when weights were loaded and the first loss is not below threshold
    message: str

    def fails(self, mode: CheckMode) -> bool:
        """Whether `hf.first_loss_check=mode` fails the run."""
        return mode == "fail" and not self.ok and self.first_loss is not None

    def summary_fields(self, mode: CheckMode = "warn") -> dict:
        """What summary.json records; `first_loss_check`: ok, weights_probably_not_loaded,
        no_initial_weights (nothing to check) or off (hf.first_loss_check=off)."""
        if mode == "off":
            check = "off"
        elif not self.weights_loaded:
            check = "no_initial_weights"
        else:
            check = "ok" if self.ok else "weights_probably_not_loaded"
        return {
            "first_loss": self.first_loss,
            "random_init_loss_reference": round(self.random_init_loss_reference, 4),
            "first_loss_check": check,
        }


def judge_first_loss(first_loss: float | None, vocab_size: int, weights_loaded: bool) -> LossVerdict:
    """Compare the first step's loss with ln(vocab_size); see the module docstring."""
    reference = math.log(vocab_size)
    threshold = reference - MARGIN_NATS
    if not weights_loaded:
        return LossVerdict(first_loss, reference, threshold, False, True, "no initial weights were loaded")
    if first_loss is None or not math.isfinite(first_loss):
        message = f"first-step loss is {first_loss}: cannot tell whether the initial weights loaded"
        return LossVerdict(first_loss, reference, threshold, True, False, message)
    if first_loss < threshold:
        message = (
            f"first-step loss {first_loss:.3f} is {reference - first_loss:.2f} nats below the "
            f"random-init reference ln({vocab_size}) = {reference:.3f}: the initial weights loaded"
        )
        return LossVerdict(first_loss, reference, threshold, True, True, message)
    message = (
        f"INITIAL WEIGHTS PROBABLY NOT LOADED: first-step loss {first_loss:.3f} is not below "
        f"{threshold:.3f} (random-init reference ln({vocab_size}) = {reference:.3f} minus "
        f"{MARGIN_NATS:g} nat). A model that loaded trained weights starts clearly below a "
        f"random one. Check checkpoint.initial_load_path / model.hf_model, that the weights' key "
        f"names match the model, and that <run dir>/checkpoint did not hold an older checkpoint "
        f"(torchtitan then resumes from it instead). If the loaded weights are untrained (like "
        f"the project's tiny HF dirs), this is expected: set hf.first_loss_check=off."
    )
    return LossVerdict(first_loss, reference, threshold, True, False, message)


def enforce(verdict: LossVerdict, mode: CheckMode, warn=print) -> None:
    """warn: print the message loudly; fail: raise FirstLossError; off: nothing."""
    if mode == "off" or verdict.ok:
        return
    if mode == "fail":
        raise FirstLossError(verdict.message)
    warn(_banner(verdict.message))


def _banner(message: str) -> str:
    line = "!" * 80
    return f"{line}\n{message}\n{line}"


def check_first_loss(
    first_loss: float | None, vocab_size: int, weights_loaded: bool, mode: CheckMode, warn=print
) -> LossVerdict:
    """The launcher's call after a run: judge its first logged loss, warn unless mode is off.

    The caller marks the run failed when `verdict.fails(mode)`. A run that logged no step
    (first_loss None) is judged but not warned about: it failed for another reason.
    """
    verdict = judge_first_loss(first_loss, vocab_size, weights_loaded)
    if first_loss is not None and mode != "off" and not verdict.ok:
        suffix = " The run is marked failed (hf.first_loss_check=fail)." if mode == "fail" else ""
        warn(_banner(verdict.message + suffix))
    return verdict
