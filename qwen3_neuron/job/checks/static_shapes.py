"""device=neuron with compile.enable=true: refuse, before torchrun, what Neuron's compile cannot take.

TorchNeuron's `torch.compile(backend="neuron")` takes no dynamic shapes: `dynamic=True` is
rejected, and a shape it has not seen recompiles the graph (one more neuronx-cc compile, on every
rank, mid-training) - the Neuron docs' torch.compile backend reference. A data-dependent shape
inside the graph cannot be compiled at all (neuronx-cc error NCC_EMOD025, "Dynamic shape is not
supported"). So the plan checks, from the final config, that every tensor the compiled model
sees has a shape fixed by the config alone:

- batches: every training and validation batch is `training.local_batch_size` x
  `training.seq_len`. torchtitan 0.3.0's Validator builds its loader with the training batch
  size and seq_len (there is no validation batch size to differ), so the ways a batch changes
  shape are a finite pass - its last batch is partial (`dataloader.infinite=false`,
  `validator.steps=-1`) - and a loader whose samples are not packed to seq_len;
- MoE experts: torchtitan's `GroupedExperts` runs `torch._grouped_mm` over group sizes read from
  the routing, and expert parallelism's all-to-all hands each rank a data-dependent number of
  rows; the blockwise layout (`kernels=blockwise|nki`) pads the routed rows into a number of
  fixed-size blocks bounded from shapes alone (`kernels/moe/block_layout.py`).

The rules are those of the installed torch-neuronx's Neuron SDK (`devices.neuron_sdk`; where none is
installed, a dry run elsewhere, the oldest TorchNeuron's, SDK 2.33). From SDK 2.34 on, TorchNeuron
compiles `torch._grouped_mm` with data-dependent group sizes (its dynamic NKI kernels, on by default;
AWS's TorchTitan MoE recipes moved from blockwise kernels to it), so `kernels=none` passes there;
its recipes use no expert parallelism, which stays refused. Each refusal names the keys, the SDK
and the way out; `check_static_shapes` returns the plan's line.
"""

from __future__ import annotations

import dataclasses

from torchtitan.hf_datasets.text_datasets import (
    ChatDataLoader,
    HuggingFaceTextDataLoader,
    InterleavedChatDataLoader,
    InterleavedHuggingFaceTextDataLoader,
)
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.trainer import Trainer

from qwen3_neuron.data.loader import PackedDataLoader
from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.generation.kv_cache import APPEND_WIDTH, prefill_widths
from qwen3_neuron.job.checks.layout import resolve_degrees
from qwen3_neuron.models.hf.model_dir import HFModelDir

# Loaders whose every sample is exactly seq_len tokens: the project's packer (pad / flow layouts)
# and torchtitan's own (text: seq_len windows of a token stream; chat: greedy packing, padded).
PACKED_LOADERS = (
    PackedDataLoader.Config,
    HuggingFaceTextDataLoader.Config,
    ChatDataLoader.Config,
    InterleavedHuggingFaceTextDataLoader.Config,
    InterleavedChatDataLoader.Config,
)
STATIC_EXPERTS = "kernels=nki (Trainium's NKI kernel) or kernels=blockwise (the same blocks in plain torch)"
GROUPED_MM_COMPILES = (2, 34)  # the first Neuron SDK whose compile takes torch._grouped_mm's group sizes


def check_static_shapes(
    config: Trainer.Config,
    world_size: int,
    *,
    replacements: list[str],
    unapplied_factories: list[str],
    model_dir: HFModelDir | None,
) -> str:
    """Raise ConfigError on what would recompile or fail under compile.backend=neuron; return
    what was checked, for the plan. `replacements`: torchtitan's override log lines;
    `unapplied_factories`: kernel factories a dry run could not load (their device is absent),
    counted as applied - their @override targets GroupedExperts exactly, as blockwise's does."""
    sdk = devices.neuron_sdk(devices.torch_neuronx_version())
    why = f"Neuron's torch.compile takes static shapes only ({sdk})"
    batch = _check_batches(config, why)
    experts = _check_experts(config, world_size, replacements, unapplied_factories, model_dir, sdk, why)
    return f"static shapes for compile.backend={config.compile.backend}: {batch}{experts} (rules of {sdk})"


def _check_batches(config: Trainer.Config, why: str) -> str:
    shape = f"{config.training.local_batch_size} x {config.training.seq_len}"
    _check_loader(config.dataloader, "dataloader", why)
    if _finite(config.dataloader):
        raise ConfigError(
            f"dataloader.infinite=false with device=neuron and compile.enable=true: the last batch of "
            f"a finite pass is partial (fewer than training.local_batch_size rows), a new shape that "
            f"recompiles ({why}). Set dataloader.infinite=true (the data re-loops) or compile.enable=false."
        )
    generation = ""
    sources = [s for s in getattr(config.dataloader, "sources", ()) if getattr(s, "format", None) == "prompts"]
    if sources:
        batch, widths = config.training.local_batch_size, prefill_widths(config.training.seq_len)
        prompts = ", ".join(f"{batch} x {width}" for width in widths)
        forwards = [f"the prompts' forward ({prompts}: the narrowest that holds the batch's longest prompt)",
                    f"each new token's ({batch} x 1)"]  # fmt: skip
        graphs = len(widths) + 1
        if any(source.tools for source in sources):  # grpo.tools: tool turns appended on the same cache
            append = min(APPEND_WIDTH, config.training.seq_len)
            forwards.append(f"each tool turn's ({batch} x {append}, as many as it takes)")
            graphs += append not in widths
        generation = (f"; GRPO's generation on a static KV cache of {shape} positions per layer, without gradients: "
                      f"{', '.join(forwards[:-1])} and {forwards[-1]}, {graphs} more graphs, each compiled once")
    validator = config.validator
    if not validator.enable:
        return f"training batches {shape} tokens, no validation{generation}"
    _check_loader(validator.dataloader, "validator.dataloader", why)
    if validator.steps == -1:
        raise ConfigError(
            "validator.steps=-1 with device=neuron and compile.enable=true: a pass over the whole "
            "validation set ends with a partial batch, a shape the training batches never had, which "
            f"recompiles ({why}). Set validator.steps=N (batches per validation; the loader then "
            "re-loops and every batch is full)."
        )
    return f"training and validation batches {shape} tokens (validator.steps={validator.steps}){generation}"


def _check_loader(loader, key: str, why: str) -> None:
    if isinstance(loader, PACKED_LOADERS):
        return
    name = f"{type(loader).__module__}.{type(loader).__qualname__}"
    raise ConfigError(
        f"{key} is {name}, which the plan cannot show packs every sample to exactly "
        f"training.seq_len: variable-length samples give every batch a new shape, and {why}. "
        "Use data=text|chat|mix (packed to seq_len, positions per document) or torchtitan's own "
        "loaders, or set compile.enable=false."
    )


def _finite(loader) -> bool:
    sources = getattr(loader, "sources", None)
    if isinstance(loader, (InterleavedHuggingFaceTextDataLoader.Config, InterleavedChatDataLoader.Config)):
        return any(not source.infinite for source in sources)
    return not getattr(loader, "infinite", True)


def _check_experts(config, world_size, replacements, unapplied_factories, model_dir, sdk, why) -> str:
    if model_dir is not None and model_dir.is_moe:
        raise ConfigError(
            f"model=hf with a mixture-of-experts dir ({model_dir.path}, {model_dir.num_experts} experts) "
            "and compile.enable=true on device=neuron: its experts route tokens with data-dependent "
            f"shapes, and {why}. The kernels options replace model=moe's experts only: train it as "
            f"model=moe with {STATIC_EXPERTS}, or set compile.enable=false."
        )
    experts = _grouped_experts_nodes(config.model_spec.model, "model_spec.model")
    if not experts:
        return ""
    ep = resolve_degrees(config.parallelism, world_size).ep
    if ep > 1:
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} with device=neuron and compile.enable=true: "
            "expert parallelism's all-to-all hands each rank a number of routed rows that depends on "
            f"the routing, and {why}. Set parallelism.expert_parallel_degree=1 (e.g. parallelism=fsdp: "
            f"every rank runs every expert on its own tokens) with {STATIC_EXPERTS}."
        )
    replaced = {line.partition(": ")[2].split(" ")[0] for line in replacements}
    left = [fqn for fqn in experts if fqn not in replaced]
    grouped_mm_compiles = sdk.release >= GROUPED_MM_COMPILES
    if left and not unapplied_factories and not grouped_mm_compiles:
        raise ConfigError(
            f"kernels=none leaves torchtitan's GroupedExperts in {len(left)} MoE layer(s) ({left[0]}, ...) "
            "with device=neuron and compile.enable=true: they run torch._grouped_mm over per-expert "
            f"token counts read from the routing (data-dependent group sizes), and {why}. Use "
            f"{STATIC_EXPERTS}: routed tokens padded into fixed-size blocks (kernels.block_size), "
            "a block count bounded from the batch shape alone. Or set compile.enable=false. (From Neuron "
            "SDK 2.34 on, torch-neuronx 2.13.3.1 / 2.14.3.1, TorchNeuron compiles torch._grouped_mm with its "
            "dynamic NKI kernels, and kernels=none passes.)"
        )
    if left and unapplied_factories:
        how = f"{', '.join(unapplied_factories)} (planned; it cannot load here)"
    else:
        how = ", ".join(sorted({line.removeprefix("[Override] ").partition(": ")[0] for line in replacements
                                if line.partition(": ")[2].split(" ")[0] in experts}))  # fmt: skip
        if left:  # grouped_mm_compiles
            grouped = f"torchtitan's GroupedExperts (torch._grouped_mm, {sdk.name}'s dynamic NKI kernels)"
            how = f"{how} and {grouped} in {len(left)}" if how else grouped
    return f"; MoE experts in {len(experts)} layer(s) by {how}, expert parallel 1"


def _grouped_experts_nodes(node, path: str, seen: set[int] | None = None) -> list[str]:
    """Dotted paths of every config node that is exactly torchtitan's GroupedExperts.Config."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return []
    seen.add(id(node))
    if type(node) is GroupedExperts.Config:
        return [path]
    if isinstance(node, (list, tuple)):
        return [p for i, child in enumerate(node) for p in _grouped_experts_nodes(child, f"{path}.{i}", seen)]
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return []
    return [
        p for f in dataclasses.fields(node)
        for p in _grouped_experts_nodes(getattr(node, f.name, None), f"{path}.{f.name}", seen)
    ]  # fmt: skip
