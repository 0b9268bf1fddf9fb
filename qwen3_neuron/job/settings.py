"""The framework's own config sections, one dataclass each (`SECTIONS` names them; each key's
docstring says what it does; docs/configuration.md lists them, tests/test_docs.py holds it to them).

Everything else in the composed YAML is a torchtitan `Trainer.Config` section under torchtitan's
own name. These dataclasses are checked by the same code (`fields.apply_fields`), so a typo or a
wrong type here reads exactly like one in a torchtitan section.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from qwen3_neuron.data.row_loading import resolve_files
from qwen3_neuron.data.source import SourceFields
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings
from qwen3_neuron.eval.objective import check_objective
from qwen3_neuron.fields import apply_fields, build_fields
from qwen3_neuron.finetune.names import HF_PROJECTIONS
from qwen3_neuron.trainers import TRAINERS, default_trainer

MOE_KERNELS = "qwen3_neuron.kernels.moe."  # factories replacing MoE experts (kernels=blockwise|nki)


@dataclass(kw_only=True)
class ModelSettings:
    kind: Literal["native", "hf", "moe"] = "native"
    """Which of the three trainings: torchtitan's Qwen3, the Transformers backend, Qwen3 MoE."""

    module: str = "qwen3"
    """torchtitan model module whose `config_registry` holds `config_fn` (as torchtitan's --module)."""

    config_fn: str = "qwen3_32b"
    """torchtitan config function giving the base Trainer.Config (as torchtitan's --config)."""

    flavor: str = "tiny"
    """Model architecture swapped into the base config's `model_spec`."""

    hf_model: str | None = None
    """Hub id or local dir of a Transformers model (model=hf)."""

    trust_remote_code: bool = False
    """Passed to Transformers as is; never assumed."""

    num_experts: int | None = None
    """MoE: number of experts in the model (not an expert-parallel degree); null keeps the flavour's."""

    top_k: int | None = None
    """MoE: experts per token; null keeps the flavour's."""

    moe_hidden_dim: int | None = None
    """MoE: hidden size of each expert; null keeps the flavour's."""


@dataclass(kw_only=True)
class KernelSettings:
    name: str = "none"
    """The kernels option chosen (for the record)."""

    factories: list[str] = field(default_factory=list)
    """`module.function` @override factories this option activates."""

    overrides: list[str] = field(default_factory=list)
    """A user's own extra `module.function` @override factories, same flow."""

    allow_unused: bool = False
    """Let a `kernels.overrides` entry replace nothing (one meant for other models). Otherwise the
    plan refuses one that matches no node of the config, and the workers, once the model is
    built, one whose classes no module of it has (not checked with pipeline parallelism: a
    stage holds only some layers)."""

    devices: list[str] = field(default_factory=lambda: ["cpu", "cuda", "neuron"])
    """Devices the factories run on; the plan refuses others."""

    block_size: int = 128
    """Blockwise MoE kernels: tokens per block."""


@dataclass(kw_only=True)
class DeviceSettings:
    type: Literal["auto", "cpu", "cuda", "neuron"] = "auto"
    """auto: neuron if torch-neuronx and a device are present, else cuda, else cpu."""

    cache_dir: str | None = None
    """device=neuron: TorchNeuron's persistent NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR), where
    compiled graphs are kept and reused by later runs. null: an exported
    TORCH_NEURONX_NEFF_CACHE_DIR, else ~/.cache/qwen3_neuron/neff. Shared by every run and every
    job of a sweep (never per run dir); on a cluster, a shared file system path (e.g. /fsx/neff)
    so that every node reuses one compile. The one place the project has a Neuron run write outside
    its run dir (TorchNeuron's own scratch, TORCH_NEURONX_DEBUG_DIR, keeps its default,
    /tmp/neuron_backend). Unused on cpu/cuda."""


@dataclass(kw_only=True)
class RunSettings:
    nproc_per_node: int | None = None
    """Ranks per node; null takes the device's default (CPU 2, CUDA/Neuron the device count)."""

    nnodes: int = 1
    """Nodes in the job (each runs this launch once; SLURM: hydra/launcher=trn2_slurm does)."""

    node_rank: int = 0
    """This node's index in the job, 0..nnodes-1; node 0 hosts the rendezvous (SLURM: SLURM_NODEID)."""

    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous on node 0, the same on every node; needed when nnodes > 1.
    null with one node: torchrun --standalone."""

    rdzv_id: str | int | float = "qwen3_neuron"
    """Rendezvous id, the same on every node of one job (SLURM: slurm-<job id>). A number is
    taken as well: Hydra reads `run.rdzv_id=$SLURM_JOB_ID` as an int and a uuid prefix such as
    0e123456 as a float, and every node reads the same text the same way."""

    max_restarts: int = 0
    """torchrun restarts of all workers after a failure (they resume from the newest checkpoint
    when checkpointing is on)."""

    dry_run: bool = False
    """Print the plan (model, layout, torchrun command, then the memory verdict) and write the run
    record, start nothing; the exit code is 2 when a launch would refuse this plan (it does not fit)."""

    resume: str | None = None
    """A run dir to continue from its newest complete checkpoint, with the config it recorded."""

    verbose: bool = False
    """Show torchtitan's full log on screen (and a dry run's full config); otherwise one progress
    line per job (train.log has it all)."""

    stop_on_failure: bool = False
    """Multirun: stop the sweep at the first failed job instead of recording it and going on."""

    memory_check: Literal["fail", "warn", "off"] = "fail"
    """The plan's memory estimate per rank against the device's memory (a logical NeuronCore's
    24 GiB on trn2, the GPU's, the CPU's system memory shared by the node's ranks): fail stops a
    plan that does not fit, naming its biggest parts and what would bring it under; warn lets it
    start with a warning; off does not compare (the estimate is still recorded)."""

    measure_memory: bool = False
    """Measure one training step (the second) under torch's MemTracker, which sees every live
    tensor, temporaries included: step_memory.json, summary.json's `tracked_peak_gib` and the
    end-of-run memory line, beside the plan's estimate. That step runs several times slower."""

    objective: str = "final_loss"
    """summary.json field a sweep job returns (Optuna's value; its direction is hydra.sweeper.direction):
    final_loss, first_loss, val_loss, tokens_per_second, mfu, peak_memory_gib, wall_seconds, or
    eval.<task>.<metric> with eval=lm_eval (e.g. eval.tiny_chat_answer.exact_match).
    val_loss: the last validation loss (needs a validation set: data.val_files or data.val_fraction)."""

    python_path: list[str] | None = None
    """Directories the workers import from before the installed packages (your reward modules and
    kernels); null: where launch.py runs, then $PYTHONPATH. Recorded in job.yaml at the first
    launch, so a resume from another directory or shell imports what the run imported."""

    show_data: int = 0
    """> 0: print rank 0's first N packed training samples as text (spans without loss marked),
    then stop: nothing is trained, no torchrun."""


@dataclass(kw_only=True)
class HFSettings:
    first_loss_check: Literal["warn", "fail", "off"] = "warn"
    """When initial weights are loaded (checkpointing=from_hf): warn, or fail the run, when the
    first step's loss is not at least 1 nat below a random init's ln(vocab) (the weights
    probably did not load); off: no check (e.g. for untrained weights)."""

    export_dir: str | None = None
    """checkpointing=export_hf: where the complete HF model dir goes (absolute, or relative to
    the run dir); null: <run dir>/hf_export."""


PACKED_KINDS = ("text", "chat", "mix", "preference", "prompts")  # the data kinds read into qwen3_neuron.data's PackedDataLoader


@dataclass(kw_only=True)
class DataSettings(SourceFields):
    """The `data` section: the per-source keys (`SourceFields`, each also the default of data=mix's
    sources) and the ones of the whole section below."""

    kind: Literal["tiny", "c4", "text", "chat", "mix", "preference", "prompts"] = "tiny"
    """tiny / c4: torchtitan's registered data sets, as the `dataloader` section names them.
    text / chat / mix / preference: rows from `files` or `hf_dataset` (mix: `sources`) through
    qwen3_neuron.data's PackedDataLoader; preference trains with DPO (the `preference` section) or
    trainer=orpo|simpo|kto, prompts with GRPO (the `grpo` section)."""

    streaming: bool = False
    """Stream rows instead of reading them map-style (corpora larger than memory)."""

    val_files: str | list[str] | None = None
    """Validation rows (same forms as `files`); turns on torchtitan's Validator."""

    sources: list[dict[str, Any]] = field(default_factory=list)
    """data=mix: one mapping per source: files or hf_dataset, weight (> 0), format (text|chat)
    and any of the per-source keys above (the top-level values are their defaults)."""


@dataclass(kw_only=True)
class FinetuneSettings:
    method: Literal["full", "lora"] = "full"
    """full: every weight trains (the default); lora: the base is frozen and only low-rank
    adapters train (torchtitan's LoRAConverter), exported in PEFT format."""

    rank: int = 8
    """LoRA: rank r of the adapter matrices A (r x in) and B (out x r)."""

    alpha: float = 16.0
    """LoRA: the adapter's output is scaled by alpha / rank (PEFT's lora_alpha)."""

    dropout: float = 0.0
    """LoRA: dropout on the adapter's input while training, 0 <= p < 1 (PEFT's lora_dropout); the
    base path sees the input whole. Each step's masks follow from the seed and the step, so a
    resumed run trains as the uninterrupted one."""

    target_modules: list[str] = field(default_factory=lambda: list(HF_PROJECTIONS))
    """LoRA: the projections that get adapters, in Hugging Face names (q_proj, k_proj, v_proj,
    o_proj, gate_proj, up_proj, down_proj), the same on every backend (model=native: q/k/v are
    one fused projection, all or none)."""

    merge_export: bool = True
    """LoRA with checkpointing=export_hf: also write the merged full model (<run dir>/hf_export)
    beside the adapter (<run dir>/hf_adapter); false writes the adapter only."""


@dataclass(kw_only=True)
class TrainerSettings:
    """The `trainer` group: the objective (`qwen3_neuron.trainers`)."""

    name: str | None = None
    """sft | dpo | orpo | simpo | kto | reward_model | grpo; each data kind picks its own
    (conf/data/*.yaml); null: the data kind's."""


# The sections a `trainer` option fills (conf/trainer/<name>.yaml): each default is written there
# once, beside what it means; the dataclasses declare the keys, their types and docstrings, and no
# default. A section is built only when its trainer is chosen (None otherwise).


@dataclass(kw_only=True)
class PreferenceSettings:
    """trainer=dpo: the DPO objective (Rafailov et al. 2023), with TRL's names and formulas."""

    beta: float
    """How far the policy may move from the reference: rewards are beta x the log-ratio of a
    response's probability under the policy and under the reference (IPO: its tau)."""

    loss: Literal["sigmoid", "ipo", "robust"]
    """sigmoid: DPO's -log sigmoid(beta x margin); ipo: (margin per token - 1/(2 beta))^2
    (Azar et al. 2023, TRL's length-normalised form); robust: sigmoid corrected for labels
    flipped with probability `label_smoothing` (Chowdhury et al. 2024)."""

    label_smoothing: float
    """loss=robust: the probability that a pair's preference is flipped, 0 <= p < 0.5."""

    sft_weight: float
    """The weight of an SFT term added to the DPO loss: the policy's NLL per token of the chosen
    responses (TRL's `loss_type=[loss, "sft"], loss_weights=[1, sft_weight]`). 0: pure DPO."""

    precompute_reference: bool
    """finetune=full: the reference's log-probabilities of every pair computed in one pass before
    training, instead of a frozen copy of the weights in memory. Not built yet: refused."""


@dataclass(kw_only=True)
class ORPOSettings:
    """trainer=orpo: ORPO (Hong et al. 2024), TRL's `experimental.orpo` names and formulas; no reference."""

    beta: float
    """The weight of the odds-ratio term beside the chosen responses' NLL (TRL's `beta`, the paper's lambda)."""


@dataclass(kw_only=True)
class SimPOSettings:
    """trainer=simpo: SimPO (Meng et al. 2024), TRL's CPO trainer with `loss_type="simpo"`; no reference."""

    beta: float
    """The scale of the length-normalised margin: rewards are beta x a response's mean token log-probability."""

    simpo_gamma: float
    """The target reward margin: the loss is -log sigmoid(beta x margin - simpo_gamma)."""

    cpo_alpha: float
    """The weight of CPO's behaviour-cloning term, the chosen responses' NLL per token (0: pure SimPO)."""


@dataclass(kw_only=True)
class KTOSettings:
    """trainer=kto: KTO (Ethayarajh et al. 2024), TRL's `KTOTrainer` names and formulas."""

    beta: float
    """How far the policy may move from the reference: rewards are beta x the log-ratio of a
    completion's probability under the policy and under the reference."""

    desirable_weight: float
    """The weight of a desirable completion's loss (to balance unequal numbers of the two kinds)."""

    undesirable_weight: float
    """The weight of an undesirable completion's loss."""


@dataclass(kw_only=True)
class RewardModelSettings:
    """trainer=reward_model: a scalar score head trained on preference pairs, TRL's RewardTrainer's
    loss and names (Bradley-Terry; a row's `margin` column is subtracted from the score gap)."""

    center_rewards_coefficient: float | None
    """Weight of TRL's centring term, the mean of (chosen + rejected)^2 over the pairs, which keeps
    the scores near 0 (Eisenstein et al. 2023 use 0.01); null: none (TRL's default)."""


@dataclass(kw_only=True)
class TrackingSettings:
    """The `tracking` section: where a run is recorded besides its run dir."""

    kind: Literal["none", "mlflow", "wandb"] = "none"
    """none: the run dir only; mlflow or wandb: the launcher logs each run (a sweep: a parent run
    with a child per job, a W&B group) into MLflow or W&B while it trains."""

    uri: str | None = None
    """tracking=mlflow's store: a server's URL (http://host:5000) or a database (sqlite:///mlflow.db);
    null: MLflow's own choice (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir).
    The first launch records it resolved (a relative path made absolute): its resumes log there."""

    experiment: str = "qwen3-neuron"
    """The MLflow experiment (the W&B project) the runs go to (made when it is not there)."""

    run_name: str | None = None
    """The run's name; null: the run dir's (`<date>/<time>`; a sweep job: `<date>/<time>/<job>`)."""

    interval_seconds: float = 5.0
    """How often the launcher sends the records metrics.jsonl gained (and samples system metrics)."""

    system_metrics: bool = True
    """The node's CPU, memory, network and the run dir's disk (a GPU's, a NeuronCore's) beside the run's metrics."""

    log_model: bool = False
    """The run's HF export (finetune=lora: its PEFT adapter too) logged as artifacts of the run."""


URI_EXAMPLES = "sqlite:///mlflow.db (a database file, no server) or http://127.0.0.1:5000 (a tracking server)"


def check_tracking(tracking: TrackingSettings) -> None:
    """Before anything starts: the tracking client installed (looked up, not imported), a store
    MLflow can open, and no tracking.* key that the chosen kind would ignore."""
    if tracking.uri is not None and tracking.kind != "mlflow":
        raise ConfigError(
            f"tracking.uri={tracking.uri} names an MLflow store, and tracking={tracking.kind} "
            + ("logs nowhere: add tracking=mlflow to log there, or drop tracking.uri." if tracking.kind == "none"
               else "logs to W&B (its server: WANDB_BASE_URL): drop tracking.uri, or use tracking=mlflow.")
        )  # fmt: skip
    if tracking.kind == "none":
        return
    if tracking.kind == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise ConfigError("tracking=mlflow needs MLflow's client, which is not installed: "
                          "pip install -e '.[tracking]' (or: pip install mlflow-skinny alembic).")  # fmt: skip
    if tracking.kind == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("tracking=wandb needs the W&B client, which is not installed: pip install wandb.")
    if tracking.uri is not None and _without_scheme(tracking.uri):
        raise ConfigError(
            f"tracking.uri={tracking.uri} is a path, not a store MLflow can open: give a URI such as {URI_EXAMPLES}."
        )
    if not tracking.experiment:
        raise ConfigError("tracking.experiment is empty: name the experiment (the W&B project) the runs go to.")
    if not tracking.interval_seconds > 0:
        raise ConfigError(
            f"tracking.interval_seconds must be > 0 (seconds between sends), got {tracking.interval_seconds}."
        )


def _without_scheme(uri: str) -> bool:
    """`mlflow.db`, `./mlruns`, `/data/mlruns`, `localhost:5000`: no scheme MLflow's stores take
    (`databricks` alone is one)."""
    scheme, colon, rest = uri.partition(":")
    return uri != "databricks" and (not colon or rest.isdigit() or not re.fullmatch(r"[A-Za-z][\w+.-]*", scheme))


def tracking_store(uri: str | None) -> str:
    """tracking=mlflow's store as this launch finds it, to be recorded: a relative sqlite:/// or
    file: path made absolute against the working dir (a resume from anywhere logs to the same);
    null: MLFLOW_TRACKING_URI, else MLflow's own default (imported only then)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        import mlflow

        return mlflow.get_tracking_uri()
    relative = re.fullmatch(r"(sqlite:///|file:)(?!/)([^?]+)(\?.*)?", uri)
    if relative is None or relative[2] == ":memory:":
        return uri
    prefix = "sqlite:///" if uri.startswith("sqlite") else "file://"
    return f"{prefix}{Path(relative[2]).resolve()}{relative[3] or ''}"


def check_model_logged(tracking: TrackingSettings, composed: Mapping[str, Any]) -> None:
    """tracking.log_model=true logs the HF export: the run must write one."""
    checkpoint = composed.get("checkpoint") or {}
    exports = checkpoint.get("enable") and checkpoint.get("last_save_in_hf")
    if tracking.kind != "none" and tracking.log_model and not exports:
        raise ConfigError(
            "tracking.log_model=true logs the run's HF export, and this run writes none: add checkpointing=export_hf "
            "(with checkpointing=from_hf: checkpointing=[from_hf,export_hf])."
        )


@dataclass(kw_only=True)
class GRPOSettings:
    """data=prompts: GRPO with verifiable rewards (Shao et al. 2024), with TRL 1.16's names and formulas."""

    rewards: list[str]
    """module.function reward functions, called as TRL calls them (qwen3_neuron.rewards has general ones)."""

    reward_weights: list[float] | None
    """One weight per reward (the total is their weighted sum); null: 1 each."""

    num_generations: int
    """Completions sampled per prompt: one group, whose rewards are compared with each other."""

    max_completion_length: int
    """Tokens a completion may take; a prompt must leave that many in training.seq_len."""

    temperature: float
    """Sampling temperature of the generation; the trained log-probabilities (the ratio, the KL) are
    the same tempered distribution's, as TRL's."""

    top_p: float
    """Nucleus sampling: the smallest set of tokens holding this probability."""

    loss_type: Literal["grpo", "dapo", "dr_grpo"]
    """How token losses become the loss: dapo a mean over the batch's completion tokens (TRL's
    default), grpo a mean per completion then over completions, dr_grpo a sum over a constant."""

    scale_rewards: Literal["group", "batch", "none"]
    """Advantages are rewards minus their group's mean, divided by the group's std, the batch's, or nothing."""

    epsilon: float
    """The clip range of the probability ratio: [1 - epsilon, 1 + epsilon_high]."""

    epsilon_high: float | None
    """The upper clip bound's epsilon (DAPO's clip-higher, e.g. 0.28); null: epsilon."""

    beta: float
    """Weight of the KL to the starting weights (k3 estimator); 0: none, and no reference is kept."""

    num_iterations: int
    """Training steps per generation batch (the sampling policy's log-probabilities kept for the ratio)."""

    tools: list[str]
    """module.function tools the policy may call between its turns (TRL's `tools`): each with type
    hints and a docstring describing its arguments, from which its schema is made for the prompt."""

    environment: str | None
    """module.Class instantiated once per rollout (TRL's `environment_factory`): `reset(**row)` may
    return text for the prompt, its public methods are tools, rewards get `environments=[...]`."""

    max_tool_calling_iterations: int
    """Rounds of tool calls a completion may make (TRL's name); a call after the last is not run."""

    tool_timeout_s: float
    """Seconds a tool call may take; past it the model reads that it timed out and the call is stopped."""


@dataclass(kw_only=True)
class Settings:
    model: ModelSettings
    kernels: KernelSettings
    device: DeviceSettings
    run: RunSettings
    hf: HFSettings
    data: DataSettings
    finetune: FinetuneSettings
    eval: EvalSettings
    trainer: TrainerSettings
    preference: PreferenceSettings | None  # the objectives' sections: their trainer's only (OBJECTIVE_SECTIONS)
    grpo: GRPOSettings | None
    orpo: ORPOSettings | None
    simpo: SimPOSettings | None
    kto: KTOSettings | None
    reward_model: RewardModelSettings | None
    tracking: TrackingSettings


# torchtitan's fields the framework owns: the model comes from the `model` group, outputs go to the run dir.
FRAMEWORK_OWNED = {"model_spec": "model.flavor", "dump_folder": "hydra.run.dir", "hf_model": "model.hf_model"}

# `optimizer.lr=3e-4` and friends, with their types: set on every param group (torchtitan 0.3.0
# keeps them in `optimizer.param_groups[i].optimizer_kwargs`, an untyped dict).
OPTIMIZER_SHORTHANDS: dict[str, Any] = {"lr": float, "weight_decay": float, "betas": tuple[float, float], "eps": float}

SECTIONS: dict[str, type] = {
    "model": ModelSettings,
    "kernels": KernelSettings,
    "device": DeviceSettings,
    "run": RunSettings,
    "hf": HFSettings,
    "data": DataSettings,
    "finetune": FinetuneSettings,
    "eval": EvalSettings,
    "trainer": TrainerSettings,
    "preference": PreferenceSettings,
    "grpo": GRPOSettings,
    "orpo": ORPOSettings,
    "simpo": SimPOSettings,
    "kto": KTOSettings,
    "reward_model": RewardModelSettings,
    "tracking": TrackingSettings,
}

# trainer -> the section its YAML fills (conf/trainer/<trainer>.yaml), built for that trainer only
OBJECTIVE_SECTIONS = {"dpo": "preference", "grpo": "grpo", "orpo": "orpo", "simpo": "simpo", "kto": "kto",
                      "reward_model": "reward_model"}


def parse_settings(composed: Mapping[str, Any]) -> Settings:
    """Read the framework sections of the composed config, checking every key and type; an
    objective's section only when its trainer trains (its YAML holds every key)."""
    sections = {name: apply_fields(cls(), composed.get(name) or {}, name) for name, cls in SECTIONS.items()
                if name not in OBJECTIVE_SECTIONS.values()}  # fmt: skip
    trainer = sections["trainer"]
    if trainer.name is None:
        trainer.name = default_trainer(sections["data"].kind)
    for owner, name in OBJECTIVE_SECTIONS.items():
        values = composed.get(name) or {}
        if owner == trainer.name:
            if not values:  # `trainer.name=X` names the trainer without its option's YAML
                raise ConfigError(f"trainer.name={owner}: choose the trainer as trainer={owner}, whose YAML "
                                  f"(conf/trainer/{owner}.yaml) holds the {name} section's values.")  # fmt: skip
            sections[name] = build_fields(SECTIONS[name], values, name)
            continue
        if values:
            key = next(iter(values))
            raise ConfigError(f"{name}.{key} is a setting of trainer={owner}, and this run trains with "
                              f"trainer={trainer.name}: choose trainer={owner} or leave {name}.* out.")  # fmt: skip
        sections[name] = None
    return Settings(**sections)


def check_settings(settings: Settings, device: str) -> None:
    """What the framework's own sections get wrong by themselves, on `device` (the resolved one).
    Needs no torchtitan: the launcher checks it before torchrun starts, so such a mistake is
    named in a second; the plan checks it too (a dry run's plan is the launcher's only check)."""
    model = settings.model
    moe_keys = {"num_experts": model.num_experts, "top_k": model.top_k, "moe_hidden_dim": model.moe_hidden_dim}
    stray = [key for key, value in moe_keys.items() if value is not None]
    if model.kind != "moe" and stray:
        raise ConfigError(f"model.{stray[0]} applies to model=moe only (this is model={model.kind}).")
    kernels = settings.kernels
    if kernels.factories and model.kind != "moe" and all(f.startswith(MOE_KERNELS) for f in kernels.factories):
        raise ConfigError(
            f"kernels={kernels.name} replaces the experts of torchtitan's MoE layers, and model={model.kind} "
            "has none: use model=moe (e.g. model=moe kernels=blockwise), or kernels=none."
        )
    if device not in kernels.devices:
        raise ConfigError(
            f"kernels={kernels.name} needs device {' or '.join(kernels.devices)}, "
            f"but the device is {device}. Use kernels=none or kernels=blockwise here."
        )
    if settings.finetune.method == "lora":
        _check_lora_numbers(settings.finetune)
    _check_data_files(settings.data)
    _check_trainer(settings)
    _check_preference(settings)
    _check_grpo(settings)
    _check_reward_model(settings)
    check_objective(settings.run.objective, settings.eval)
    _check_objective_data(settings)
    check_tracking(settings.tracking)


# summary fields only one kind of data reports
OBJECTIVE_DATA = {"reward": "prompts", "val_reward": "prompts", **{name: "preference" for name in (
    "reward_accuracy", "reward_margin", "val_reward_accuracy", "val_reward_margin")}}  # fmt: skip


def _check_objective_data(settings: Settings) -> None:
    needs = OBJECTIVE_DATA.get(settings.run.objective)
    if needs and settings.data.kind != needs:
        raise ConfigError(
            f"run.objective={settings.run.objective} is reported by data={needs} runs only (this one is "
            f"data={settings.data.kind}): every job would return no value. final_loss, val_loss, "
            "tokens_per_second or eval.<task>.<metric> are reported by every run."
        )


def _check_data_files(data: DataSettings) -> None:
    """Local data files that are not there, named before anything imports torchtitan or datasets
    (the plan reads their first rows later)."""
    if data.kind not in PACKED_KINDS:
        return
    named = {"data.files": data.files, "data.val_files": data.val_files}
    if data.kind == "mix":
        named = {"data.val_files": data.val_files}
        named.update({f"data.sources[{i}].files": source.get("files") for i, source in enumerate(data.sources)})
    for key, files in named.items():
        if files:
            resolve_files(files, key)


def _check_lora_numbers(finetune: FinetuneSettings) -> None:
    """What LoRA refuses whatever the model: unknown names, rank <= 0, dropout outside [0, 1)."""
    unknown = [name for name in finetune.target_modules if name not in HF_PROJECTIONS]
    if unknown:
        raise ConfigError(
            f"finetune.target_modules: unknown module {', '.join(map(repr, unknown))}. "
            f"Valid (Hugging Face names): {', '.join(HF_PROJECTIONS)}."
        )
    if not finetune.target_modules:
        raise ConfigError(f"finetune.target_modules is empty: name at least one of {', '.join(HF_PROJECTIONS)}.")
    if finetune.rank <= 0:
        raise ConfigError(f"finetune.rank must be a positive integer, got {finetune.rank}.")
    if not finetune.alpha > 0:
        raise ConfigError(f"finetune.alpha must be > 0, got {finetune.alpha}.")
    if not 0.0 <= finetune.dropout < 1.0:
        raise ConfigError(
            f"finetune.dropout must be in [0, 1) (the probability of dropping an adapter input), "
            f"got {finetune.dropout}."
        )


def _check_trainer(settings: Settings) -> None:
    """A trainer that exists, fed by the data kind."""
    name, data_kind = settings.trainer.name, settings.data.kind
    if name not in TRAINERS:
        raise ConfigError(f"trainer={name}: no such trainer. The trainers: {', '.join(TRAINERS)}.")
    kinds = TRAINERS[name][1]
    if data_kind not in kinds:
        raise ConfigError(f"trainer={name} trains on data={' or data='.join(kinds)} rows, not on data={data_kind}'s "
                          f"(which train with trainer={default_trainer(data_kind)}): use data={kinds[0]} for "
                          f"trainer={name}, or leave trainer out.")  # fmt: skip


def _check_preference(settings: Settings) -> None:
    """The numbers of the preference trainers (trainer=dpo|orpo|simpo|kto)."""
    for name in ("orpo", "simpo", "kto"):
        section = getattr(settings, name)
        if section is not None and not section.beta > 0:
            raise ConfigError(f"{name}.beta must be > 0 (TRL's default 0.1), got {section.beta}.")
    simpo, kto = settings.simpo, settings.kto
    if simpo is not None and not simpo.cpo_alpha >= 0:
        raise ConfigError(f"simpo.cpo_alpha must be >= 0 (0: pure SimPO), got {simpo.cpo_alpha}.")
    if kto is not None and not (kto.desirable_weight >= 0 and kto.undesirable_weight >= 0):
        raise ConfigError(f"kto.desirable_weight={kto.desirable_weight} / kto.undesirable_weight="
                          f"{kto.undesirable_weight}: weights of the two kinds' losses, each >= 0.")  # fmt: skip
    preference = settings.preference
    if preference is None:
        return
    if not preference.beta > 0:
        raise ConfigError(f"preference.beta must be > 0 (TRL's default 0.1), got {preference.beta}.")
    if preference.loss == "robust":
        if not 0.0 <= preference.label_smoothing < 0.5:
            raise ConfigError(f"preference.label_smoothing={preference.label_smoothing}: the probability that a "
                              "preference is flipped, 0 <= p < 0.5.")  # fmt: skip
    elif preference.label_smoothing:
        raise ConfigError(f"preference.label_smoothing applies to preference.loss=robust (as in TRL); "
                          f"preference.loss={preference.loss} does not read it.")  # fmt: skip
    if not preference.sft_weight >= 0:
        raise ConfigError(f"preference.sft_weight must be >= 0 (0: pure DPO), got {preference.sft_weight}.")
    if preference.precompute_reference:
        raise ConfigError("preference.precompute_reference=true is not built yet: the reference is the model "
                          "with its adapters off (finetune=lora) or a frozen copy of the starting weights "
                          "(finetune=full).")  # fmt: skip


def _check_reward_model(settings: Settings) -> None:
    """trainer=reward_model: its coefficient not negative."""
    if settings.reward_model is None:
        return
    coefficient = settings.reward_model.center_rewards_coefficient
    if coefficient is not None and not coefficient >= 0:
        raise ConfigError(f"reward_model.center_rewards_coefficient must be >= 0 (null: no centring term), got "
                          f"{coefficient}.")  # fmt: skip


def _check_grpo(settings: Settings) -> None:
    """The GRPO numbers (trainer=grpo)."""
    grpo = settings.grpo
    if grpo is None:
        return
    if grpo.num_generations < 2:
        raise ConfigError(f"grpo.num_generations={grpo.num_generations}: a group needs at least 2 completions "
                          "(their rewards are compared with each other; TRL's default 8).")  # fmt: skip
    if grpo.max_completion_length < 1:
        raise ConfigError(f"grpo.max_completion_length must be >= 1, got {grpo.max_completion_length}.")
    if not grpo.temperature > 0:
        raise ConfigError(f"grpo.temperature must be > 0, got {grpo.temperature}.")
    if not 0 < grpo.top_p <= 1:
        raise ConfigError(f"grpo.top_p must be in (0, 1], got {grpo.top_p}.")
    if not 0 <= grpo.epsilon < 1 or (grpo.epsilon_high is not None and not grpo.epsilon_high >= 0):
        raise ConfigError(f"grpo.epsilon={grpo.epsilon} / grpo.epsilon_high={grpo.epsilon_high}: the clip range "
                          "[1 - epsilon, 1 + epsilon_high] needs 0 <= epsilon < 1 and epsilon_high >= 0.")  # fmt: skip
    if not grpo.beta >= 0:
        raise ConfigError(f"grpo.beta must be >= 0 (0: no KL term), got {grpo.beta}.")
    if grpo.num_iterations < 1:
        raise ConfigError(f"grpo.num_iterations must be >= 1, got {grpo.num_iterations}.")
