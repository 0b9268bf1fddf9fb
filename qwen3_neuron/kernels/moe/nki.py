"""Blockwise MoE experts with the per-block matmuls in an NKI kernel (AWS Trainium only).

Activate with `override.imports=["qwen3_neuron.kernels.moe.nki.nki_experts"]` (`kernels=nki`
in this project). Same contract, parameters and block layout as `blockwise.py` -- only the
per-block SwiGLU (`_block_mlp`) differs:

- forward: the NKI kernel `_block_swiglu_kernel` (one program; a loop over blocks, each block
  loading its expert's weight tiles by the expert id read from `block_to_expert`), registered
  as the torch custom op `qwen3_neuron::nki_block_mlp` with `torch_neuronx.nki_op` and called
  through `torch_neuronx.wrap_nki`, as AWS documents for TorchNeuron ("How to work with NKI
  kernels from torch-neuronx").
- backward: the blockwise torch reference (`torch_block_mlp`), recomputed under autograd on the
  saved inputs and registered with `torch.library.register_autograd`. It is exactly the math the
  CPU tests check; a backward NKI kernel can replace it later behind the same op.
- gather/scatter of rows (the block layout) stays in torch: index_select / index_add.

Nothing from NKI or torch-neuronx is imported at module level: this module imports (and its
configs build) anywhere; `nki_experts` refuses with a clear error where NKI is missing, and
`nki_available()` tells the planner why without raising. Untested here: written against the
documented NKI API (`nki.jit`, `nki.language` load/store/matmul) and torch-neuronx API
(`nki_op`, `wrap_nki`); `tests/test_nki_hardware.py` compares it with the blockwise reference on
a Neuron device.
"""

# No `from __future__ import annotations`: nki_op reads the custom op's type annotations.

import functools
from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts

from qwen3_neuron.errors import NkiUnavailableError
from qwen3_neuron.kernels.moe.blockwise import (
    DEFAULT_BLOCK_SIZE,
    BlockwiseGroupedExperts,
    torch_block_mlp,
)

__all__ = ["NkiGroupedExperts", "NkiUnavailableError", "nki_available", "nki_experts"]

OP_NAME = "qwen3_neuron::nki_block_mlp"
TILE = 128
"""Tensor-engine tile: the contraction (partition) dimension of one matmul, and the most rows
a block may have. D and F must be multiples of it."""

NEEDS = (
    "an AWS Trainium instance (trn1/trn2) with torch-neuronx (TorchNeuron, which provides "
    "torch_neuronx.nki_op and wrap_nki) and the Neuron compiler with NKI (neuronx-cc), "
    "installed from AWS's Neuron pip index: pip install --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com torch-neuronx neuronx-cc"
)

nl = None
"""`nki.language`, set by `_load_nki()`. A module global on purpose: NKI traces a kernel's
globals, not closure variables, so the kernel below refers to `nl` by this name."""


def _load_nki():
    """Import NKI (the neuronx-cc bundled package, else the standalone `nki`); returns `nki`."""
    global nl
    try:
        import neuronxcc.nki.language as language
        from neuronxcc import nki
    except ImportError:
        import nki
        import nki.language as language
    nl = language
    return nki


def nki_available() -> tuple[bool, str]:
    """(ok, reason): whether the NKI experts can be used in this Python environment.

    Checks importability only (torch-neuronx with nki_op/wrap_nki, and NKI); whether a Neuron
    device is attached is the device layer's question.
    """
    try:
        import torch_neuronx
    except Exception as e:  # not installed, or fails to load without the Neuron runtime
        return False, f"torch-neuronx is not importable ({type(e).__name__}: {e})"
    missing = [name for name in ("nki_op", "wrap_nki") if not hasattr(torch_neuronx, name)]
    if missing:
        version = getattr(torch_neuronx, "__version__", "?")
        return False, (
            f"torch-neuronx {version} has no {', '.join(missing)} (needs TorchNeuron, the "
            "native 'neuron' device torch-neuronx that registers NKI kernels with nki_op)"
        )
    try:
        nki = _load_nki()
    except Exception as e:
        return False, f"NKI is not importable ({type(e).__name__}: {e})"
    return True, (
        f"torch-neuronx {getattr(torch_neuronx, '__version__', '?')}, NKI from {nki.__name__}"
    )


def _block_swiglu_kernel(xT_GDS, block_to_expert_G1, w1T_EDF, w3T_EDF, w2T_EFD):
    """NKI kernel: y[g] = (silu(x[g] @ w1[e].T) * (x[g] @ w3[e].T)) @ w2[e].T, e = expert of g.

    Inputs in HBM, laid out so every matmul operand is a plain tile load with the contraction
    dimension on the partitions: xT (G, D, S), w1T/w3T (E, D, F), w2T (E, F, D), bf16;
    block_to_expert (G, 1) int32. Output (G, S, D) in x's dtype; matmuls accumulate in fp32
    (PSUM). Needs S <= 128 and D, F multiples of 128.
    """
    G, D, S = xT_GDS.shape
    F = w1T_EDF.shape[2]
    P = TILE
    DN = 512 if D % 512 == 0 else (256 if D % 256 == 0 else P)  # output cols per matmul
    y_GSD = nl.ndarray((G, S, D), dtype=xT_GDS.dtype, buffer=nl.shared_hbm)

    i_p, i_s = nl.mgrid[0:P, 0:S]  # a (contraction, block rows) tile
    i_wk, i_wf = nl.mgrid[0:P, 0:P]  # a w1T/w3T tile
    i_hk, i_dn = nl.mgrid[0:P, 0:DN]  # a w2T tile
    i_ys, i_yd = nl.mgrid[0:S, 0:DN]  # an output tile

    for g in nl.affine_range(G):
        expert = nl.load(block_to_expert_G1[g])  # (1, 1): the dynamic index of the weights

        xT_tiles = nl.ndarray((D // P, nl.par_dim(P), S), dtype=xT_GDS.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(D // P):
            xT_tiles[k, i_p, i_s] = nl.load(xT_GDS[g, k * P + i_p, i_s])

        # hT = silu(w1 @ xT) * (w3 @ xT), one 128-row slice of F at a time.
        hT_tiles = nl.ndarray((F // P, nl.par_dim(P), S), dtype=xT_GDS.dtype, buffer=nl.sbuf)
        for f in nl.affine_range(F // P):
            gate = nl.zeros((P, S), dtype=nl.float32, buffer=nl.psum)
            up = nl.zeros((P, S), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(D // P):
                w1_tile = nl.load(w1T_EDF[expert[0, 0], k * P + i_wk, f * P + i_wf])
                w3_tile = nl.load(w3T_EDF[expert[0, 0], k * P + i_wk, f * P + i_wf])
                gate += nl.matmul(w1_tile, xT_tiles[k, i_p, i_s], transpose_x=True)
                up += nl.matmul(w3_tile, xT_tiles[k, i_p, i_s], transpose_x=True)
            hT_tiles[f, i_p, i_s] = nl.multiply(nl.silu(gate), up, dtype=xT_GDS.dtype)

        # y = h @ w2.T, contracting over F, DN output columns at a time.
        for d in nl.affine_range(D // DN):
            y = nl.zeros((S, DN), dtype=nl.float32, buffer=nl.psum)
            for f in nl.affine_range(F // P):
                w2_tile = nl.load(w2T_EFD[expert[0, 0], f * P + i_hk, d * DN + i_dn])
                y += nl.matmul(hT_tiles[f, i_p, i_s], w2_tile, transpose_x=True)
            nl.store(y_GSD[g, i_ys, d * DN + i_yd], value=nl.copy(y, dtype=y_GSD.dtype))
    return y_GSD


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_y_GSD):
    """Gradients from the blockwise torch reference, recomputed on the saved inputs."""
    x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD = ctx.saved_tensors
    with torch.enable_grad():
        x = x_GSD.detach().requires_grad_()
        # fp32 leaves: each expert's per-block weight gradients are summed in fp32, then cast
        # once to the weights' dtype (as torchtitan's grouped matmul accumulates).
        weights = [w.detach().float().requires_grad_() for w in (w1_EFD, w2_EDF, w3_EFD)]
        y = torch_block_mlp(x, block_to_expert_G, *weights)
        grad_x, grad_w1, grad_w2, grad_w3 = torch.autograd.grad(
            y, [x, *weights], grad_y_GSD
        )
    return (
        grad_x,
        None,
        grad_w1.to(w1_EFD.dtype),
        grad_w2.to(w2_EDF.dtype),
        grad_w3.to(w3_EFD.dtype),
    )


@functools.cache
def _nki_block_mlp_op():
    """Register the custom op once (first use) and return it."""
    import torch_neuronx

    nki = _load_nki()
    kernel = nki.jit(_block_swiglu_kernel)

    @torch_neuronx.nki_op(OP_NAME, mutates_args={})
    def nki_block_mlp(
        x_GSD: torch.Tensor,
        block_to_expert_G: torch.Tensor,
        w1_EFD: torch.Tensor,
        w2_EDF: torch.Tensor,
        w3_EFD: torch.Tensor,
    ) -> torch.Tensor:
        # Transposes in torch, so the kernel loads plain tiles (contraction on partitions).
        return torch_neuronx.wrap_nki(kernel)(
            x_GSD.transpose(1, 2).contiguous(),
            block_to_expert_G.to(torch.int32).view(-1, 1),
            w1_EFD.transpose(1, 2).contiguous(),
            w3_EFD.transpose(1, 2).contiguous(),
            w2_EDF.transpose(1, 2).contiguous(),
        )

    torch.library.register_autograd(OP_NAME, _backward, setup_context=_setup_context)
    return nki_block_mlp


class NkiGroupedExperts(BlockwiseGroupedExperts):
    """Blockwise experts whose per-block matmuls run in an NKI kernel (Trainium)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BlockwiseGroupedExperts.Config):
        def __post_init__(self) -> None:
            # slots=True dataclasses cannot use zero-argument super().
            BlockwiseGroupedExperts.Config.__post_init__(self)
            if self.block_size > TILE:
                raise ValueError(
                    f"NKI experts: block_size {self.block_size} > {TILE}, the tensor "
                    "engine's tile height; use a block_size <= 128"
                )
            for name in ("dim", "hidden_dim"):
                if getattr(self, name) % TILE:
                    raise ValueError(
                        f"NKI experts: {name}={getattr(self, name)} is not a multiple of "
                        f"{TILE}; use the blockwise experts (kernels=blockwise) instead"
                    )

    def _block_mlp(self, x_GSD, block_to_expert_G, w1_EFD, w2_EDF, w3_EFD):
        dtype = x_GSD.dtype
        return _nki_block_mlp_op()(
            x_GSD,
            block_to_expert_G,
            w1_EFD.to(dtype),
            w2_EDF.to(dtype),
            w3_EFD.to(dtype),
        )


@override(
    target=GroupedExperts.Config,
    exact=True,
    description="Blockwise MoE experts, per-block SwiGLU in an NKI kernel (Trainium).",
)
def nki_experts(
    cfg: GroupedExperts.Config, *, block_size: int = DEFAULT_BLOCK_SIZE
) -> NkiGroupedExperts.Config:
    ok, reason = nki_available()
    if not ok:
        raise NkiUnavailableError(
            f"qwen3_neuron.kernels.moe.nki.nki_experts cannot run here: {reason}. "
            f"It needs {NEEDS}. On other devices use "
            "qwen3_neuron.kernels.moe.blockwise.blockwise_experts (kernels=blockwise): the same "
            "algorithm in plain torch."
        )
    return derive(cfg, NkiGroupedExperts.Config, block_size=block_size)
