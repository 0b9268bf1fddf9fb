"""`make setup`'s uv gets the package indexes pip is set up with (scripts/uv_pip.py), read by pip itself."""

from __future__ import annotations

import importlib.util

from conftest import REPO


def load_uv_pip():
    spec = importlib.util.spec_from_file_location("uv_pip", REPO / "scripts" / "uv_pip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uv_gets_pips_indexes_a_variable_over_a_files_and_no_constraint(tmp_path, monkeypatch):
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = file:///mirror/simple\nextra-index-url = file:///a/simple file:///b/simple\n"
        "find-links = /wheels-from-the-file\nconstraint = /pins.txt\ncert = /ca.pem\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))  # read after the machine's own files: its values win
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels-from-the-variable")
    uv_pip = load_uv_pip()

    settings = uv_pip.pip_settings()
    assert settings["cert"] == "/ca.pem"
    assert uv_pip.uv_arguments(settings) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "file:///mirror/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/wheels-from-the-variable",
    ]  # fmt: skip
