"""Shared fixtures: the project's own tiny assets, Hydra composition, launch.py in a subprocess."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from qwen3_neuron.assets.build import ASSETS_ENV_VAR, build_assets
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.torchrun import WorkerLaunch, worker_launch
from qwen3_neuron.launch import hydra_setup as project_compose
from qwen3_neuron.report.peak_flops import CACHE_ENV_VAR

REPO = Path(__file__).resolve().parents[1]
os.environ["HF_HUB_OFFLINE"] = "1"
project_compose.register()

# What a test session caches - the tiny assets, the measured peak FLOPs, the Arrow caches of the
# data sets tests read in-process - lives under one temporary dir for the session, never in the
# user's ~/.cache (qwen3_neuron's, or huggingface/datasets). Set in this process's
# environment, so every launch.py, torchrun worker and peak probe a test starts inherits it, and
# so do pytest-xdist's test processes (started after this runs in the first one): one dir, and one
# asset build, for all of them. The process that made the dir removes it.
SESSION_ENV = "QWEN3_NEURON_TEST_SESSION"
MADE_HERE = SESSION_ENV not in os.environ
if MADE_HERE:
    os.environ[SESSION_ENV] = tempfile.mkdtemp(prefix="qwen3-neuron-tests-")
SESSION_CACHE = Path(os.environ[SESSION_ENV])
os.environ[ASSETS_ENV_VAR] = str(SESSION_CACHE / "assets")
os.environ[CACHE_ENV_VAR] = str(SESSION_CACHE / "cache")
os.environ["HF_DATASETS_CACHE"] = str(SESSION_CACHE / "hf_datasets")  # read when `datasets` is imported: not yet

# `make test` runs three test processes on the machine's cores: each computes on one thread, and so
# does every launch it starts (the launcher keeps an exported OMP_NUM_THREADS: devices.worker_env).
# A one-rank launch would take a thread per core, and beside the other process's launch its
# OpenMP threads wait on each other: 10 steps took 31-38 s in place of 4.1-4.5 (DEVELOPING.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before anything here imports torch


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collecting imports torch, torchtitan and Transformers: a great many objects and little
    garbage. They import with Python's cyclic collector off and, after one collection, are frozen
    out of its passes, as a CPU launch's forking process does (`worker.forked_torchrun`)."""
    gc.disable()
    yield
    gc.collect()
    gc.freeze()
    gc.enable()


def pytest_unconfigure(config):
    gc.unfreeze()  # the interpreter's teardown frees them (else extension modules report them leaked)
    if MADE_HERE:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


# ---- how `make test` spreads the files over its three processes (pytest-xdist) -------------------

# A file's tests stay in one process (its module fixtures train once). Files that assert on the
# same session run share a unit: in several processes, each would train it again.
SHARED_RUNS = {
    "test_memory.py": "default_run", "test_training.py": "default_run", "test_resume.py": "default_run",
    "test_experiments.py": "moe_experiment_run", "test_moe_training.py": "moe_experiment_run",
}  # fmt: skip
# xdist hands units out in collection order: the longest first, so that no long one starts last.
# The order is the worker time per unit of a full `make test` (its durations summed per file; AMD
# EPYC, 2 cores), test_bad_inputs and test_tracking moved down by what their launcher refusals
# (no torch import: under a second each) and sqlite stores (copies of one database) now cost.
LONGEST_FIRST = ("default_run", "test_parallelism.py", "test_data_training.py", "test_dpo.py", "test_lora.py",
                 "test_chat.py", "test_hf_integration.py", "test_grpo.py", "moe_experiment_run", "test_sweeps.py",
                 "test_tracking.py", "test_slurm.py", "test_bad_inputs.py", "test_grpo_wiring.py",
                 "test_grpo_generation.py", "test_devices.py", "test_memory_at_scale.py", "test_build.py",
                 "test_reward_model.py", "test_config.py", "test_readme.py", "test_assets.py")  # fmt: skip


def _unit(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return SHARED_RUNS.get(file, file)


def pytest_collection_modifyitems(config, items):
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))  # stable: the rest keep their order


def pytest_xdist_make_scheduler(config, log):
    """xdist's per-file scheduling (--dist loadfile), with the files of one session run as one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByUnit(config, log)


@pytest.fixture(scope="session", autouse=True)
def flex_attention_without_compiling():
    """torchtitan runs FlexAttention and builds its BlockMasks through torch.compile: in a test
    process (which never trains through it: flex has no CPU backward) they run eagerly, the same
    function, without Inductor building C++ kernels for each new shape (on a machine with none
    cached yet, 13 CPU-s for the first). The workers build their masks eagerly too
    (`devices.fixes`), and attend with SDPA."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common import attention

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "_compiled_create_block_mask", create_block_mask)
        patch.setattr(attention.FlexAttention, "_compiled_flex_attn", flex_attention)
        yield


@pytest.fixture(scope="session")
def assets():
    """Built once per session into the session's asset dir (deterministic: the same every time);
    the other test process waits on the lock, then finds them built."""
    with open(SESSION_CACHE / "assets.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_assets()


def compose_config(*overrides: str) -> dict:
    """The composed config, as launch.py would get it, through Hydra's compose API."""
    with initialize_config_dir(config_dir=str(project_compose.CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def compose_job(*overrides: str) -> Job:
    """The composed config parsed into the job the launcher plans (`Job.parse`)."""
    return Job.parse(compose_config(*overrides))


def launch(
    run_dir: Path | None, *overrides: str, timeout: int = 900, env: dict | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """`python launch.py ...` in `cwd` with its run dir pinned to `run_dir` (None: Hydra's choice);
    `env`: variables added to this process's environment."""
    pinned = [f"hydra.run.dir={run_dir}"] if run_dir else []
    return subprocess.run(
        [sys.executable, str(REPO / "launch.py"), *pinned, *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- what the integration tests train: sized here, once ------------------------------------

# Short sequences and small batches (a quarter of the default job's 256 x 4 tokens per rank and
# step; the CPU experiments' own size): start-up, not the steps, is then most of a launch, and the
# loss still falls clearly within 10 steps.
TINY = ("training.seq_len=128", "training.local_batch_size=2")
# Sweep jobs: one rank, three short steps, no TensorBoard.
SWEEP_JOB = ("training.steps=3", "training.seq_len=64", "training.local_batch_size=2", "run.nproc_per_node=1",
             "metrics.enable_tensorboard=false")  # fmt: skip
# finetune=lora on the tiny HF dir's weights (loaded into model=native, or model=hf's own) and the
# tiny conversations (data=chat, validated at steps 1 and 10), 10 steps: adapter-only checkpoints
# at steps 4 and 8 (a resume from step 4 must end where this run ended: the resume of LoRA and of
# the chat data position), the PEFT adapter and the merged export at step 10. lr 1e-2: adapters
# (B starts at zero) move clearly. The tiny dir is untrained, so the first-loss check warns (its
# default): a resume must not warn about step 1 again.
LORA_DROPOUT = 0.1  # the suite's LoRA runs drop adapter inputs: their resume covers the masks too
LORA = (*TINY, "finetune=lora", f"finetune.dropout={LORA_DROPOUT}", "data=chat", "validator.steps=2",
        "checkpointing=[from_hf,periodic,export_hf]", "checkpoint.interval=4", "training.steps=10",
        "optimizer.lr=1e-2", "hf.first_loss_check=warn")  # fmt: skip


def trained(run_dir: Path, *overrides: str, timeout: int = 900, env: dict | None = None) -> Path:
    """`launch(run_dir, *overrides)`, which must succeed; returns `run_dir`."""
    result = launch(run_dir, *overrides, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


# ---- runs trained once per session and asserted on by several test files --------------------


@pytest.fixture(scope="session")
def default_run(tmp_path_factory, assets) -> Path:
    """The default job (tiny native Qwen3, 2 CPU ranks, no checkpoints), 10 steps: test_resume.py's
    uninterrupted reference and the first of its two launches of one seed. Each of its processes
    counts its settings parses and config builds into `process_counts(default_run)`."""
    folder = tmp_path_factory.mktemp("default")
    result = launch(folder / "run", *TINY, "training.steps=10", env=counting(folder / "run"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder / "console.txt").write_text(result.stdout + result.stderr)  # what a user saw: `console(default_run)`
    return folder / "run"


COUNTING_DIR = REPO / "tests" / "process_counts"  # its sitecustomize.py counts in every process of a launch
COUNTS_ENV = "QWEN3_NEURON_TEST_COUNTS"


def counting(run_dir: Path) -> dict:
    """The environment that makes each process of a launch into `run_dir` count for `process_counts`."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(COUNTING_DIR), os.environ.get("PYTHONPATH")])),
        COUNTS_ENV: str(run_dir.parent / "process_counts.txt"),
    }


def console(run_dir: Path) -> list[str]:
    """The lines the default run's launch printed (standard output, then standard error)."""
    return (run_dir.parent / "console.txt").read_text().splitlines()


def process_counts(run_dir: Path) -> Counter:
    """{"launcher parse": 1, "rank0 build": 1, ...} of a run launched with the counting dir."""
    return Counter((run_dir.parent / "process_counts.txt").read_text().splitlines())


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory, assets) -> Path:
    """LORA (above) on 2 CPU ranks: the run tests/test_lora.py asserts on."""
    base = f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}"
    return trained(tmp_path_factory.mktemp("lora") / "run", *LORA, base)


@pytest.fixture(scope="session")
def hf_lora_run(tmp_path_factory, assets) -> Path:
    """LORA (above) on model=hf, the Transformers backend, from the same tiny HF dir: 2 CPU ranks;
    each process counts into `process_counts(hf_lora_run)`."""
    hf = ("model=hf", f"model.hf_model={assets.tiny_qwen3_dir}")
    run_dir = tmp_path_factory.mktemp("hf-lora") / "run"
    return trained(run_dir, *LORA, *hf, env=counting(run_dir))


@pytest.fixture(scope="session")
def moe_experiment_run(tmp_path_factory, assets) -> Path:
    """experiment=cpu_qwen3_tiny_moe as it is: tiny MoE, blockwise experts, 2 ranks, 5 steps."""
    return trained(tmp_path_factory.mktemp("moe-blockwise") / "run", "experiment=cpu_qwen3_tiny_moe", timeout=600)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the live processes that mention `text` (a run dir: its torchrun and workers)."""
    return [args for _, args in command_lines() if text in args]


def command_lines():
    """(pid, command line) of every live process (Linux /proc)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield int(cmdline.parent.name), cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue


def plan_of(job: Job, run_dir: Path, **kwargs):
    """The plan of a parsed `job` as a dry run makes it: settled, then planned in this process
    (`kwargs`: make_plan's, e.g. `warn`)."""
    from qwen3_neuron.job.plan import make_plan  # torchtitan: imported by the tests that plan only

    settled = job.settled()
    return make_plan(settled, run_dir, worker_launch(settled, run_dir).nproc_per_node, **kwargs)


def launch_of(plan) -> WorkerLaunch:
    """The torchrun command and environment the launcher starts the workers of `plan_of`'s job with."""
    return worker_launch(plan.job, Path(plan.trainer_config.dump_folder))
