"""Install the project into the current Python environment of a Trainium instance, keeping AWS's stack.

    python scripts/setup_neuron.py                       # or: make setup-neuron PYTHON=python
    python scripts/setup_neuron.py --extra-index-url URL  # its arguments go to pip

For an environment where torch-neuronx (TorchNeuron, with its torch build) and a torchtitan
(AWS's torchtitan-neuron fork, installed editable as the `torchtitan` package, or upstream
0.3.0) are already installed. `pip install -e .` there would replace that torchtitan with
upstream 0.3.0 (pyproject pins it), and `make setup` installs its own torch into its own venv.
This installs the project's own dependencies (pyproject's, and the dev extra's for the tests),
never torch or torchtitan: they, torch-neuronx and (where installed) neuronx-cc and nki are held at
their installed versions by a pip constraints file, so a dependency that wanted another version
makes pip fail instead of swapping them. Then the project itself, editable, with --no-deps. Whether that torchtitan has every API
the project uses is checked by each launch's plan (qwen3_neuron/job/checks/torchtitan_api.py).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Installed by AWS's set-up and kept as they are. triton is in pyproject only because upstream
# torchtitan 0.3.0 imports it: the installed torchtitan's own requirements bring what it imports.
KEPT = {"torch": "torch", "torch-neuronx": "torch_neuronx", "torchtitan": "torchtitan"}
ALSO_HELD = ("neuronx-cc", "nki")  # the rest of AWS's stack, held too where installed
NOT_OURS = {"triton"}
NEURON_SETUP = (
    "Install AWS's stack first (Neuron docs: 'Install and verify torch-neuronx', then 'How to set up "
    "TorchTitan Neuron'): pip install 'torch-neuronx==2.14.*' 'neuronx-cc==2.*' nki --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com --extra-index-url https://download.pytorch.org/whl/cpu; then "
    "git clone https://github.com/aws-neuron/torchtitan-neuron && pip install -r torchtitan-neuron/requirements.txt "
    "&& pip install -e torchtitan-neuron"
)


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """pyproject's dependencies and its dev extra, less what AWS's set-up installs (and triton)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    skip = set(KEPT) | NOT_OURS
    return [r for r in wanted if requirement_name(r) not in skip]


def requirement_name(requirement: str) -> str:
    """A requirement's project name, normalised as pip compares them (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group()
    return re.sub(r"[-_.]+", "-", name).lower()


def kept_versions() -> dict[str, str]:
    """{distribution: installed version} of torch, torch-neuronx and torchtitan (exits, 2, naming
    what is missing), and of neuronx-cc and nki where installed."""
    found, missing = {}, []
    for dist, module in KEPT.items():
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
            continue
        if importlib.util.find_spec(module) is None:
            missing.append(f"{dist} (installed as {found.pop(dist)}, but `import {module}` finds nothing)")
    if missing:
        print(
            f"setup_neuron: not installed in this environment ({sys.executable}): {', '.join(missing)}. "
            f"This set-up keeps an installed TorchNeuron and torchtitan. {NEURON_SETUP}. On a machine "
            "without Trainium, `make setup` makes a venv of its own instead.",
            file=sys.stderr,
        )
        sys.exit(2)
    for dist in ALSO_HELD:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main(pip_args: list[str]) -> None:
    before = kept_versions()
    pip = [sys.executable, "-m", "pip", "install", *pip_args]
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "keep.txt"
        constraints.write_text("".join(f"{dist}=={version}\n" for dist, version in before.items()))
        subprocess.run([*pip, "-c", str(constraints), *project_requirements()], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)  # its torchtitan pin is not for this env
    importlib.invalidate_caches()
    after = {dist: importlib.metadata.version(dist) for dist in before}
    if after != before:  # the constraints forbid it; say so if it happened all the same
        sys.exit(f"setup_neuron: versions changed: {before} -> {after}")
    kept = ", ".join(f"{dist} {version}" for dist, version in after.items())
    print(f"setup_neuron: installed qwen3-neuron and its own dependencies; kept {kept}")
    # what the constraints do not hold (e.g. a numpy that neuronx-cc pins), pip's own check reports;
    # qwen3-neuron's torchtitan pin (against another torchtitan) and triton are expected there
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    if check.returncode:
        print("setup_neuron: pip check says (qwen3-neuron's torchtitan==0.3.0 and triton, upstream "
              f"torchtitan's import, are expected there):\n{check.stdout}")  # fmt: skip


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))
    main(sys.argv[1:])
