"""Will it fit? The tensor memory one rank needs at the peak of a step, estimated from the final
Trainer.Config.

    per rank = parameters + optimizer states (+ DPO's / GRPO's frozen reference)   (local shards, exact sizes)
             + the largest of the step's moments:
               at the loss          activations held for backward + the logits' working memory of
                                    one loss chunk + the lm_head's weight buffers and gradient
               at the lm_head's     activations + the lm_head's gathered weight and gradient
               gradient reduce      buffers (FSDP, a trained head; the peak at short sequences)
               early in backward    activations + one block recomputed (activation checkpointing)
                                    + the lm_head's weight gradient
               end of backward      every gradient + the embedding's dense weight gradient in flight
               GRPO's generation    every gradient (the last step's, freed at the next zero_grad) +
                                    the KV cache + one block's forward without gradients + the
                                    next tokens' scores (+ under FSDP every parameter gathered)
             (+ GRPO's generation batch: the completions' ids and kept log-probabilities, and a
              compiled run's static KV cache, every moment)

At Qwen3's 151,936-token vocabulary the loss is usually the peak: a chunk's logits, their float32
log-softmax and their gradients (3 to 3.5 [chunk tokens, vocab] float32 copies) beside every
saved activation. The loss and every per-token log-probability (DPO's, GRPO's) go through lm_head
a chunk of the sequence at a time (torchtitan's ChunkedLossWrapper, finetune/logprobs.py).

- Parameters are counted on the model built on the meta device (torchtitan's own builder, as the
  trainer does before parallelizing; well under a second for 32B) and sharded as the layout
  shards them: TP splits the layers' matrices, FSDP/HSDP shard dim 0 over dp_shard x cp (FSDP2
  pads dim 0 to a multiple of the degree: rank 0 holds ceil(dim0 / degree) rows), routed experts
  are spread over dp_shard x cp x tp (EP or not), PP keeps 1/pp of the layers.
- Gradients have the parameters' dtype (`training.dtype`) and, like optimizer states, exist for
  trainable parameters only (finetune=lora: the adapters); AdamW/Adam keep 2 states per parameter
  (3 with amsgrad; bf16 with `optimizer.implementation=fused_opt_states_bf16`) plus a step scalar.
- Activations are counted tensor by tensor as torchtitan's Qwen3 block and the Transformers
  backend's save them (read off their saved-tensor lists, see `_layer_bytes`): matmul inputs in
  the FSDP mixed-precision dtype (`training.mixed_precision_param`), norms and q/k norms in
  float32, the dense attention mask of the SDPA-on-BlockMask attention (CPU, Neuron), the loss's
  float32 log-probabilities (one chunk of them with torchtitan's ChunkedLossWrapper).
  `training.seq_len` x `training.local_batch_size` tokens per rank, divided by cp; TP divides the
  heads and hidden units (and, with sequence parallel, the norms); MoE routes top_k copies of
  each token (balanced routing assumed). Full activation checkpointing keeps each block's input;
  selective keeps the block input plus every other matmul output and the attention outputs.

GRPO's generation keeps keys and values for [local_batch_size, seq_len] in every layer (compute
dtype; eager while it samples, compiled for the whole run: its static cache's buffers are kept
from one generation to the next), gathers every parameter in the compute dtype once for the
whole generation under FSDP, and runs one block at a time without gradients, counted as one
block's saved tensors at the same tokens (an upper bound: a forward without gradients frees what
backward would keep). The rank's
generation batch (local_batch_size x accumulation completions) lives through the step: int64 ids,
and float32 [seq_len] log-probabilities per completion for the ratio (num_iterations > 1) and the
reference (beta > 0).

Not in the estimate: FSDP's all-gathered layer and gradient buffers in flight, the optimizer
step's working buffers, allocator fragmentation, and what a compiler keeps. `run.measure_memory`
measures a step's true peak (torch's MemTracker, every live tensor); `bench/memory_at_scale.py`
compares the two at real sizes.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
from dataclasses import asdict, dataclass, field

from qwen3_neuron.devices.policy import NEURON_ATTENTION_OVERRIDE, SDPA_FOR_FLEX_OVERRIDE
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.models.hf.runtime import transformers_init_kept

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FLOAT32 = 4
INT64 = 8

# Trainium2 with LNC=2: 96 GiB HBM per chip, 4 logical NeuronCores (2 physical cores each).
TRN2_GIB_PER_LOGICAL_CORE = 24

STATES_PER_PARAMETER = {"Adam": 2, "AdamW": 2}
# TP splits these matrices along dim 1 (row-wise parallel); the others along dim 0.
ROWWISE = re.compile(r"(^|\.)(wo|w2|o_proj|down_proj)\.weight$|(^|\.)experts\.w2$")
REPLICATED_UNDER_TP = re.compile(r"router|(^|\.)gate\.weight$")
ROUTED_EXPERTS = re.compile(r"(^|\.)experts\.")
LAYER = re.compile(r"(^|\.)layers\.")
SDPA_ON_BLOCK_MASK = (SDPA_FOR_FLEX_OVERRIDE, NEURON_ATTENTION_OVERRIDE)
FULL_AC = "torchtitan.distributed.activation_checkpoint.FullAC.Config"
LM_HEAD = re.compile(r"(^|\.)(lm_head|output)\.weight$")
EMBEDDING = re.compile(r"(^|\.)(tok_embeddings|embed_tokens)\.weight$")
# [chunk tokens, vocab] float32 tensors alive at once in a loss chunk's backward: the logits (and
# their float32 copy), the log-softmax kept for backward, the gradient flowing back. Measured with
# torch's MemTracker on the real-vocabulary model (bench/memory_at_scale.py): torchtitan's
# ChunkedLossWrapper (the SFT loss) holds 3.5, the log-probability path (finetune/logprobs.py:
# DPO, GRPO; each chunk recomputed in backward) 3.
LOSS_LOGIT_COPIES = 3.5
LOGPROB_LOGIT_COPIES = 3
REDUCE_SCATTER = "the lm_head's gradient reduce-scatter"


@dataclass
class MemoryEstimate:
    per_rank_gib: float
    device_gib: float | None
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    recompute_gib: float
    logits_gib: float  # the lm_head's and the loss's working memory (at the peak when that is one of theirs)
    peak_at: str  # the moment of the step the total is taken at: "the loss", "the lm_head's gradient
    # reduce-scatter", "early backward", "end of backward"
    device: str
    ranks_per_node: int
    notes: list[str] = field(default_factory=list)
    reference_gib: float = 0.0  # finetune=full's DPO / GRPO (beta > 0) reference: a frozen copy of the starting weights
    generation_gib: float = 0.0  # GRPO: the KV cache, the gathered parameters and one block's forward while sampling
    static_cache_gib: float = 0.0  # GRPO compiled: the static KV cache, held all run
    completions_gib: float = 0.0  # GRPO: the rank's generation batch (ids, kept log-probabilities)
    reward_models_gib: float = 0.0  # GRPO: the reward-model dirs among grpo.rewards (their weights)

    @property
    def fits(self) -> bool:
        return self.device_gib is None or self.per_rank_gib <= self.device_gib

    def parts(self) -> dict[str, float]:
        return {
            "parameters": self.parameters_gib,
            "gradients": self.gradients_gib,
            "optimizer states": self.optimizer_gib,
            "activations": self.activations_gib,
            "lm_head and loss buffers": self.logits_gib,
            "recompute": self.recompute_gib,
            "frozen reference": self.reference_gib,
            "generation": self.generation_gib,
            "static KV cache": self.static_cache_gib,
            "completions": self.completions_gib,
            "reward models": self.reward_models_gib,
        }

    def line(self) -> str:
        device = f"{self.device_gib:.1f} GiB" if self.device_gib is not None else "unknown"
        shown = ", ".join(f"{name} {gib:.2f}" for name, gib in self.parts().items() if gib)
        return (f"memory per rank: {self.per_rank_gib:.2f} GiB of {device} ({self.device}), peak at "
                f"{self.peak_at}; parts: {shown}")

    def to_json(self) -> dict:
        return asdict(self)


def estimate_memory(
    config,
    world_size: int,
    device: str,
    ranks_per_node: int,
    model_on_meta,
    frozen_reference: bool = False,
    logprobs: bool = False,
    model_dir=None,
    grpo: GrpoMemory | None = None,
) -> MemoryEstimate:
    """Tensor memory per rank of `config`'s training; `model_on_meta`: `meta_model(config)`;
    `model_dir`: model=hf's dir as the job read it (its config.json, never read again here);
    `frozen_reference`: DPO (and GRPO with beta > 0) keeps a copy of the starting weights (each rank its shards);
    `logprobs`: the loss is made of per-token log-probabilities (DPO, GRPO), not the SFT loss;
    `grpo`: what GRPO's generation keeps (data=prompts)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    # torchtitan's own degrees (data_parallel_shard_degree=-1 resolved); the plan checked them
    degrees = ParallelDims.from_config(config.parallelism, world_size)
    shape = _shape(config, model_dir)
    param_bytes = DTYPE_BYTES[config.training.dtype]
    counts = _local_parameter_counts(model_on_meta, degrees)
    parameters = counts.elements * param_bytes
    gradients = counts.trainable_elements * param_bytes  # a frozen (finetune=lora) base has none
    optimizer, notes = _optimizer_bytes(config, counts)
    notes.append(attention_note(config, shape, device))
    activations, recompute = _activation_bytes(config, shape, degrees, device)
    tied = not any(LM_HEAD.search(name) for name in counts.names)  # the lm_head is the embedding's weight
    head_trainable = _trainable(counts, EMBEDDING if tied else LM_HEAD)
    copies = LOGPROB_LOGIT_COPIES if logprobs else LOSS_LOGIT_COPIES
    head = _head_bytes(config, shape, degrees, _fsdp_wrapped(shape, degrees), bool(head_trainable), copies)
    # the gradients are live through the whole step (measured: from the first forward on), so every
    # moment counts them; the end of backward adds the embedding's dense gradient in flight
    moments = {
        "the loss": activations + head["the loss"] + gradients,
        "early backward": activations + recompute + gradients,
        # the embedding's backward makes a dense [vocab, dim] gradient, added to the one kept
        "end of backward": gradients + _trainable(counts, EMBEDDING) * param_bytes,
    }
    if REDUCE_SCATTER in head:
        # measured: the SFT loss's step still holds the activations then, DPO's (log-probabilities
        # through finetune/logprobs.py, the head's gradient reduced at the end of backward) none
        moments[REDUCE_SCATTER] = (0 if logprobs else activations) + head[REDUCE_SCATTER] + gradients
    generation = completions = static_cache = 0
    if grpo is not None:
        # under FSDP every parameter is gathered in the compute dtype for the whole generation
        fsdp = degrees.dp_shard * degrees.cp if _fsdp_wrapped(shape, degrees) else 0
        gathered = counts.elements * fsdp * DTYPE_BYTES[config.training.mixed_precision_param]
        generation, completions, static_cache = _grpo_bytes(config, shape, degrees, device, grpo, gathered)
        moments["GRPO's generation"] = gradients + generation
        moments = {moment: held + completions + static_cache for moment, held in moments.items()}
    peak_at = max(moments, key=moments.get)
    logits = head.get(peak_at, head["the loss"])
    reference = parameters if frozen_reference else 0  # finetune=lora's reference: the adapters off, no copy
    reward_models = grpo.reward_models if grpo is not None else 0
    return MemoryEstimate(
        per_rank_gib=(parameters + optimizer + reference + reward_models + moments[peak_at]) / GIB,
        device_gib=device_memory_gib(device, ranks_per_node),
        parameters_gib=parameters / GIB,
        gradients_gib=gradients / GIB,
        optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB,
        recompute_gib=recompute / GIB,
        logits_gib=logits / GIB,
        peak_at=peak_at,
        device=device,
        ranks_per_node=ranks_per_node,
        notes=notes,
        reference_gib=reference / GIB,
        generation_gib=generation / GIB,
        completions_gib=completions / GIB,
        static_cache_gib=static_cache / GIB,
        reward_models_gib=reward_models / GIB,
    )


def device_memory_gib(device: str, ranks_per_node: int) -> float | None:
    """Memory one rank may use: a logical NeuronCore's HBM, a GPU's memory, or the CPU's system
    memory shared by the node's ranks. None when it cannot be known here (CUDA not present)."""
    if device == "neuron":
        return float(TRN2_GIB_PER_LOGICAL_CORE)
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available() else None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / ranks_per_node / GIB


def check_fit(estimate: MemoryEstimate, config, mode: str, warn) -> None:
    """run.memory_check: fail (ConfigError), warn, or off."""
    if mode == "off" or estimate.fits:
        return
    message = _does_not_fit_message(estimate, config)
    if mode == "fail":
        raise ConfigError(message + " (run.memory_check=warn lets it start anyway.)")
    warn(f"[qwen3-neuron] warning: {message}")


def _does_not_fit_message(estimate: MemoryEstimate, config) -> str:
    biggest = sorted(estimate.parts().items(), key=lambda item: -item[1])[:3]
    training = config.training
    static = estimate.parameters_gib + estimate.gradients_gib + estimate.optimizer_gib
    shard = (
        "more FSDP ranks (run.nnodes x run.nproc_per_node with parallelism.data_parallel_shard_degree=-1) "
        "or parallelism.tensor_parallel_degree"
    )
    shrink = [
        f"a smaller training.local_batch_size (now {training.local_batch_size})",
        f"a smaller training.seq_len (now {training.seq_len})",
    ]
    if _ac_mode(config.activation_checkpoint) != "full":
        shrink.insert(0, f"full activation checkpointing (+activation_checkpoint._target_={FULL_AC})")
    hints = [shard, *shrink] if static > estimate.activations_gib else [*shrink, shard]
    return (
        f"the plan does not fit: {estimate.line()}. Biggest: "
        + ", ".join(f"{name} {gib:.2f} GiB" for name, gib in biggest)
        + f". What would bring it under: {'; '.join(hints)}."
    )


# ---- the model's numbers ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    backend: str  # "native" (torchtitan's Qwen3 modules) or "hf" (the Transformers backend)
    n_layers: int
    dim: int
    vocab: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int | None  # dense layers
    num_experts: int | None = None
    top_k: int | None = None
    moe_hidden: int | None = None


def _shape(config, model_dir) -> _Shape:
    model = config.model_spec.model
    layers = getattr(model, "layers", None)
    if isinstance(layers, list) and layers and hasattr(layers[0], "attention"):
        layer, attention = layers[0], layers[0].attention
        moe = getattr(layer, "moe", None)
        return _Shape(
            backend="native",
            n_layers=len(layers),
            dim=model.dim,
            vocab=model.vocab_size,
            n_heads=attention.n_heads,
            n_kv_heads=attention.n_kv_heads or attention.n_heads,
            head_dim=attention.head_dim or model.dim // attention.n_heads,
            ffn_hidden=layer.feed_forward.w1.out_features if layer.feed_forward is not None else None,
            num_experts=moe.num_experts if moe is not None else None,
            top_k=moe.router.top_k if moe is not None else None,
            moe_hidden=moe.routed_experts.inner_experts.hidden_dim if moe is not None else None,
        )
    hf = model_dir.text_config
    experts = model_dir.num_experts
    return _Shape(
        backend="hf",
        n_layers=hf["num_hidden_layers"],
        dim=hf["hidden_size"],
        vocab=hf["vocab_size"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        ffn_hidden=None if experts else hf["intermediate_size"],
        num_experts=experts,
        top_k=hf.get("num_experts_per_tok") if experts else None,
        moe_hidden=hf.get("moe_intermediate_size") if experts else None,
    )


# ---- parameters, gradients, optimizer states -------------------------------------------------


@dataclass
class _LocalCounts:
    elements: int = 0  # parameter elements on the rank
    trainable_elements: int = 0  # of those, the ones with gradients and optimizer states
    tensors: int = 0  # trainable parameter tensors (each gets an optimizer step scalar)
    by_name: dict[str, int] = field(default_factory=dict)  # trainable ones
    names: list[str] = field(default_factory=list)  # every parameter (a tied weight once)


def meta_model(config):
    """The model as the trainer builds it before parallelizing: on the meta device, no memory."""
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    model_config = copy.deepcopy(config.model_spec.model)
    model_config.update_from_config(config=copy.deepcopy(config))
    model_type = getattr(model_config, "model_type", None)  # model=hf: config.json's
    kept = transformers_init_kept(model_type) if model_type else contextlib.nullcontext()
    with kept, torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        return model_config.build()


def _local_parameter_counts(model_on_meta, degrees) -> _LocalCounts:
    counts = _LocalCounts()
    fsdp = degrees.dp_shard * degrees.cp
    for name, parameter in model_on_meta.named_parameters():
        shape = list(parameter.shape)
        if ROUTED_EXPERTS.search(name):
            # EP splits the experts, FSDP/TP the rest of the ranks: all of dp_shard x cp x tp
            shape[0] = math.ceil(shape[0] / (fsdp * degrees.tp))
        else:
            if degrees.tp > 1 and len(shape) >= 2 and not REPLICATED_UNDER_TP.search(name):
                dim = 1 if ROWWISE.search(name) else 0
                shape[dim] = math.ceil(shape[dim] / degrees.tp)
            shape[0] = math.ceil(shape[0] / fsdp)  # FSDP2 pads dim 0: rank 0 holds a full chunk
        local = math.prod(shape)
        counts.names.append(name)
        if degrees.pp > 1 and LAYER.search(name):
            local = math.ceil(local / degrees.pp)  # each stage holds 1/pp of the layers
        counts.elements += local
        if parameter.requires_grad:  # frozen weights (finetune=lora's base): no gradient, no state
            counts.trainable_elements += local
            counts.tensors += 1
            counts.by_name[name] = local
    return counts


def _trainable(counts: _LocalCounts, name: re.Pattern) -> int:
    """Local elements of the trainable parameters whose name matches (a tied lm_head is the embedding)."""
    return sum(local for parameter, local in counts.by_name.items() if name.search(parameter))


def _optimizer_bytes(config, counts: _LocalCounts) -> tuple[int, list[str]]:
    notes = []
    optimizer = config.optimizer
    groups = optimizer.param_groups
    state_bytes = 2 if optimizer.implementation == "fused_opt_states_bf16" else DTYPE_BYTES[config.training.dtype]
    total = 0
    for name, local in counts.by_name.items():
        group = next((g for g in groups if re.search(g.pattern, name)), groups[0])
        states = STATES_PER_PARAMETER.get(group.optimizer_name)
        if states is None:
            states = 2
            note = f"optimizer {group.optimizer_name}: assumed 2 states per parameter"
            if note not in notes:
                notes.append(note)
        if group.optimizer_kwargs.get("amsgrad"):
            states += 1
        total += states * local * state_bytes + FLOAT32  # + the step scalar (a float32 tensor)
    return total, notes


# ---- GRPO's generation ----------------------------------------------------------------------


@dataclass(frozen=True)
class GrpoMemory:
    static_cache: bool  # compile.enable: the KV cache is kept all run; eager, while sampling
    completions: int  # the rank's generation batch: local_batch_size x gradient accumulation
    kept_logprobs: int  # [seq_len] float32 log-probabilities kept per completion: old (num_iterations > 1), reference (beta > 0)
    reward_models: int = 0  # bytes of the reward-model dirs among grpo.rewards: held on every rank all run


def _grpo_bytes(config, s: _Shape, degrees, device: str, grpo: GrpoMemory, gathered: int) -> tuple[int, int, int]:
    """(what sampling holds: the eager KV cache, `gathered` parameters, one block's forward; the
    generation batch; the compiled run's static KV cache)."""
    training = config.training
    compute = DTYPE_BYTES[training.mixed_precision_param]
    batch, seq = training.local_batch_size, training.seq_len
    tokens = batch * seq
    layers = math.ceil(s.n_layers / degrees.pp)
    kv_heads = s.n_kv_heads // degrees.tp
    cache = layers * 2 * tokens * kv_heads * s.head_dim * compute
    sp = degrees.tp if config.parallelism.enable_sequence_parallel else 1
    block = _layer_bytes(s, tokens, batch, seq, compute, degrees.tp, sp, _dense_mask(config, s, device))
    # the next tokens' float32 scores, warped, and their probabilities
    head = 3 * batch * math.ceil(s.vocab / degrees.tp) * FLOAT32
    completions = grpo.completions * seq * (INT64 + grpo.kept_logprobs * FLOAT32)
    # grpo.tools: a rollout's eager buffers ([batch, longest prompt + max_completion_length]) are no
    # larger than this cache, and a tool turn's forward ([batch, kv_cache.APPEND_WIDTH] compiled) holds
    # less than the prompts' counted in `block`
    if grpo.static_cache:
        return gathered + block + head, completions, cache
    return cache + gathered + block + head, completions, 0


# ---- activations -----------------------------------------------------------------------------


def _activation_bytes(config, shape: _Shape, degrees, device: str) -> tuple[int, int]:
    """(held for backward at the end of forward, one block recomputed in backward)."""
    training = config.training
    compute = DTYPE_BYTES[training.mixed_precision_param]
    batch = training.local_batch_size
    if degrees.pp > 1:
        # pipeline: microbatches in flight on the first stage (up to pp of them, 1F1B)
        batch = config.parallelism.pipeline_parallel_microbatch_size * min(
            degrees.pp, training.local_batch_size // config.parallelism.pipeline_parallel_microbatch_size
        )
    seq = training.seq_len // degrees.cp
    tokens = batch * seq
    sp = degrees.tp if config.parallelism.enable_sequence_parallel else 1
    dense_mask = _dense_mask(config, shape, device)
    layer = _layer_bytes(shape, tokens, batch, seq * degrees.cp, compute, degrees.tp, sp, dense_mask)
    layers = math.ceil(shape.n_layers / degrees.pp)
    ac = _ac_mode(config.activation_checkpoint)
    if ac == "full":
        # torch's checkpoint keeps each block's input (FSDP cast it to the compute dtype) and
        # the positions, and recomputes one block at a time in backward
        held = layers * tokens * shape.dim * compute + tokens * INT64
        recompute = layer
    elif ac == "selective":
        # torchtitan's per-op SAC keeps the matmul outputs of every other matmul and the
        # attention outputs; the rest of each block is recomputed
        kept = _selective_bytes(shape, tokens, compute, degrees.tp)
        held = layers * (tokens * shape.dim * compute + kept) + tokens * INT64
        recompute = layer - kept
    else:
        held, recompute = layers * layer, 0
    return held + _outside_layers_bytes(config, shape, tokens, compute, degrees.tp, sp), recompute


def _layer_bytes(s: _Shape, tokens, batch, seq, compute, tp, sp, dense_mask) -> int:
    """Bytes one decoder block saves for backward, tensor by tensor (per rank)."""
    heads, kv_heads = s.n_heads // tp, s.n_kv_heads // tp
    # RMSNorm: float32 input and 1/rms; torchtitan keeps the float32 output, HF casts it back
    norm_out = FLOAT32 if s.backend == "native" else compute
    norms = 2 * (tokens * s.dim * (FLOAT32 + norm_out) + tokens * FLOAT32) // sp
    matmul_inputs = 2 * tokens * s.dim * compute  # the qkv and the MLP input, all-gathered under SP
    qk_norm = tokens * (heads + kv_heads) * (s.head_dim * (FLOAT32 + norm_out) + FLOAT32)
    # torchtitan applies RoPE per layer on float32 cos/sin; HF computes them once per step
    rope = 2 * tokens * s.head_dim * FLOAT32 if s.backend == "native" else 0
    # SDPA keeps q, k, v, output and log-sum-exp; HF expands k and v to every query head
    sdpa_kv = kv_heads if s.backend == "native" else heads
    attention = tokens * s.head_dim * (2 * heads + 2 * sdpa_kv) * compute + tokens * heads * FLOAT32
    mask = batch * seq * seq * compute if dense_mask else 0
    if s.num_experts:
        mlp = _moe_bytes(s, tokens, compute)
    else:
        mlp = 4 * tokens * (s.ffn_hidden // tp) * compute  # w1 out, w3 out, silu, their product
    return norms + matmul_inputs + qk_norm + rope + attention + mask + mlp


def _moe_bytes(s: _Shape, tokens, compute) -> int:
    """Router scores and top-k, then top_k routed copies of each token through SwiGLU experts."""
    routed = tokens * s.top_k
    router = tokens * (s.num_experts * compute + 3 * s.top_k * INT64 + compute + s.top_k * compute)
    experts = routed * (s.dim * compute + 4 * s.moe_hidden * compute + compute + s.dim * FLOAT32)
    return router + experts + s.num_experts * 4


def _selective_bytes(s: _Shape, tokens, compute, tp) -> int:
    """torchtitan's SelectiveAC: every other matmul output and the attention output are kept."""
    heads, kv_heads = s.n_heads // tp, s.n_kv_heads // tp
    hidden = (s.ffn_hidden or s.moe_hidden * s.top_k) // tp
    matmul_outputs = [(heads + 2 * kv_heads) * s.head_dim, s.dim, hidden, hidden, s.dim]
    kept = sum(matmul_outputs[::2]) * tokens * compute
    return kept + tokens * heads * (s.head_dim * compute + FLOAT32)


def _outside_layers_bytes(config, s: _Shape, tokens, compute, tp, sp) -> int:
    """Token ids and the final norm (the hidden states the loss chunks read)."""
    norm_out = FLOAT32 if s.backend == "native" else compute
    final_norm = (tokens * s.dim * (FLOAT32 + norm_out) + tokens * FLOAT32) // sp
    # HF computes RoPE's cos and sin once per step, (batch, 1, seq, head_dim) each
    rope = 2 * tokens * s.head_dim * compute if s.backend == "hf" else 0
    return tokens * INT64 + final_norm + rope


def _head_bytes(config, s: _Shape, degrees, fsdp: bool, head_trainable: bool, copies: float) -> dict[str, int]:
    """The lm_head's and the loss's working memory at two moments. At the loss (a chunk's
    backward; the whole sequence is one chunk without ChunkedLossWrapper): `copies` of the
    [chunk, vocab] float32 logits and [vocab, dim] weight-sized buffers: under FSDP the
    all-gathered weight (kept across the chunks) and, when it trains, the chunk's new gradient
    and the unsharded gradient it is added to; without FSDP, the chunk's new gradient. At the
    lm_head's gradient reduce-scatter (FSDP, a trained head), when the logits are gone: the
    gathered weight, two compute-dtype gradient buffers, the unsharded gradient, the
    reduce-scatter's input copy of it (none on one rank) and its output shard (measured with
    MemTracker at 1 and 2 ranks, seq_len 128 to 512: the same bytes at each)."""
    from torchtitan.components.loss import ChunkedLossWrapper

    tokens = config.training.local_batch_size * config.training.seq_len // degrees.cp
    loss = config.loss
    chunk = math.ceil(tokens / loss.num_chunks) if isinstance(loss, ChunkedLossWrapper.Config) else tokens
    vocab = math.ceil(s.vocab / degrees.tp)
    head = vocab * s.dim
    compute, param = DTYPE_BYTES[config.training.mixed_precision_param], DTYPE_BYTES[config.training.dtype]
    logits = int(copies * chunk * vocab * FLOAT32) + chunk * INT64
    if not fsdp:
        # a trained head without FSDP: three [vocab, dim] buffers of the parameters' dtype (the
        # chunk's gradient, the sum it is added to, the tied embedding's; measured on native 0.6B)
        return {"the loss": logits + (3 * head * param if head_trainable else 0)}
    if not head_trainable:
        return {"the loss": logits + head * compute}
    reduce = DTYPE_BYTES[config.training.mixed_precision_reduce]
    shards = degrees.dp_shard * degrees.cp
    # the unsharded gradient cast to the reduce dtype: no copy when it is already in it (float32
    # compute on a CPU without bf16 units; MemTracker at 1 rank: one [vocab, dim] buffer fewer)
    cast = head * reduce if config.training.mixed_precision_param != config.training.mixed_precision_reduce else 0
    reduce_scatter = cast + (head * reduce if shards > 1 else 0) + math.ceil(head / shards) * reduce
    return {
        "the loss": logits + head * compute + head * compute + head * reduce,
        REDUCE_SCATTER: head * compute + 2 * head * compute + reduce_scatter,
    }


def _fsdp_wrapped(s: _Shape, degrees) -> bool:
    """torchtitan wraps the model in FSDP2 when it shards, and the Transformers backend always."""
    return s.backend == "hf" or degrees.dp_shard * degrees.cp > 1


def attention_note(config, shape: _Shape, device: str) -> str:
    """Which attention kernel the estimate assumed. On CPU, SDPA on a boolean mask runs torch's
    flash kernel for CPU, which keeps q, k, v, the output, a log-sum-exp and the mask in the
    compute dtype (each layer its own copy), no [batch, heads, seq, seq] probabilities (read off
    its saved tensors, torch 2.13). Then the mask: what a packed sequence attends to."""
    if device == "cpu" and _dense_mask(config, shape, device):
        kernel = "SDPA's flash kernel for CPU on a dense mask, the mask kept per layer, no [seq, seq] scores"
    elif _dense_mask(config, shape, device):
        kernel = "SDPA on a dense mask, the mask kept per layer, no [seq, seq] scores"
    else:
        kernel = "a fused kernel (flash, memory-efficient or FlexAttention), no [seq, seq] scores kept"
    # torchtitan's own language models are block-causal always; model=hf's mask is its config's
    if getattr(config.model_spec.model, "attn_mask_type", "block_causal") == "block_causal":
        mask = "block-causal: each packed sequence attends within itself"
    else:
        mask = "causal across the sample (model.flavor=full): a packed sequence attends to those before it too"
    return f"attention: {kernel}; {mask}"


def _dense_mask(config, shape: _Shape, device: str) -> bool:
    """SDPA on a dense copy of the BlockMask (CPU, Neuron) saves the mask in every layer;
    FlexAttention (CUDA) keeps only the block mask."""
    if shape.backend == "hf":
        return device != "cuda"
    imports = [entry if isinstance(entry, str) else entry[0] for entry in config.override.imports]
    return any(name in imports for name in SDPA_ON_BLOCK_MASK)


def _ac_mode(ac_config) -> str:
    if ac_config is None:
        return "none"
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if isinstance(ac_config, FullAC.Config):
        return "full"
    if isinstance(ac_config, SelectiveAC.Config):
        return "selective"
    return "none"
