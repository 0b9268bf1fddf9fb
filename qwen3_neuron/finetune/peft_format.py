"""torchtitan LoRA adapters <-> PEFT's on-disk format for Qwen3ForCausalLM.

torchtitan's `LoRALinear` holds `lora_a` (Linear in -> r, weight r x in) and `lora_b` (Linear
r -> out, weight out x r) and adds `alpha / r * lora_b(lora_a(x))`: exactly PEFT's LoRA with
`lora_alpha=alpha`, no rsLoRA, no dropout. PEFT saves `lora_A`/`lora_B` weights under the HF
module path prefixed by `base_model.model.`, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.

The HF module path comes from the model's own torchtitan state-dict adapter (`to_hf` of the base
weight's key), so the names are the ones torchtitan's HF save uses. A fused `wqkv` adapter has one
A for q, k and v and one B whose rows interleave them per KV group; PEFT has one adapter per
projection, so B's rows are split with torchtitan's own `FusedQKVLinear` split and A is shared:
delta_q = s B_q A, and so on - the same update, exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PARTS = {"lora_a": "lora_A", "lora_b": "lora_B"}


def to_peft(adapters: dict[str, torch.Tensor], spec, hf_assets_path: str | None) -> dict[str, torch.Tensor]:
    """{torchtitan adapter key: tensor} -> {PEFT key: tensor} for the model `spec` describes."""
    sd_adapter = spec.state_dict_adapter(spec.model, hf_assets_path)
    peft = {}
    for key, value in adapters.items():
        module, part, _ = key.rsplit(".", 2)  # "layers.0.attention.wo", "lora_a", "weight"
        for base_module, tensor in _unfused(module, part, value, spec.model).items():
            (hf_key,) = sd_adapter.to_hf({f"{base_module}.weight": tensor}).keys()
            peft[f"{PEFT_PREFIX}{hf_key.removesuffix('.weight')}.{_PEFT_PARTS[part]}.weight"] = tensor
    return dict(sorted(peft.items()))


def _unfused(module: str, part: str, value: torch.Tensor, model_config) -> dict[str, torch.Tensor]:
    """A `...qkv_linear.wqkv` adapter as wq/wk/wv adapters; any other module as it is."""
    if not module.endswith(".wqkv"):
        return {module: value}
    prefix = module.removesuffix("wqkv")
    if part == "lora_a":  # the shared down-projection
        return {f"{prefix}{name}": value.clone() for name in ("wq", "wk", "wv")}
    from torchtitan.models.common.attention import FusedQKVLinear

    layer = int(module.split(".")[1])
    qkv = model_config.layers[layer].attention.qkv_linear
    fused = SimpleNamespace(
        head_dim=qkv.head_dim, heads_per_kv=qkv.n_heads // qkv.n_kv_heads, r_dim=qkv.n_heads // qkv.n_kv_heads + 2
    )
    state = {f"{prefix}wqkv.weight": value}
    FusedQKVLinear._split_qkv_on_save(fused, state, prefix, None)  # rows -> wq/wk/wv.weight
    return {key.removesuffix(".weight"): tensor for key, tensor in state.items()}


def covered_hf_modules(peft_state: dict[str, torch.Tensor]) -> list[str]:
    """The HF projection names the adapter holds (PEFT's `target_modules`)."""
    return sorted({key.split(".")[-3] for key in peft_state})


def lora_config(finetune, target_modules: list[str], base_model: str | None, modules_to_save: list[str] | None = None):
    """PEFT's own LoraConfig for these adapters (written with its `save_pretrained`); with
    `modules_to_save` (a reward model's score head, trained whole) a sequence classifier's."""
    from peft import LoraConfig

    return LoraConfig(
        r=finetune.rank,
        lora_alpha=finetune.alpha,
        lora_dropout=finetune.dropout,
        target_modules=target_modules,
        bias="none",
        task_type="SEQ_CLS" if modules_to_save else "CAUSAL_LM",
        modules_to_save=modules_to_save,
        base_model_name_or_path=base_model,
    )


def merged(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling * B A, computed in float32 and returned in W's dtype (PEFT's merge)."""
    delta = lora_b.to(torch.float32) @ lora_a.to(torch.float32)
    return (weight.to(torch.float32) + scaling * delta).to(weight.dtype)
