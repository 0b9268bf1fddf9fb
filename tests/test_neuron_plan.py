"""device=neuron plans, on any machine (dry runs): TorchNeuron's NEFF cache dir."""

from __future__ import annotations

import pytest
from conftest import compose_config

from qwen3_neuron.config.plan import make_plan
from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError

NEURON_COMPILE = ["device=neuron", "run.dry_run=true", "compile.enable=true", "run.nproc_per_node=2"]
MOE_NKI = ["experiment=trn2_qwen3_moe_nki", "run.dry_run=true"]


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """The user's cache dir in a temp dir, and no NEFF cache exported by whoever runs the tests."""
    monkeypatch.setenv(devices.USER_CACHE_ENV, str(tmp_path / "user_cache"))
    monkeypatch.delenv(devices.NEFF_CACHE_ENV, raising=False)
    return tmp_path / "user_cache"


def plan_for(tmp_path, *overrides, run="run"):
    return make_plan(compose_config(*overrides), tmp_path / run)


# ---- the NEFF cache: device.cache_dir ------------------------------------------------------------


def test_moe_nki_plan_names_the_cache_dir(tmp_path, assets, user_cache):
    plan = plan_for(tmp_path, *MOE_NKI)
    neff = str(user_cache / "neff")
    assert plan.env[devices.NEFF_CACHE_ENV] == neff  # the workers' env and command.sh
    assert plan.job["device"] == {"type": "neuron", "cache_dir": neff}  # job.yaml: a resume reuses it
    assert plan.compile_cache.startswith(f"compile cache: {neff} (TORCH_NEURONX_NEFF_CACHE_DIR; default")
    assert "outside its run dir" in plan.compile_cache


def test_every_run_and_sweep_job_shares_one_cache_dir_outside_its_run_dir(tmp_path, assets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = plan_for(tmp_path, *NEURON_COMPILE, "device.cache_dir=shared/neff", run="job0")
    second = plan_for(tmp_path, *NEURON_COMPILE, "device.cache_dir=shared/neff", run="job1")
    assert first.env[devices.NEFF_CACHE_ENV] == second.env[devices.NEFF_CACHE_ENV] == str(tmp_path / "shared" / "neff")
    assert "device.cache_dir" in first.compile_cache


def test_an_exported_neff_cache_is_used_when_the_key_is_unset_and_a_different_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(devices.NEFF_CACHE_ENV, str(tmp_path / "fsx" / "neff"))
    assert devices.neff_cache_dir(None) == (tmp_path / "fsx" / "neff", "exported TORCH_NEURONX_NEFF_CACHE_DIR")
    assert devices.neff_cache_dir(str(tmp_path / "fsx" / "neff"))[0] == tmp_path / "fsx" / "neff"  # the same: fine
    with pytest.raises(ConfigError, match=r"device.cache_dir=/elsewhere and the exported TORCH_NEURONX_NEFF_CACHE_DIR=.*fsx/neff name two different NEFF caches\. Set one"):  # fmt: skip
        devices.neff_cache_dir("/elsewhere")


def test_cache_dir_is_only_for_neuron(tmp_path, assets):
    plan = plan_for(tmp_path, "device.cache_dir=/fsx/neff")
    assert plan.device == "cpu" and devices.NEFF_CACHE_ENV not in plan.env and plan.compile_cache is None
    assert any("device.cache_dir=/fsx/neff is TorchNeuron's NEFF cache: unused on device=cpu" in n for n in plan.notes)


def test_neuron_compiler_env_keeps_what_the_user_exported_and_sets_no_xla_era_variables(monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--target=trn2 --lnc=2 -O1")
    assert devices.compiler_env("neuron") == {}
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert set(devices.compiler_env("neuron")) == {"NEURON_CC_FLAGS"}  # no NEURON_COMPILE_CACHE_URL
