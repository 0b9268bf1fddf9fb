"""The docs are a map that cannot drift from conf/: every option of every config group (conf/'s
folders, Hydra's own under conf/hydra/ too) is named as `group=option` and every experiment as
`experiment=name` in README.md or docs/*.md, and every key a trainer's YAML fills as `section.key`
(`orpo.beta`), so a new option fails here until it is documented;
every relative link of those pages resolves to a file (and an anchor to a heading of it); every
docs/ page is linked from the README; the run dirs the pages' commands write into stay out of git.
The pages' commands are planned by tests/test_readme.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONF = REPO / "conf"


def conf_choices() -> list[str]:
    """`group=option` for each option file under conf/ (`experiment=name` for each experiment,
    `hydra/launcher=name` for Hydra's), read from the folders: never a list kept by hand."""
    return sorted(f"{path.parent.relative_to(CONF).as_posix()}={path.stem}" for path in CONF.glob("*/**/*.yaml"))


def test_conf_has_the_groups_the_docs_are_organised_by():
    groups = {choice.split("=")[0] for choice in conf_choices()}
    assert {"model", "finetune", "data", "checkpointing", "parallelism", "kernels", "device", "eval", "experiment"} <= groups


@pytest.mark.parametrize("choice", conf_choices())
def test_every_conf_option_and_experiment_is_named_in_the_docs(choice):
    text = "\n".join(page.read_text() for page in PAGES)
    # as written on a command line: `data=prompts`, not `mydata=prompts` or `data=prompts_v2`
    assert re.search(rf"(?<![\w./]){re.escape(choice)}(?![\w])", text), (
        f"{choice} (conf/{choice.replace('=', '/')}.yaml) is named nowhere in README.md or docs/*.md: document it"
    )


def trainer_options() -> list[str]:
    """`section.key` for each key a trainer's YAML (conf/trainer/<name>.yaml) fills, read from the files."""
    from omegaconf import OmegaConf

    sections = [OmegaConf.load(path) for path in (CONF / "trainer").glob("*.yaml")]
    return sorted(f"{name}.{key}" for section in sections for name, values in section.items() if name != "trainer"
                  for key in values)  # fmt: skip


@pytest.mark.parametrize("option", trainer_options())
def test_every_trainer_option_is_named_in_the_docs(option):
    text = "\n".join(page.read_text() for page in PAGES)
    assert re.search(rf"(?<![\w.]){re.escape(option)}(?![\w])", text), (
        f"{option} (conf/trainer/) is named nowhere in README.md or docs/*.md: document it"
    )


def without_code(markdown: str) -> str:
    """The text outside fenced blocks and inline code spans: a `[x](y)` there is no link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", markdown, flags=re.DOTALL))


def links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text()))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def relative_links() -> list:
    return [
        pytest.param(page, target, id=f"{page.relative_to(REPO)} -> {target}")
        for page in PAGES
        for target in links(page)
        if not re.match(r"[a-z]+:", target)  # https:, mailto: are not this repository's
    ]


@pytest.mark.parametrize(("page", "target"), relative_links())
def test_every_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    assert linked.exists(), f"{page.relative_to(REPO)} links to {target}: {linked} does not exist"
    if anchor:
        assert anchor in anchors(linked), f"{page.relative_to(REPO)} links to {target}: no heading of {path or page.name} has that anchor"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links(REPO / "README.md")}
    assert [page.name for page in PAGES[1:] if page.resolve() not in linked] == []


def test_the_readme_stays_a_map():
    assert len((REPO / "README.md").read_text().splitlines()) <= 260


def test_the_run_dirs_the_docs_write_into_are_left_out_of_git():
    """Hydra's outputs/ and multirun/, and each relative hydra.run.dir a page names (runs/sft):
    after the docs' commands `git status` shows none of them."""
    named = {found for page in PAGES for found in re.findall(r"hydra\.run\.dir=([\w.-]+)/", page.read_text())}
    paths = sorted(f"{folder}/run" for folder in named | {"outputs", "multirun"})
    result = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode == 128:
        pytest.skip(f"not a git checkout: {result.stderr.strip()}")
    assert "runs/run" in paths and result.stdout.split() == paths


def test_the_configuration_page_names_every_section_of_the_frameworks_keys():
    from qwen3_neuron.job.settings import SECTIONS

    page = (REPO / "docs" / "configuration.md").read_text()
    keys = page.split("## The framework's keys", 1)[1].split("\n## ", 1)[0]
    assert [name for name in SECTIONS if f"`{name}." not in keys] == []
