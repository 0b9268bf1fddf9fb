"""The `eval` section: which lm-eval tasks score a run's HF export, and how."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class EvalSettings:
    kind: Literal["none", "lm_eval"] = "none"
    """none: no evaluation; lm_eval: EleutherAI's lm-evaluation-harness scores the HF export once
    training ends (the launcher, after the workers; the run and its export are kept whatever
    the evaluation does)."""

    tasks: list[str] = field(default_factory=list)
    """lm-eval task, group or tag names (lm-eval's registry, the project's own tasks under
    qwen3_neuron/eval/tasks/, and those under `include_path`)."""

    limit: int | float | None = None
    """At most this many documents per task (< 1: that fraction of them); null: all."""

    num_fewshot: int | None = None
    """Few-shot examples per prompt; null: each task's own default."""

    batch_size: int | str = 1
    """Documents per forward pass, or "auto" (lm-eval finds the largest that fits)."""

    apply_chat_template: bool = False
    """Render each prompt with the model's chat template (chat-tuned runs: data=chat)."""

    include_path: str | list[str] | None = None
    """Folders of your own lm-eval task YAMLs (e.g. `dataset_path: json` over local files)."""

    device: str | None = None
    """Where the model runs: null is the run's device where Transformers runs there (cuda), else
    cpu (Transformers has no Neuron backend)."""
