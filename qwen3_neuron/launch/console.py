"""What the launcher's screen shows of the log: each message once, and torchtitan's
information lines (the plan's `[Override]` list, tokenizer loading, ...) only with
`run.verbose=true`. Hydra's `launch.log` in the run dir keeps every line either way.

A plan made here (dry run, `run.show_data`) builds the config more than once, and torchtitan
logs its findings each time; its INFO lines go through the root logger, as Hydra's own lines
do not. A warning no user can act on (`NOT_ACTIONABLE`) goes to `launch.log` only. The project's
own lines logged there (the data pipeline's `[qwen3-neuron data] ...`) show as they are written,
without the logger's time and level prefix.
"""

from __future__ import annotations

import logging
import warnings

# torchtitan's base configs keep initial_load_model_only=True beside no initial_load_path, and its
# checkpoint config warns of it each time one is made; its to_dict, which the record writes
# trainer_config.json with, notes each torch.dtype of a config (model=hf's) it writes as text
NOT_ACTIONABLE = (
    "initial_load_model_only=True has no effect without an initial_load_path.",
    "Config field value of type dtype may not be JSON serializable",
)


class _Quiet(logging.Filter):
    def __init__(self, verbose: bool):
        super().__init__()
        self.verbose = verbose
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.verbose and record.name == "root" and record.levelno < logging.WARNING:
            return False
        key = (record.levelno, record.getMessage())
        if key[1] in NOT_ACTIONABLE or key in self.seen:
            return False
        self.seen.add(key)
        return True


class _ProjectLinesBare(logging.Formatter):
    """The project's own lines as written; every other record in the handler's own format."""

    def __init__(self, others: logging.Formatter | None):
        super().__init__()
        self.others = others or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        return message if message.startswith(PROJECT_PREFIX) else self.others.format(record)


PROJECT_PREFIX = "[qwen3-neuron"


def quiet_console(verbose: bool) -> None:
    """Filter the screen handlers Hydra set up (idempotent: a sweep's jobs call it again)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.filters = [f for f in handler.filters if not isinstance(f, _Quiet)]
            handler.addFilter(_Quiet(verbose))
            if not isinstance(handler.formatter, _ProjectLinesBare):
                handler.setFormatter(_ProjectLinesBare(handler.formatter))
    if not verbose:
        # a plan made here reads the first rows: datasets' progress bars and torchdata's
        # deprecation notice say nothing about the user's run
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
