"""The arrows of the package layout: launch/worker/report -> job -> models/data/finetune/devices/...
-> the ground floor, never back up; the workers never import the launcher's side or Hydra; the
run-dir contract and the errors import nothing of ours. A package docstring that lists its
modules lists every one of them.

Read from the source (every import statement, also those inside functions), so a lazy import
that crosses the boundary is caught as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "qwen3_neuron"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


GRAPH = {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def _reachable(start: str) -> set[str]:
    """Every module imported from `start`'s subpackage, transitively (ours and third-party)."""
    seen, todo = set(), [m for m in GRAPH if m == start or m.startswith(start + ".")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [m for m in GRAPH.get(module, ()) if m in GRAPH]
        seen |= {m for m in GRAPH.get(module, ()) if m not in GRAPH}
    return seen


def _ours(modules: set[str], *subpackages: str) -> list[str]:
    prefixes = tuple(f"qwen3_neuron.{name}" for name in subpackages)
    return sorted(m for m in modules if m in GRAPH and m.startswith(prefixes))


# The floors, top to bottom (DESIGN.md's "Layout"): a module imports ours from its own package or a
# package on its floor or below, never one on a higher floor.
FLOORS = [
    {"launch", "worker", "report", "chat"},  # the launcher, the workers, their reports; entry points
    {"job"},  # the one job and its plan
    {"trainers", "generation", "rewards", "models", "data", "finetune", "devices", "kernels", "hf_io", "eval",
     "assets"},
    {"errors", "run_dir", "handoff", "fields", "process_exit", "parent_death", "hf_backend"},  # both sides share these
]
FLOOR = {package: len(FLOORS) - level for level, packages in enumerate(FLOORS) for package in packages}


def _package(module: str) -> str:
    return module.split(".")[1]


def test_every_module_of_ours_is_on_a_floor():
    assert sorted({_package(m) for m in GRAPH if m != "qwen3_neuron"} - set(FLOOR)) == []


def test_no_import_runs_up_a_floor():
    upward = [
        f"{module} -> {imported}"
        for module, imports in GRAPH.items()
        if module != "qwen3_neuron"
        for imported in imports
        if imported in GRAPH and imported != "qwen3_neuron" and FLOOR[_package(imported)] > FLOOR[_package(module)]
    ]
    assert upward == []


def test_models_know_no_fine_tuning_and_fine_tuning_wraps_any_model():
    """LoRA wraps the models (finetune.lora.with_lora); the models import nothing of finetune, and
    finetune tells a model=hf spec by the backend's name, not by importing models/."""
    assert _ours(_reachable("qwen3_neuron.models"), "finetune") == []
    assert _ours(_reachable("qwen3_neuron.finetune"), "models") == []


def test_the_workers_never_reach_the_launcher_side_or_hydra():
    reached = _reachable("qwen3_neuron.worker")
    assert _ours(reached, "launch", "report") == []
    assert sorted(m for m in reached if m.split(".")[0] == "hydra") == []


@pytest.mark.parametrize(
    "subpackage",
    ["job", "models", "data", "devices", "kernels", "hf_io", "assets", "finetune"],
)
def test_lower_layers_never_import_launch_worker_or_report(subpackage):
    assert _ours(_reachable(f"qwen3_neuron.{subpackage}"), "launch", "worker", "report") == []


@pytest.mark.parametrize("module", ["qwen3_neuron.run_dir", "qwen3_neuron.errors"])
def test_the_shared_contract_imports_nothing_of_the_project(module):
    assert [m for m in GRAPH[module] if m.startswith("qwen3_neuron")] == []


def test_finetune_sits_below_the_config_stage():
    """config builds the LoRA spec from finetune, hf_io exports its format: never the other way."""
    reached = _reachable("qwen3_neuron.finetune")
    assert _ours(reached, "job", "hf_io") == []


def test_nothing_imports_the_entrypoint():
    assert [m for m, imported in GRAPH.items() if "launch" in imported] == []


def test_data_is_reachable_from_both_sides_and_imports_neither():
    assert "qwen3_neuron.data.loader" in _reachable("qwen3_neuron.job.trainer_config")  # the plan and the workers build it
    assert _ours(_reachable("qwen3_neuron.data"), "job", "launch", "worker", "report") == []


def test_no_module_of_ours_imports_itself_back():
    """An import circle (lazy imports included) means two modules hold one concern between them."""
    circles = []
    for start in GRAPH:
        seen, todo = set(), [m for m in GRAPH[start] if m in GRAPH]
        while todo:
            module = todo.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo += [m for m in GRAPH[module] if m in GRAPH]
    assert circles == []


# finetune/ is being split into packages of their own (DPO, GRPO, generation, rewards); its
# docstring is written with that split
LISTS_TO_FOLLOW = sorted(path.parent for path in PACKAGE.rglob("__init__.py") if path.parent.name != "finetune")


@pytest.mark.parametrize("package", LISTS_TO_FOLLOW, ids=lambda p: _module_name(p / "__init__.py"))
def test_a_package_docstring_that_names_its_modules_names_every_one(package):
    """A module is named as `name`, `name.py` or `name/` (a subpackage); a docstring naming none
    lists nothing (DEVELOPING.md maps the tree)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    files = [p for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    modules = {p.stem: (f"`{p.stem}`", f"`{p.name}`") for p in files}
    modules |= {p.name: (f"`{p.name}`", f"`{p.name}/`") for p in package.iterdir() if (p / "__init__.py").exists()}
    named = {name for name, forms in modules.items() if any(form in doc for form in forms)}
    assert not named or sorted(set(modules) - named) == []
