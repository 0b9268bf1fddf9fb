"""NKI experts on a Neuron device (AWS Trainium) against the blockwise reference on CPU.

Skips, with the reason, wherever torch-neuronx/NKI or a Neuron device is missing. The NKI
kernel runs on the device; the reference (the same algorithm in plain torch, itself checked
against torchtitan in test_moe_kernels.py) runs on CPU with the same weights and inputs.
"""

import pytest
import torch
from torchtitan.models.common.moe import GroupedExperts

from qwen3_neuron.kernels.moe.blockwise import blockwise_experts, torch_block_mlp
from qwen3_neuron.kernels.moe.nki import NkiGroupedExperts, nki_available, nki_experts


def _neuron_device() -> tuple[torch.device | None, str]:
    ok, reason = nki_available()
    if not ok:
        return None, f"NKI experts unavailable: {reason}"
    try:
        torch.empty(1, device="neuron")
    except Exception as e:
        return None, f"torch-neuronx imports, but no Neuron device works ({type(e).__name__}: {e})"
    return torch.device("neuron"), ""


DEVICE, SKIP_REASON = _neuron_device()
pytestmark = pytest.mark.skipif(DEVICE is None, reason=SKIP_REASON or "n/a")

# (dim, moe hidden, experts, tokens per expert): the project's tiny MoE and torchtitan's
# debugmodel_moe expert shapes, uneven routing with empty experts.
SHAPES = {
    "tiny_moe": (256, 256, 8, [300, 0, 17, 129, 0, 64, 1, 500]),
    "debugmodel_moe": (256, 768, 64, [(e * 37) % 97 if e % 5 else 0 for e in range(64)]),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _run(module, x_RD, counts_E, grad_out_RD):
    x = x_RD.detach().clone().requires_grad_()
    out = module(x, counts_E)
    out.backward(grad_out_RD)
    grads = {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}
    return out.detach().cpu(), {n: g.cpu() for n, g in grads.items()}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_nki_experts_match_blockwise(shape):
    dim, hidden, num_experts, counts_list = shape
    cfg = GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts)
    torch.manual_seed(0)
    reference = blockwise_experts(cfg).build()
    for p in reference.parameters():
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    nki = nki_experts(cfg).build()
    assert isinstance(nki, NkiGroupedExperts)
    nki.load_state_dict(reference.state_dict())
    nki = nki.to(DEVICE)

    counts = torch.tensor(counts_list)
    x = torch.randn(sum(counts_list), dim)
    grad_out = torch.randn_like(x)
    ref_out, ref_grads = _run(reference, x, counts, grad_out)
    out, grads = _run(nki, x.to(DEVICE), counts.to(DEVICE), grad_out.to(DEVICE))

    assert rel_err(out, ref_out) < 2e-2
    for name, ref_grad in ref_grads.items():
        assert rel_err(grads[name], ref_grad) < 2e-2, name


def test_nki_block_mlp_op_alone():
    from qwen3_neuron.kernels.moe.nki import _nki_block_mlp_op

    G, S, D, F, E = 5, 128, 256, 384, 3
    torch.manual_seed(0)
    x = torch.randn(G, S, D).bfloat16()
    block_to_expert = torch.tensor([0, 2, 2, 1, 0])
    w1, w3 = (torch.randn(E, F, D).bfloat16() / D**0.5 for _ in range(2))
    w2 = torch.randn(E, D, F).bfloat16() / F**0.5
    expected = torch_block_mlp(x.float(), block_to_expert, w1.float(), w2.float(), w3.float())
    on_device = [t.to(DEVICE) for t in (x, block_to_expert, w1, w2, w3)]
    got = _nki_block_mlp_op()(*on_device).cpu()
    assert rel_err(got, expected) < 2e-2
