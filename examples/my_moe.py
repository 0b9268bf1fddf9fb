"""A worked example of your own MoE experts kernel: a loop over experts, in plain torch.

Run it on CPU with

    python launch.py model=moe kernels.overrides='[examples.my_moe.my_experts]'

`kernels.overrides` adds your `module.function` factories to those of the `kernels` option
(default `kernels=none`: none). Two overrides that claim the same node -- here every MoE layer's
experts -- are an error in torchtitan, so `kernels=blockwise` together with this one is refused
(use `kernels=none`, or narrow one of them with `fqns`). Underneath, the framework hands
torchtitan `override.imports=["examples.my_moe.my_experts"]`; torchtitan imports this module and
swaps the config before the model is built.

How to write one, in four steps (each is in the code below):

1. Pick the node. An MoE layer's routed experts are the config
   `layers.<i>.moe.routed_experts.inner_experts`, a `GroupedExperts.Config`. Its module gets

       forward(x_RD, num_tokens_per_expert_E) -> out_RD

   `x_RD` holds the routed rows grouped by expert (expert 0's first), `num_tokens_per_expert_E`
   the group sizes (their sum may be < R: the rest is padding, output zero). Each row gets its
   expert's SwiGLU `w2 @ (silu(w1 @ x) * (w3 @ x))`. Routing scores are not applied here (the
   token dispatcher applies them when it combines the rows back into tokens). torchtitan runs
   the matmuls in bf16 and returns the input's dtype; match that to be a drop-in replacement.

2. Subclass the module (`GroupedExperts`), not just `nn.Module`: you inherit its parameters
   `w1_EFD` (E, F, D), `w2_EDF` (E, D, F), `w3_EFD` (E, F, D) with their init and sharding, so
   state dicts, checkpoints and the HF export are unchanged, and code that checks
   `isinstance(m, GroupedExperts)` keeps working. Override `forward` only. With expert or
   tensor parallelism the weights arrive as DTensors: take `.to_local()` first (under expert
   parallelism a rank holds some experts, and `num_tokens_per_expert_E` counts its own).

3. Nest a `Config` that subclasses `GroupedExperts.Config`, with
   `@dataclass(kw_only=True, slots=True)` (torchtitan enforces both) and a docstring under each
   new field. `Config.build()` then builds your class.

4. Register a factory with `@override(target=GroupedExperts.Config, ...)`. It receives each
   matched config and returns yours; `derive(cfg, MyExperts.Config, **new_fields)` copies the
   shared fields (dim, hidden_dim, num_experts, param_init, sharding_config). `exact=True`
   leaves subclasses alone (gpt-oss experts have biases, other kernels their own contract);
   `fqns=["layers.1.*"]` would limit it to some layers. Keyword arguments of the factory can be
   set per run: `override.imports=[("examples.my_moe.my_experts", {"compute_dtype": "float32"})]`.

Then check it against torchtitan's own module with the same weights (see
`tests/test_moe_kernels.py::test_example_user_kernel_matches_torchtitan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts


class LoopExperts(GroupedExperts):
    """Routed experts as a plain loop: one SwiGLU per expert on its slice of rows."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        compute_dtype: str = "bfloat16"
        """dtype of the matmuls, a torch dtype name. torchtitan computes in bfloat16;
        "float32" gives an exact reference (slower)."""

        def __post_init__(self) -> None:
            if not isinstance(getattr(torch, self.compute_dtype, None), torch.dtype):
                raise ValueError(f"compute_dtype {self.compute_dtype!r} is not a torch dtype")

    def __init__(self, config: Config):
        super().__init__(config)
        self.compute_dtype = getattr(torch, config.compute_dtype)

    def forward(
        self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor
    ) -> torch.Tensor:
        # The loop needs the group sizes on the host: one device sync (free on CPU).
        counts = num_tokens_per_expert_E.tolist()
        # expert or tensor parallelism: this rank's shard of the weights (its experts' rows)
        weights = [w.to_local() if isinstance(w, DTensor) else w for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD)]
        x = x_RD.to(self.compute_dtype)
        out_RD = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            rows = slice(start, start + count)
            start += count
            if count == 0:
                continue
            w1_FD, w2_DF, w3_FD = (w[e].to(self.compute_dtype) for w in weights)
            h = F.silu(x[rows] @ w1_FD.T) * (x[rows] @ w3_FD.T)
            out_RD[rows] = h @ w2_DF.T
        return out_RD.type_as(x_RD)


@override(
    target=GroupedExperts.Config,
    exact=True,
    description="Example: MoE experts as a loop over experts.",
)
def my_experts(
    cfg: GroupedExperts.Config, *, compute_dtype: str = "bfloat16"
) -> LoopExperts.Config:
    return derive(cfg, LoopExperts.Config, compute_dtype=compute_dtype)
