"""Stock torchtitan with the project's device fixes and nothing else.

    torchrun --nproc_per_node 2 -m qwen3_neuron.worker.torchtitan_cli --device cpu \\
        --module qwen3 --config qwen3_debugmodel --training.steps 5 ...

Every argument except `--device` (auto|cpu|cuda|neuron, default auto) is torchtitan's own CLI.
Runs `torchtitan.train.main()` unchanged after `devices.install(device)`, with the device's
override imports (`devices.override_imports`) appended to `--override.imports`. This is how a
user runs bare torchtitan on CPU, and the baseline the project's benchmark compares against.
"""

from __future__ import annotations

import sys

from qwen3_neuron.devices.fixes import install
from qwen3_neuron.devices.policy import override_imports, resolve_device
from qwen3_neuron.hf_backend import HF_BACKEND_NAME

DEVICE_FLAG = "--device"
OVERRIDE_FLAG = "--override.imports"


def split_device(argv: list[str]) -> tuple[str, list[str]]:
    """(`--device` value or "auto", the remaining arguments for torchtitan)."""
    device, rest = "auto", []
    args = iter(argv)
    for arg in args:
        if arg == DEVICE_FLAG:
            device = next(args, None)
            if device is None:
                raise SystemExit(f"{DEVICE_FLAG} needs a value: auto, cpu, cuda or neuron")
        elif arg.startswith(DEVICE_FLAG + "="):
            device = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return device, rest


def model_kind(titan_args: list[str]) -> str:
    """"hf" for torchtitan's Transformers backend (`--module transformers_modeling_backend`)."""
    for index, arg in enumerate(titan_args):
        if arg == "--module" and index + 1 < len(titan_args):
            module = titan_args[index + 1]
        elif arg.startswith("--module="):
            module = arg.split("=", 1)[1]
        else:
            continue
        return "hf" if module.endswith(HF_BACKEND_NAME) else "native"
    return "native"


def with_override_imports(titan_args: list[str], targets: list[str]) -> list[str]:
    """`titan_args` with `targets` added to one `--override.imports` flag (tyro keeps only the
    last flag given, so the user's targets and ours must share it)."""
    if not targets:
        return titan_args
    from torchtitan.config.override import parse_cli_imports

    rest, given = [], []
    index = 0
    while index < len(titan_args):
        arg = titan_args[index]
        index += 1
        if arg.startswith(OVERRIDE_FLAG + "="):
            given.append(arg.split("=", 1)[1])
        elif arg == OVERRIDE_FLAG:
            while index < len(titan_args) and not titan_args[index].startswith("--"):
                given.append(titan_args[index])
                index += 1
        else:
            rest.append(arg)
    named = {entry if isinstance(entry, str) else entry[0] for entry in parse_cli_imports(given)}
    return rest + [OVERRIDE_FLAG, *given, *(t for t in targets if t not in named)]


def main(argv: list[str] | None = None) -> None:
    requested, titan_args = split_device(sys.argv[1:] if argv is None else argv)
    device_type = resolve_device(requested)
    install(device_type)  # before torchtitan.train imports the rest of torchtitan
    titan_args = with_override_imports(titan_args, override_imports(device_type, model_kind(titan_args)))
    sys.argv = [sys.argv[0], *titan_args]  # torchtitan's ConfigManager reads sys.argv

    from torchtitan.train import main as torchtitan_main

    torchtitan_main()


if __name__ == "__main__":
    main()
