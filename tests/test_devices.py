"""The device seam: device resolution, the CPU fixes, the SDPA stand-in for FlexAttention, and
bare torchtitan training on 2 CPU ranks through `qwen3_neuron.worker.torchtitan_cli`."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose_job
from torch.nn.attention.flex_attention import and_masks, create_block_mask

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import DeviceUnavailableError
from qwen3_neuron.job.torchrun import worker_launch
from qwen3_neuron.worker import torchtitan_cli

REPO = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()
HAS_TORCH_NEURONX = importlib.util.find_spec("torch_neuronx") is not None


# ---- launcher side ---------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA or HAS_TORCH_NEURONX, reason="an accelerator stack is installed")
def test_auto_is_cpu_without_accelerators():
    assert devices.resolve_device("auto") == "cpu"
    assert devices.resolve_device("cpu") == "cpu"


# Both kinds of torch build, whichever is installed: PyPI's Linux wheels from 2.14 on are CUDA
# builds, which then run without a GPU; the CPU wheel cannot use one at all.
CUDA_WITHOUT_GPU = [
    (None, ["is a CPU-only build", "Install a CUDA build", "pip install torch"]),
    ("13.0", ["built for CUDA 13.0 but sees no GPU", "nvidia-smi", "CUDA_VISIBLE_DEVICES"]),
]


@pytest.mark.parametrize("cuda_build, expected", CUDA_WITHOUT_GPU, ids=["cpu-build", "cuda-build"])
def test_cuda_without_a_gpu_says_what_to_install_or_check(monkeypatch, cuda_build, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    with pytest.raises(DeviceUnavailableError, match="device=cuda") as error:
        devices.resolve_device("cuda")
    assert isinstance(error.value, ValueError)
    for text in expected:
        assert text in str(error.value)


@pytest.mark.skipif(HAS_TORCH_NEURONX, reason="torch-neuronx is installed here")
def test_neuron_without_torch_neuronx_names_the_aws_index():
    with pytest.raises(DeviceUnavailableError, match="torch-neuronx is not installed") as error:
        devices.resolve_device("neuron")
    assert "not on PyPI" in str(error.value)
    assert "https://pip.repos.neuron.amazonaws.com" in str(error.value)
    assert "torch_neuronx" not in sys.modules


def test_the_workers_keep_an_exported_thread_count_and_command_sh_records_it(tmp_path, monkeypatch):
    """docs/parallelism-and-scale-out.md: "export `OMP_NUM_THREADS=1` (the launcher keeps it)"; unset, a CPU rank
    gets cores // ranks."""
    job = compose_job("device=cpu", "run.nproc_per_node=1").settled()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_launch(job, tmp_path).env["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    launch = worker_launch(job, tmp_path)
    assert launch.env["OMP_NUM_THREADS"] == "3" and "OMP_NUM_THREADS=3 " in launch.command_line()
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")  # not a default: the rank count assumes LNC=2
    assert devices.worker_env("neuron") == {"NEURON_LOGICAL_NC_CONFIG": "2"}


def test_the_build_probe_agrees_with_torch_and_a_cpu_job_starts_torchrun_without_importing_torch(tmp_path):
    assert devices._torch_build_has_gpu_support() == bool(torch.version.cuda or torch.version.hip)
    # the launcher's path up to torchrun's start, in a fresh interpreter: auto on a CPU build
    probe = (
        "import sys; from pathlib import Path\n"
        "from qwen3_neuron.job.torchrun import worker_launch\n"
        "sys.path.insert(0, 'tests'); from conftest import compose_job\n"
        "job = compose_job('device=auto').settled()\n"
        f"launch = worker_launch(job, Path({str(tmp_path)!r}))\n"
        "print(job.device, launch.nproc_per_node, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    if devices._torch_build_has_gpu_support():
        pytest.skip("this torch is a GPU build: asking whether a GPU is here imports torch")
    assert result.stdout.split() == ["cpu", "2", "False"]


def test_the_forked_launchs_rendezvous_records_name_the_methods_torchs_own_lookup_names():
    """CPU launches look up the name a rendezvous record carries from the frame, in place of
    torch's `inspect.stack()` (`worker.forked_torchrun`): the same name at every depth, and the
    same answer where the stack is too shallow."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import get_method_name

    from qwen3_neuron.worker.forked_torchrun import _calling_method_name

    class Handler:  # as torch's handlers call it: from `_record`, called by the method recorded
        def _record(self, lookup, depth):
            return lookup(depth)

        def next_rendezvous(self, lookup, depth):
            return self._record(lookup, depth)

    for depth in (1, 2, 3, 10_000):
        assert Handler().next_rendezvous(_calling_method_name, depth) == Handler().next_rendezvous(get_method_name, depth)
    assert Handler().next_rendezvous(_calling_method_name, 2) == "next_rendezvous"
    assert Handler().next_rendezvous(_calling_method_name, 10_000) == "no_method_name"


def test_unknown_device_is_rejected_with_the_choices():
    with pytest.raises(DeviceUnavailableError, match="auto, cpu, cuda, neuron"):
        devices.resolve_device("tpu")


def test_launch_facts_per_device(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # exported by conftest: a test of the default
    assert devices.default_nproc("cpu") == 2
    assert [devices.dist_backend(d) for d in devices.DEVICE_TYPES] == ["gloo", "nccl", "neuron"]
    cores = len(os.sched_getaffinity(0))
    assert devices.worker_env("cpu") == {"OMP_NUM_THREADS": str(max(1, cores // 2))}
    assert devices.worker_env("cpu", nproc=1) == {"OMP_NUM_THREADS": str(cores)}
    assert devices.worker_env("neuron") == {"NEURON_LOGICAL_NC_CONFIG": "2"}
    if not HAS_TORCH_NEURONX:
        assert devices.default_nproc("neuron") == 64  # trn2.48xlarge, LNC=2


def test_cpu_native_models_get_the_sdpa_override_and_it_is_registered():
    from torchtitan.config.override import _REGISTRY

    assert devices.override_imports("cpu", "native") == [devices.SDPA_FOR_FLEX_OVERRIDE]
    assert devices.override_imports("cpu", "moe") == [devices.SDPA_FOR_FLEX_OVERRIDE]
    assert devices.override_imports("cpu", "hf") == []  # install() patches the HF backend
    assert devices.override_imports("cuda", "native") == []
    importlib.import_module(devices.SDPA_FOR_FLEX_OVERRIDE.rsplit(".", 1)[0])
    assert devices.SDPA_FOR_FLEX_OVERRIDE in _REGISTRY


# ---- torchtitan_cli argument handling ----------------------------------------------------------


def test_cli_splits_off_device_and_detects_the_hf_backend():
    assert torchtitan_cli.split_device(["--device", "cpu", "--module", "qwen3"]) == ("cpu", ["--module", "qwen3"])
    assert torchtitan_cli.split_device(["--device=cuda"]) == ("cuda", [])
    assert torchtitan_cli.split_device(["--module", "qwen3"]) == ("auto", ["--module", "qwen3"])
    assert torchtitan_cli.model_kind(["--module", "qwen3"]) == "native"
    assert torchtitan_cli.model_kind(["--module=transformers_modeling_backend"]) == "hf"


def test_cli_merges_override_imports_into_one_flag():
    ours = devices.SDPA_FOR_FLEX_OVERRIDE
    args = ["--override.imports", "a.b.f", "c.d.g", "--training.steps", "5"]
    merged = torchtitan_cli.with_override_imports(args, [ours])
    assert merged == ["--training.steps", "5", "--override.imports", "a.b.f", "c.d.g", ours]
    already = torchtitan_cli.with_override_imports([f"--override.imports={ours}"], [ours])
    assert already == ["--override.imports", ours]
    assert torchtitan_cli.with_override_imports(["--x", "1"], []) == ["--x", "1"]


# ---- the SDPA stand-in for FlexAttention ---------------------------------------------------------

B, L, N, H = 2, 256, 4, 32  # two 128-token blocks, so the mask has full and partial blocks


def _block_mask(kind: str):
    from torchtitan.models.common.attention import get_causal_mask_mod, get_document_mask_mod

    if kind == "causal":
        mask_mod = get_causal_mask_mod()
    else:  # causal within documents of 100, 120 and 36 tokens (packed samples)
        positions = torch.cat([torch.arange(100), torch.arange(120), torch.arange(36)]).repeat(B, 1)
        mask_mod = and_masks(get_causal_mask_mod(), get_document_mask_mod(positions))
    return create_block_mask(mask_mod, B, None, L, L, device="cpu"), mask_mod


def _qkv(n_kv_heads: int, requires_grad: bool = False):
    generator = torch.Generator().manual_seed(0)
    shapes = [(B, L, N, H), (B, L, n_kv_heads, H), (B, L, n_kv_heads, H)]
    return [torch.randn(s, generator=generator, requires_grad=requires_grad) for s in shapes]


def _reference_attention(q_BLNH, k_BLNH, v_BLNH, mask_mod, scale):
    """Plain softmax attention, key/value heads repeated for GQA."""
    groups = q_BLNH.shape[2] // k_BLNH.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in (B, 1, L, L)), indexing="ij")
    allowed = mask_mod(b, h, i, j)
    scores = (q @ k.transpose(-1, -2)) * scale
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize(("kind", "n_kv_heads"), [("causal", N), ("causal", 2), ("document", 2)],
                         ids=["causal-mha", "causal-gqa", "document-gqa"])  # fmt: skip
@pytest.mark.numerics
def test_sdpa_override_matches_flex_attention_forward(kind, n_kv_heads):
    from torchtitan.models.common.attention import FlexAttention

    from qwen3_neuron.kernels.attention.sdpa import SDPAFlexAttention, sdpa_for_flex

    config = sdpa_for_flex(FlexAttention.Config())
    assert type(config) is SDPAFlexAttention.Config and isinstance(config, FlexAttention.Config)
    block_mask, _ = _block_mask(kind)
    q, k, v = _qkv(n_kv_heads)
    kwargs = dict(attention_masks=block_mask, scale=0.125, enable_gqa=n_kv_heads < N)

    expected = FlexAttention(FlexAttention.Config())(q, k, v, **kwargs)
    actual = config.build()(q, k, v, **kwargs)

    assert actual.shape == expected.shape == (B, L, N, H)
    # float32 both: each output sums L weighted values; a sum of n terms rounds by at most n x 2^-24 of
    # the magnitudes summed (measured: 4.8e-7 here, the same under AVX2 and AVX512_CORE_BF16)
    torch.testing.assert_close(actual, expected, atol=L * 2**-24 * expected.abs().max(), rtol=0)


@pytest.mark.numerics
@pytest.mark.parametrize("n_kv_heads", [N, 2], ids=["mha", "gqa"])
def test_sdpa_override_gradients_match_plain_attention(n_kv_heads):
    from torchtitan.models.common.attention import FlexAttention

    from qwen3_neuron.kernels.attention.sdpa import sdpa_for_flex

    block_mask, mask_mod = _block_mask("document")
    attention = sdpa_for_flex(FlexAttention.Config()).build()
    q, k, v = _qkv(n_kv_heads, requires_grad=True)
    out = attention(q, k, v, attention_masks=block_mask, scale=0.125, enable_gqa=n_kv_heads < N)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))

    reference = _reference_attention(q, k, v, mask_mod, scale=0.125)
    reference_grads = torch.autograd.grad(reference.square().sum(), (q, k, v))
    for grad, reference_grad in zip(grads, reference_grads):
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        # float32: each gradient sums over the L positions (at most L x 2^-24 of the magnitudes summed)
        torch.testing.assert_close(grad, reference_grad, atol=L * 2**-24 * reference_grad.abs().max(), rtol=0)


def test_dense_mask_is_built_once_per_block_mask():
    from qwen3_neuron.kernels.attention.sdpa import dense_mask

    block_mask, mask_mod = _block_mask("causal")
    first = dense_mask(block_mask)
    assert dense_mask(block_mask) is first
    assert first.dtype == torch.bool and first.shape == (B, 1, L, L)
    assert torch.equal(first[0, 0], torch.ones(L, L, dtype=torch.bool).tril())
    assert dense_mask(_block_mask("causal")[0]) is not first


# ---- install("cpu") in a fresh worker-like process ---------------------------------------------

INSTALL_PROBE = """
import json, torch
from qwen3_neuron.devices.fixes import install
install("cpu")
install("cpu")  # idempotent
from torchtitan.tools import utils
import torchtitan.distributed.utils as dist_utils
from torchtitan.components.metrics import build_device_memory_monitor
monitor = build_device_memory_monitor()
block = torch.ones(2**24)  # 64 MiB, touched
stats = monitor.get_peak_stats()
monitor.reset_peak_stats()
import torchtitan.experiments.transformers_modeling_backend.model as hf_model
from qwen3_neuron.kernels.attention.sdpa import dense_mask, hf_sdpa_attention_forward
from torch.nn.attention.flex_attention import create_block_mask
from torchtitan.models.common import attention
from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
causal = attention.create_attention_mask(attention.get_causal_mask_mod(), 1, None, 256, 256, device="cpu")
print(json.dumps({
    "block_mask_is_eager": attention._compiled_create_block_mask is create_block_mask,
    "cp_block_mask_is_eager": cp_attention._compiled_create_block_mask is create_block_mask,
    "causal_mask_is_lower_triangular": torch.equal(dense_mask(causal)[0, 0], torch.ones(256, 256).tril().bool()),
    "device_type": utils.device_type,
    "copied_device_type": dist_utils.device_type,
    "device_index": monitor.device_index,
    "capacity_gib": monitor.device_capacity_gib,
    "peak_active_gib": stats.max_active_gib,
    "peak_reserved_gib": stats.max_reserved_gib,
    "has_set_timeout": hasattr(torch.distributed, "set_timeout"),
    "hf_attention_is_sdpa": hf_model.flex_attention_forward is hf_sdpa_attention_forward,
}))
"""


@pytest.mark.integration
def test_install_cpu_makes_torchtitan_memory_monitor_report_peak_rss():
    result = subprocess.run(
        [sys.executable, "-c", INSTALL_PROBE], cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["device_type"] == report["copied_device_type"] == "cpu"
    assert report["device_index"] == 0
    assert report["peak_active_gib"] == report["peak_reserved_gib"] > 64 / 1024
    assert report["capacity_gib"] > report["peak_active_gib"]
    assert report["has_set_timeout"]
    assert report["hf_attention_is_sdpa"]
    assert report["block_mask_is_eager"] and report["cp_block_mask_is_eager"]
    assert report["causal_mask_is_lower_triangular"]


# ---- bare torchtitan, 2 CPU ranks, FSDP on gloo ------------------------------------------------


def _tensorboard_scalars(dump_folder: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = (dump_folder / "tb").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {event.step: event.value for event in events.Scalars(tag)}


@pytest.mark.integration
def test_torchtitan_cli_trains_tiny_qwen3_on_two_cpu_ranks(assets, tmp_path):
    steps = 5
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc_per_node", str(devices.default_nproc("cpu")),
        "-m", "qwen3_neuron.worker.torchtitan_cli", "--device", "cpu",
        "--module", "qwen3", "--config", "qwen3_debugmodel",
        "--training.steps", str(steps), "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--dataloader.dataset", "c4_test", "--dataloader.dataset_path", str(assets.text_dataset_dir),
        "--hf_assets_path", str(assets.tokenizer_dir), "--dump_folder", str(tmp_path),
        "--debug.seed", "0", "--checkpoint.no-enable", "--metrics.enable_tensorboard",
        # what the launcher picks on a CPU that emulates bf16 (torchtitan's CLI keeps its bf16)
        *(("--training.mixed_precision_param", dtype) if (dtype := devices.mixed_precision_param("cpu")) else ()),
    ]  # fmt: skip
    env = {**os.environ, **devices.worker_env("cpu"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "FlexAttention.Config -> SDPAFlexAttention.Config" in result.stdout + result.stderr

    losses = _tensorboard_scalars(tmp_path, "loss_metrics/global_avg_loss")
    assert sorted(losses) == list(range(1, steps + 1))
    assert all(math.isfinite(loss) for loss in losses.values())
    assert losses[steps] < losses[1]
    peak_memory = _tensorboard_scalars(tmp_path, "memory/max_reserved(GiB)")
    assert all(gib > 0 for gib in peak_memory.values())
