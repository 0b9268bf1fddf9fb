"""device=neuron plans, on any machine (dry runs): TorchNeuron's NEFF cache dir, and the static-shape
check that refuses, before torchrun, what Neuron's torch.compile would recompile or fail on."""

from __future__ import annotations

import pytest
from conftest import compose_job, launch_of, plan_of
from torchtitan.components.dataloader import ParallelAwareDataloader

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.checks.static_shapes import check_static_shapes
from qwen3_neuron.job.torchrun import compile_cache_line

NEURON_COMPILE = ["device=neuron", "run.dry_run=true", "compile.enable=true", "run.nproc_per_node=2"]
MOE_NKI = ["experiment=trn2_qwen3_moe_nki", "run.dry_run=true"]
BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
SDK_233, SDK_234 = "2.14.3.0", "2.14.3.1"  # torch-neuronx of Neuron SDK 2.33 and 2.34


def rules_here() -> str:
    return f" (rules of {devices.neuron_sdk(devices.torch_neuronx_version())})"


@pytest.fixture
def torch_neuronx(monkeypatch):
    """Plan as if this torch-neuronx version were installed."""
    return lambda version: monkeypatch.setattr(devices, "torch_neuronx_version", lambda: version)


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """The user's cache dir in a temp dir, and no NEFF cache exported by whoever runs the tests."""
    monkeypatch.setenv(devices.USER_CACHE_ENV, str(tmp_path / "user_cache"))
    monkeypatch.delenv(devices.NEFF_CACHE_ENV, raising=False)
    return tmp_path / "user_cache"


def plan_for(tmp_path, *overrides, run="run"):
    return plan_of(compose_job(*overrides), tmp_path / run)


# ---- the NEFF cache: device.cache_dir ------------------------------------------------------------


def test_moe_nki_plan_names_the_cache_dir_and_what_the_static_shape_check_covered(tmp_path, assets, user_cache):
    plan = plan_for(tmp_path, *MOE_NKI)
    neff = str(user_cache / "neff")
    assert launch_of(plan).env[devices.NEFF_CACHE_ENV] == neff  # the workers' env and command.sh
    assert plan.job.composed["device"] == {"type": "neuron", "cache_dir": neff}  # job.yaml: a resume reuses it
    assert compile_cache_line(None, launch_of(plan)).startswith(f"compile cache: {neff} (TORCH_NEURONX_NEFF_CACHE_DIR; default")
    assert "outside its run dir" in compile_cache_line(None, launch_of(plan))
    assert plan.static_shapes == (
        "static shapes for compile.backend=neuron: training batches 4 x 2048 tokens, no validation; "
        "MoE experts in 8 layer(s) by qwen3_neuron.kernels.moe.nki.nki_experts"
        + (" (planned; it cannot load here)" if devices.unavailable_reason("neuron") else "")
        + ", expert parallel 1"
        + rules_here()
    )


def test_every_run_and_sweep_job_shares_one_cache_dir_outside_its_run_dir(tmp_path, assets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = plan_for(tmp_path, *NEURON_COMPILE, "device.cache_dir=shared/neff", run="job0")
    second = plan_for(tmp_path, *NEURON_COMPILE, "device.cache_dir=shared/neff", run="job1")
    assert launch_of(first).env[devices.NEFF_CACHE_ENV] == launch_of(second).env[devices.NEFF_CACHE_ENV] == str(tmp_path / "shared" / "neff")
    assert "device.cache_dir" in compile_cache_line("shared/neff", launch_of(first))


def test_an_exported_neff_cache_is_used_when_the_key_is_unset_and_a_different_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(devices.NEFF_CACHE_ENV, str(tmp_path / "fsx" / "neff"))
    assert devices.neff_cache_dir(None) == (tmp_path / "fsx" / "neff", "exported TORCH_NEURONX_NEFF_CACHE_DIR")
    assert devices.neff_cache_dir(str(tmp_path / "fsx" / "neff"))[0] == tmp_path / "fsx" / "neff"  # the same: fine
    with pytest.raises(ConfigError, match=r"device.cache_dir=/elsewhere and the exported TORCH_NEURONX_NEFF_CACHE_DIR=.*fsx/neff name two different NEFF caches\. Set one"):  # fmt: skip
        devices.neff_cache_dir("/elsewhere")


def test_cache_dir_is_only_for_neuron(tmp_path, assets):
    plan = plan_for(tmp_path, "device.cache_dir=/fsx/neff")
    assert plan.device == "cpu" and devices.NEFF_CACHE_ENV not in launch_of(plan).env and compile_cache_line("/fsx/neff", launch_of(plan)) is None
    assert any("device.cache_dir=/fsx/neff is TorchNeuron's NEFF cache: unused on device=cpu" in n for n in plan.notes)


def test_neuron_compiler_env_keeps_what_the_user_exported_and_sets_no_xla_era_variables(monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--target=trn2 --lnc=2 -O1")
    assert devices.compiler_env("neuron") == {}
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert set(devices.compiler_env("neuron")) == {"NEURON_CC_FLAGS"}  # no NEURON_COMPILE_CACHE_URL


# ---- static shapes: refused before torchrun ------------------------------------------------------


def test_torchtitans_grouped_experts_are_refused_naming_the_sdk_and_the_kernels_that_fit(
    tmp_path, assets, torch_neuronx
):
    torch_neuronx(SDK_233)
    with pytest.raises(ConfigError) as refused:
        plan_for(tmp_path, *MOE_NKI, "kernels=none")
    message = str(refused.value)
    assert message.startswith("kernels=none leaves torchtitan's GroupedExperts in 8 MoE layer(s) "
                              "(model_spec.model.layers.0.moe.routed_experts.inner_experts, ...)")  # fmt: skip
    assert "torch._grouped_mm" in message and "kernels=nki" in message and "kernels=blockwise" in message
    assert "Neuron's torch.compile takes static shapes only (Neuron SDK 2.33: torch-neuronx 2.14.3.0)" in message
    assert message.endswith("(From Neuron SDK 2.34 on, torch-neuronx 2.13.3.1 / 2.14.3.1, TorchNeuron compiles "
                            "torch._grouped_mm with its dynamic NKI kernels, and kernels=none passes.)")  # fmt: skip


def test_on_neuron_sdk_234_torchtitans_grouped_experts_compile(tmp_path, assets, torch_neuronx):
    """SDK 2.34's TorchTitan MoE recipes run upstream torch._grouped_mm, compiled (dynamic NKI kernels)."""
    torch_neuronx(SDK_234)
    plan = plan_for(tmp_path, *MOE_NKI, "kernels=none")
    assert plan.static_shapes.endswith(
        "MoE experts in 8 layer(s) by torchtitan's GroupedExperts (torch._grouped_mm, Neuron SDK 2.34's dynamic "
        "NKI kernels), expert parallel 1 (rules of Neuron SDK 2.34: torch-neuronx 2.14.3.1)"
    )


@pytest.mark.parametrize("version, release", [
    (None, "Neuron SDK 2.33: torch-neuronx is not installed here, the oldest TorchNeuron assumed"),
    ("2.14.3.0", "Neuron SDK 2.33: torch-neuronx 2.14.3.0"),
    ("2.13.3.1", "Neuron SDK 2.34: torch-neuronx 2.13.3.1"),
    ("2.14.3.2", "Neuron SDK 2.34: torch-neuronx 2.14.3.2, newer than the releases this project knows"),
    ("2.9.0.2.11", "Neuron SDK 2.33: torch-neuronx 2.9.0.2.11, older than TorchNeuron (Neuron SDK 2.33)"),
])  # fmt: skip
def test_the_neuron_sdk_is_read_from_the_torch_neuronx_version(version, release):
    assert str(devices.neuron_sdk(version)) == release


def test_blockwise_experts_pass(tmp_path, assets):
    plan = plan_for(tmp_path, *MOE_NKI, "kernels=blockwise")
    assert plan.static_shapes.endswith(f"MoE experts in 8 layer(s) by {BLOCKWISE}, expert parallel 1" + rules_here())


@pytest.mark.parametrize("version", [SDK_233, SDK_234])
def test_expert_parallel_is_refused_on_every_sdk(tmp_path, assets, torch_neuronx, version):
    torch_neuronx(version)
    with pytest.raises(ConfigError, match=r"parallelism.expert_parallel_degree=2 .* all-to-all .* Set parallelism.expert_parallel_degree=1"):  # fmt: skip
        plan_for(tmp_path, *MOE_NKI, "kernels=blockwise", "parallelism=ep")


def test_validating_the_whole_set_is_refused(tmp_path, assets):
    with pytest.raises(ConfigError, match=r"^validator.steps=-1 with device=neuron and compile.enable=true: .* partial batch"):
        plan_for(tmp_path, *NEURON_COMPILE, "data=text", "validator.steps=-1", "data.val_fraction=0.5")
    plan = plan_for(tmp_path, *NEURON_COMPILE, "data=text", "data.val_fraction=0.5")
    validated = "training and validation batches 4 x 256 tokens (validator.steps=4)"
    assert plan.static_shapes.endswith(validated + rules_here())


def test_finite_training_data_is_refused(tmp_path, assets):
    with pytest.raises(ConfigError, match=r"^dataloader.infinite=false .* partial .* Set dataloader.infinite=true"):
        plan_for(tmp_path, *NEURON_COMPILE, "dataloader.infinite=false")


def test_a_loader_not_known_to_pack_to_seq_len_is_refused(tmp_path, assets):
    plan = plan_for(tmp_path, *NEURON_COMPILE)
    config = plan.trainer_config
    config.dataloader = ParallelAwareDataloader.Config()
    with pytest.raises(ConfigError, match=r"^dataloader is torchtitan.components.dataloader.ParallelAwareDataloader.Config, which the plan cannot show packs every sample to exactly training.seq_len"):  # fmt: skip
        check_static_shapes(config, 2, replacements=[], unapplied_factories=[], model_dir=None)


def test_an_hf_moe_dir_is_refused_pointing_at_model_moe(tmp_path, assets):
    with pytest.raises(ConfigError, match=r"^model=hf with a mixture-of-experts dir .* train it as model=moe with kernels=nki"):
        plan_for(tmp_path, *NEURON_COMPILE, "model=hf", f"model.hf_model={assets.tiny_qwen3_moe_dir}")


@pytest.mark.parametrize("overrides", [["compile.enable=false"], ["device=cpu", "run.memory_check=off"]],
                         ids=["neuron-eager", "cpu-compiled"])  # fmt: skip
def test_the_check_is_for_neuron_compiles_only(tmp_path, assets, overrides):
    plan = plan_for(tmp_path, *MOE_NKI, "kernels=none", "run.nproc_per_node=2", *overrides)
    assert plan.static_shapes is None
