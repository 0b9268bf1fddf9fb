"""The trn2 set-up path (`scripts/setup_neuron.py`, `make setup-neuron`) keeps AWS's stack, and the
plan accepts whichever torchtitan is installed once it has the APIs the project uses.

Run for real, with pip, in a throwaway venv standing in for a Trainium instance's: torch,
torch-neuronx and AWS's torchtitan fork (0.2.2+neuron.2) "installed" as small stand-in packages,
the project's other dependencies as installed metadata at this venv's versions (so pip needs no
index), pip and setuptools linked in from this venv. The project is a copy of pyproject.toml with
the set-up script and an empty package, so the editable install writes nothing into this tree.
The API check is tested on this venv's torchtitan 0.3.0 with one of its APIs taken away.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose_job

from qwen3_neuron.errors import ConfigError, DeviceUnavailableError
from qwen3_neuron.job.checks.torchtitan_api import TorchtitanApi, check_torchtitan_api

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from setup_neuron import project_requirements, requirement_name  # noqa: E402

FORK = "0.2.2+neuron.2"  # AWS's torchtitan-neuron on Neuron SDK 2.34
STAND_INS = {"torch": "2.14.0", "torch-neuronx": "2.14.3.1", "torchtitan": FORK}


def _dist(site: Path, name: str, version: str, module: str | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if module:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text(f"# {name} {version}, installed before the project\n")


def _link_from_this_venv(site: Path, dist_name: str) -> None:
    dist = importlib.metadata.distribution(dist_name)
    tops = {f.parts[0] for f in dist.files if f.parts[0] != ".." and not f.parts[0].endswith(".pth")}
    for top in tops:
        (site / top).symlink_to(dist.locate_file(top))


def _instance(tmp_path: Path, kept: dict[str, str]) -> tuple[Path, Path, Path]:
    """(python, site-packages, project copy) of a venv holding `kept` and the project's other deps."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    for name, version in kept.items():
        _dist(site, name, version, module=name.replace("-", "_"))
    for requirement in project_requirements():
        name = requirement_name(requirement)
        _dist(site, name, importlib.metadata.version(name))
    for tool in ("pip", "setuptools"):
        _link_from_this_venv(site, tool)
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "qwen3_neuron").mkdir()
    (project / "qwen3_neuron" / "__init__.py").write_text("")
    for name in ("pyproject.toml", "README.md", "scripts/setup_neuron.py"):
        shutil.copy(ROOT / name, project / name)
    return python, site, project


def _versions(python: Path, names) -> dict[str, str]:
    code = f"import importlib.metadata as m, json; print(json.dumps({{n: m.version(n) for n in {list(names)!r}}}))"
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_the_trn2_setup_installs_the_project_and_leaves_torch_and_torchtitan_untouched(tmp_path):
    python, site, project = _instance(tmp_path, STAND_INS)
    _dist(site, "neuronx-cc", "2.22.5")  # AWS's compiler: held too
    kept_files = {path: path.read_bytes() for path in site.glob("torch*/__init__.py")}
    result = subprocess.run(
        [python, project / "scripts" / "setup_neuron.py", "--no-index", "--no-build-isolation", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert _versions(python, [*STAND_INS, "qwen3-neuron"]) == {**STAND_INS, "qwen3-neuron": "0.1.0"}
    assert {path: path.read_bytes() for path in site.glob("torch*/__init__.py")} == kept_files
    assert sorted(p.name for p in site.glob("torchtitan*")) == ["torchtitan", "torchtitan-0.2.2+neuron.2.dist-info"]
    assert f"kept torch 2.14.0, torch-neuronx 2.14.3.1, torchtitan {FORK}, neuronx-cc 2.22.5\n" in result.stdout
    assert _versions(python, ["neuronx-cc"]) == {"neuronx-cc": "2.22.5"}
    assert f"has requirement torchtitan==0.3.0, but you have torchtitan {FORK}" in result.stdout  # pip check's


@pytest.mark.parametrize("absent", ["torch-neuronx", "torchtitan"])
def test_the_trn2_setup_refuses_an_environment_without_aws_stack(tmp_path, absent):
    python, _, project = _instance(tmp_path, {k: v for k, v in STAND_INS.items() if k != absent})
    result = subprocess.run([python, project / "scripts" / "setup_neuron.py"], capture_output=True, text=True)
    assert result.returncode == 2
    assert f"not installed in this environment ({python}): {absent}." in result.stderr
    assert "How to set up TorchTitan Neuron" in result.stderr


def test_the_trn2_setup_installs_every_dependency_of_the_project_but_torch_torchtitan_and_triton():
    names = {requirement_name(r) for r in project_requirements()}
    assert not names & {"torch", "torchtitan", "triton", "torch-neuronx"}
    assert {"hydra-core", "transformers", "peft", "lm-eval", "pytest"} <= names



# ---- the installed torchtitan's APIs, asked for by the plan --------------------------------------


def test_a_torchtitan_lacking_an_api_stops_the_workers_plan_naming_it(tmp_path, monkeypatch):
    """Local rank 0 checks before the plan imports them; the launcher prints the error (exit 2)."""
    from torchtitan.components import lora

    from qwen3_neuron.handoff import PLAN_FAILED_EXIT, Handoff
    from qwen3_neuron.worker.rank0_plan import plan_for_the_launcher

    monkeypatch.delattr(lora, "LoRAConverter")  # as in a torchtitan without LoRA
    handoff, run_dir = Handoff("test", os.getpid()), tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's, in a worker
    with pytest.raises(SystemExit) as stopped:
        plan_for_the_launcher(run_dir, handoff, compose_job().settled().composed)
    assert stopped.value.code == PLAN_FAILED_EXIT
    assert json.loads(handoff.files(run_dir)["error"].read_text()) == {"label": "Config error", "message": (
        f"the installed torchtitan ({importlib.metadata.version('torchtitan')}) lacks what this project uses: "
        "the LoRA converter (no torchtitan.components.lora.LoRAConverter; needed for finetune=lora (its module "
        "is imported by every run's build)). The project is written against upstream torchtitan 0.3.0 "
        "(pip install torchtitan==0.3.0); AWS's torchtitan-neuron works where it has these APIs."
    )}


def test_an_api_is_asked_for_only_by_the_runs_that_use_it_and_a_module_that_fails_says_why():
    hf_only = TorchtitanApi("the HF backend", "torchtitan.no_such_backend", ("Model",), "model=hf", model_kinds=("hf",))
    check_torchtitan_api("native", (hf_only,))
    with pytest.raises(ConfigError) as error:
        check_torchtitan_api("hf", (hf_only,))
    assert "lacks what this project uses: the HF backend (torchtitan.no_such_backend does not import: " \
        "No module named 'torchtitan.no_such_backend'; needed for model=hf)." in str(error.value)


def test_upstream_torchtitan_030_has_every_api_a_native_or_moe_run_uses():
    check_torchtitan_api("native")
    check_torchtitan_api("moe")


def test_a_missing_field_of_trainer_config_is_named():
    from torchtitan.trainer import Trainer

    names = ("Trainer.Config.model_spec", "Trainer.Config.nope")  # a field, and one that is not there
    api = TorchtitanApi("Trainer.Config", "torchtitan.trainer", names, "x")
    with pytest.raises(ConfigError, match=r"Trainer.Config \(no torchtitan.trainer.Trainer.Config.nope; needed for x"):
        check_torchtitan_api("native", (api,))
    assert "model_spec" in {f.name for f in dataclasses.fields(Trainer.Config)}


# ---- device=neuron: torch-neuronx before torchtitan -----------------------------------------------

# A stand-in torch-neuronx: registers torch.neuron as TorchNeuron does, and notes whether torchtitan
# was imported before it (torchtitan then read its device type without it).
FAKE_TORCH_NEURONX = """
import sys, types, torch
TORCHTITAN_FIRST = any(name.split(".")[0] == "torchtitan" for name in sys.modules)
torch.neuron = types.ModuleType("torch.neuron")
"""
WORKER = """
import torch
from qwen3_neuron.devices.fixes import install
install("neuron")
import torch_neuronx
from torchtitan.tools import utils
print(torch_neuronx.TORCHTITAN_FIRST, utils.device_type, utils.device_module is torch.neuron)
"""


def _worker_with(tmp_path, torch_neuronx_source: str) -> subprocess.CompletedProcess:
    (tmp_path / "torch_neuronx").mkdir()
    (tmp_path / "torch_neuronx" / "__init__.py").write_text(torch_neuronx_source)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, timeout=120)


def test_device_neuron_imports_torch_neuronx_before_torchtitan(tmp_path):
    result = _worker_with(tmp_path, FAKE_TORCH_NEURONX)
    assert result.stdout.split() == ["False", "neuron", "True"], result.stderr[-2000:]


def test_device_neuron_stops_when_torch_neuronx_does_not_import(monkeypatch):
    from qwen3_neuron.devices import fixes

    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # its import raises ImportError
    with pytest.raises(DeviceUnavailableError, match=r"^device=neuron: torch-neuronx does not import: "):
        fixes.install("neuron")
