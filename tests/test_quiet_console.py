"""Nothing on the console a user has to learn to ignore: `verify` prints the project's own lines
only; what libraries say that no user can act on goes nowhere (a dry run's console:
tests/test_config.py)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_verify_of_an_adapter_prints_its_report_only(tmp_path, assets):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(assets.tiny_qwen3_dir),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    model.save_pretrained(tmp_path / "hf_adapter")
    model.merge_and_unload().save_pretrained(tmp_path / "hf_export")
    result = subprocess.run([sys.executable, "-m", "qwen3_neuron.hf_io.verify", str(tmp_path / "hf_adapter")],
                            cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[0] == f"adapter dir: {tmp_path / 'hf_adapter'} (base: {assets.tiny_qwen3_dir})"
    assert result.stdout.splitlines()[-1] == "OK"
