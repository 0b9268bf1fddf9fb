"""`uv pip ...` for the venv this runs in, with the package indexes pip is set up with.

    .venv/bin/python scripts/uv_pip.py install -c pin.txt -e ".[dev]"

uv installs the project's ~150 packages in seconds where pip takes minutes, but reads no pip
configuration. This hands it pip's own (`pip config list`: its files and PIP_* variables) index-url,
extra-index-url, find-links and cert, and has it weigh every index as pip does. pip's constraint
setting is left out: the Makefile pins torch itself.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}  # the later wins, as in pip install
LIST_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}


def pip_settings() -> dict[str, str]:
    """pip's effective settings by option name (a PIP_* variable over a file's, as pip reads them)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found: list[tuple[int, str, str]] = []
    for line in listed.splitlines():  # global.find-links='/opt/wheels'; :env:.find-links='...'
        key, _, value = line.partition("=")
        section, _, option = key.rpartition(".")
        if section in PRECEDENCE:
            found.append((PRECEDENCE[section], option, ast.literal_eval(value)))
    # each file's lines in the order pip reads the files, the later winning; then the variables
    return {option: value for _, option, value in sorted(found, key=lambda entry: entry[0])}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    arguments = ["--index-strategy", "unsafe-best-match"]
    for option, flag in LIST_OPTIONS.items():
        for value in settings.get(option, "").split():
            arguments += [flag, value]
    return arguments


def main(argv: list[str]) -> int:
    settings = pip_settings()
    env = dict(os.environ)
    if "cert" in settings:
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    uv = Path(sys.executable).with_name("uv")
    command = [str(uv), "pip", *argv[:1], "--python", sys.executable, *uv_arguments(settings), *argv[1:]]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
