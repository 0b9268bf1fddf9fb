"""HF <-> torchtitan state-dict keys for the Transformers backend's MoE weights (finetune=lora
leaves its adapters out of them: `finetune.lora.with_lora`).

Shapes: E experts, F expert hidden size, D model dim.
"""

from __future__ import annotations

import re
from typing import Any


def adapter_class():
    global _HFStateDictAdapter
    if _HFStateDictAdapter is None:
        _HFStateDictAdapter = _make_adapter_class()
    return _HFStateDictAdapter


_HFStateDictAdapter = None


def _make_adapter_class():
    from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import (
        HFTransformerStateDictAdapter,
        hf_to_titan_moe_state_dict,
        titan_to_hf_moe_state_dict,
    )

    class HFStateDictAdapter(HFTransformerStateDictAdapter):
        """HF names for the backend's torchtitan MoE modules, in the on-disk per-expert layout.

        The backend swaps each HF MoE block for torchtitan's MoE (routed experts as one
        (E, F, D) tensor per projection, router under `router.gate`). Its stock adapter only
        strips the `model.` prefix, so MoE weights neither load from nor save to HF names.
        Here: torchtitan's own `titan_to_hf_moe_state_dict` gives Transformers' in-memory
        names (fused `experts.gate_up_proj`), then `_split_experts` the per-expert keys
        Transformers writes and reads on disk (`experts.{e}.gate_proj.weight`, ...).
        Dense models pass through unchanged. The MoE load-balancing bias (`expert_bias_E`)
        is training state with no Qwen3-MoE counterpart: neither loaded nor exported.
        """

        def to_hf(self, state_dict):
            hf_state_dict = super().to_hf(state_dict)
            if not any(".routed_experts." in key for key in hf_state_dict):
                return hf_state_dict
            # The load-balancing bias of torchtitan's MoE (auxiliary-loss-free balancing)
            # has no Qwen3-MoE counterpart: it starts at zero and is not exported.
            hf_state_dict = {
                k: v for k, v in hf_state_dict.items() if not k.endswith(_EXPERT_BIAS)
            }
            return _split_experts(titan_to_hf_moe_state_dict(hf_state_dict))

        def from_hf(self, hf_state_dict):
            if any(_PER_EXPERT.match(key) for key in hf_state_dict):
                hf_state_dict = hf_to_titan_moe_state_dict(_fuse_experts(hf_state_dict))
            return super().from_hf(hf_state_dict)

    return HFStateDictAdapter


_EXPERT_BIAS = ".expert_bias_E"

# model.layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.weight
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def _split_experts(hf_state_dict: dict[str, Any]) -> dict[str, Any]:
    """Fused in-memory experts -> Transformers' on-disk per-expert Linear weights.

    `experts.gate_up_proj` (E, 2F, D) -> `experts.{e}.gate_proj.weight` (F, D) and
    `experts.{e}.up_proj.weight` (F, D); `experts.down_proj` (E, D, F) ->
    `experts.{e}.down_proj.weight` (D, F). Slices of (possibly sharded) tensors: DCP reads
    into them and writes them out like any other entry.
    """
    out = {}
    for key, value in hf_state_dict.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix = key.removesuffix(".gate_up_proj")
            hidden_F = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = value[e, :hidden_F, :]
                out[f"{prefix}.{e}.up_proj.weight"] = value[e, hidden_F:, :]
        elif key.endswith(".experts.down_proj"):
            prefix = key.removesuffix(".down_proj")
            for e in range(value.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = value[e]
        else:
            out[key] = value
    return out


def _fuse_experts(hf_state_dict: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `_split_experts`."""
    import torch

    groups: dict[str, dict[str, dict[int, Any]]] = {}
    out = {}
    for key, value in hf_state_dict.items():
        match = _PER_EXPERT.match(key)
        if match is None:
            out[key] = value
            continue
        by_proj = groups.setdefault(match["prefix"], {})
        by_proj.setdefault(match["proj"], {})[int(match["e"])] = value
    for prefix, by_proj in groups.items():
        experts = sorted(by_proj["gate"])
        gate_EFD = torch.stack([by_proj["gate"][e] for e in experts])
        up_EFD = torch.stack([by_proj["up"][e] for e in experts])
        out[f"{prefix}.gate_up_proj"] = torch.cat([gate_EFD, up_EFD], dim=1)
        out[f"{prefix}.down_proj"] = torch.stack([by_proj["down"][e] for e in experts])
    return out


