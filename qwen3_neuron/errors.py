"""The project's errors: one base class, so a caller can catch everything the framework raises
on purpose. Each also keeps the builtin base that says what kind of failure it is."""


class Qwen3NeuronError(Exception):
    """Base of every error the framework raises on purpose."""


class ConfigError(Qwen3NeuronError, ValueError):
    """Bad input found at plan time; the message names the key and what would be valid."""


class DataError(Qwen3NeuronError, ValueError):
    """Bad data found while reading it (in a worker too): the message names the file and line
    of the first unfit row and what to change."""


class DeviceUnavailableError(Qwen3NeuronError, ValueError):
    """The requested device cannot be used here; the message says what is missing."""


class UnsupportedModel(Qwen3NeuronError, ValueError):
    """A model that cannot be described in Transformers' terms (config.json)."""


class NotAModelDir(Qwen3NeuronError, ValueError):
    """The dir lacks what makes it an HF model dir (config.json, weights)."""


class ExportError(Qwen3NeuronError, RuntimeError):
    """The HF export after training could not be made; nothing was left under its name."""


class FirstLossError(Qwen3NeuronError, RuntimeError):
    """The first-step loss says the initial weights did not load (hf.first_loss_check=fail)."""


class RunDirInUse(Qwen3NeuronError, RuntimeError):
    """Another live launch holds the run dir; the message names it and what to do."""


class JobFailed(Qwen3NeuronError, RuntimeError):
    """Raised to Hydra's sweeper for a failed job when the sweep should stop."""


class RewardError(Qwen3NeuronError, RuntimeError):
    """A GRPO reward function (the user's code) failed on a batch; the message names it, the line
    of its own that raised, and the completion."""


class NkiUnavailableError(Qwen3NeuronError, ImportError):
    """NKI kernels were asked for where NKI / torch-neuronx cannot be imported."""


def user_error_label(error: BaseException) -> str | None:
    """How the console names a mistake the user can fix ("Config error"), or None for a crash."""
    if isinstance(error, DataError):
        return "Data error"
    if isinstance(error, ConfigError):
        return "Config error"
    if isinstance(error, RewardError):
        return "Reward error"
    return None
