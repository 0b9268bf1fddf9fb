"""The README's and the docs' commands as written: every `launch.py` line of the bash blocks of
README.md and docs/*.md composes and plans (in-process, as a dry run; a sweep, each of its jobs), in
a dir holding the files they name (`chats.jsonl`, `pairs.jsonl`, `math.jsonl`, `corpus/`,
`alpaca.json`, `Qwen3-0.6B/`, `runs/tool_sft/hf_export/`), made from the bundled assets; each docs
page's first command, in an empty dir: it runs on a fresh clone (the bundled files only). An example
that drifts from what runs fails here."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO, compose_config, compose_job, plan_of
from hydra.core.override_parser.overrides_parser import OverridesParser

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def commands_of(page: Path) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL)
    # a line that runs launch.py, not one whose comment names it
    return [line for block in blocks for line in block.splitlines() if "launch.py" in re.sub(r"(^|\s)#.*", "", line)]


def readme_commands() -> list[str]:
    return commands_of(REPO / "README.md")


def first_commands() -> dict[str, str]:
    """{docs page: the first line of its first bash block}, which must be a `launch.py` command."""
    return {page.name: re.search(r"```bash\n(.*)", page.read_text()).group(1) for page in PAGES[1:]}


def documented_commands() -> list:
    """Every page's commands, each test named by its first page and the command (a command shown
    on two pages plans once)."""
    first_page = {}
    for page in PAGES:
        for command in commands_of(page):
            first_page.setdefault(command, page.name)
    return [pytest.param(command, id=f"{page}: {command}") for command, page in first_page.items()]


@pytest.fixture
def users_dir(tmp_path, assets, monkeypatch):
    """Where a user runs the docs' commands: their files, under the names the docs give them."""
    shutil.copy(assets.chat_train_file, tmp_path / "chats.jsonl")
    shutil.copy(assets.preference_train_file, tmp_path / "pairs.jsonl")
    (tmp_path / "corpus").mkdir()
    shutil.copy(assets.text_train_file, tmp_path / "corpus" / "part-0.jsonl")
    rows = [{"instruction": f"Say {n}.", "output": f"{n}"} for n in range(40)]
    (tmp_path / "alpaca.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    rows = [{"prompt": [{"role": "user", "content": f"What is {n} + {n}?"}], "answer": str(2 * n)} for n in range(40)]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "Qwen3-0.6B").symlink_to(assets.tiny_qwen3_dir)  # what `hf download` would have put there
    (tmp_path / "runs" / "tool_sft").mkdir(parents=True)
    (tmp_path / "runs" / "tool_sft" / "hf_export").symlink_to(assets.tiny_qwen3_dir)  # the tool recipe's SFT export
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_has_commands_for_each_first_screen_task():
    commands = " ".join(readme_commands())
    for shown in ("data.files=chats.jsonl", "model.hf_model=Qwen3-0.6B", "-m ", "device=cuda", "trn2_qwen3"):
        assert shown in commands


def test_each_docs_page_opens_with_a_launch_command():
    opening = first_commands()
    assert {page: line for page, line in opening.items() if line not in commands_of(REPO / "docs" / page)} == {}


@pytest.mark.parametrize("command", documented_commands())
def test_every_documented_command_plans_as_written(users_dir, command, tmp_path, monkeypatch):
    """A page's first command plans in an empty dir (a fresh clone's: none of the user's files)."""
    if command in first_commands().values():
        (tmp_path / "fresh").mkdir()
        monkeypatch.chdir(tmp_path / "fresh")
    for token in command.split():
        if "=[" in token:  # zsh (macOS's shell) expands an unquoted [...]
            assert token[0] in "'\"", f"quote {token} in the docs"
    args = shlex.split(command, comments=True)
    args = args[args.index("launch.py") + 1 :]
    if "--cfg" in args:
        compose_config(*args[: args.index("--cfg")])
        return
    overrides = [arg for arg in args if arg != "-m"]
    told = any(override.startswith("run.nproc_per_node=") for override in overrides)
    if "device=cuda" in overrides and not torch.cuda.is_available() and not told:
        overrides.append("run.nproc_per_node=1")  # a dry run for GPUs that are not here is told how many
    for job in sweep_jobs(overrides):
        plan_of(compose_job(*job, "run.dry_run=true"), tmp_path / "run")


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Every job of `-m` choice sweeps (Hydra's basic sweeper); an Optuna search space is left to
    the sweeper (its values are drawn, not listed)."""
    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            choices.append([override.input_line])
        elif not override.is_interval_sweep():
            choices.append([f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()])
    return [list(job) for job in itertools.product(*choices)]
