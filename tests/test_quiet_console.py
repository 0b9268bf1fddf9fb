"""Nothing on the console a user has to learn to ignore: a dry run and `verify` print the
project's own lines only; what libraries say that no user can act on goes to launch.log or
nowhere."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, launch


def test_a_dry_run_prints_the_projects_own_lines_only(tmp_path, assets):
    run_dir = tmp_path / "run"
    result = launch(run_dir, "run.dry_run=true", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) >= 5 and [line for line in lines if not line.startswith("[qwen3-neuron] ")] == []
    # torchtitan's warning of its own base config: kept in the run's log, off the screen
    assert "initial_load_model_only=True has no effect" in (run_dir / "launch.log").read_text()


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
