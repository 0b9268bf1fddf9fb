"""MoE experts kernels: block layout, blockwise reference, NKI factory, the example kernel.

The oracle is torchtitan's own `GroupedExperts` built from the same config with the same
weights. torchtitan runs the expert matmuls in bf16 whatever the input dtype, so module-level
comparisons use a bf16 tolerance; the exact checks run the same functions in fp32 / fp64.
"""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torchtitan.config import OverrideConfig, apply_overrides
from torchtitan.models.common.moe import GroupedExperts, MoE
from torchtitan.models.qwen3 import model_registry

from examples.my_moe import LoopExperts, my_experts
from qwen3_neuron.kernels.moe.block_layout import (
    block_layout_from_expert_ids,
    build_block_layout,
    max_num_blocks,
)
from qwen3_neuron.kernels.moe.blockwise import (
    BlockwiseGroupedExperts,
    blockwise_experts,
    blockwise_swiglu,
)
from qwen3_neuron.kernels.moe.nki import (
    NkiGroupedExperts,
    NkiUnavailableError,
    nki_available,
)
from qwen3_neuron.models.tiny import TINY_MOE

BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
NKI = "qwen3_neuron.kernels.moe.nki.nki_experts"
MY_EXPERTS = "examples.my_moe.my_experts"

# (num_tokens_per_expert, block_size, extra padding rows past the counted ones)
ROUTINGS = {
    "uneven_with_empty_experts": ([5, 0, 17, 1, 0, 9], 4, 0),
    "block_larger_than_any_group": ([3, 7, 0, 2, 6, 1], 32, 0),
    "exact_multiples": ([8, 16, 0, 8, 8, 24], 8, 0),
    "rows_past_counts_are_padding": ([4, 0, 9, 3, 0, 6], 4, 5),
    "all_rows_one_expert": ([0, 0, 21, 0, 0, 0], 8, 0),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def loop_reference(x_RD, num_tokens_per_expert_E, w1_EFD, w2_EDF, w3_EFD):
    """Independent reference in x's dtype: one SwiGLU per expert on its slice of rows."""
    out_RD = torch.zeros_like(x_RD)
    start = 0
    for e, count in enumerate(num_tokens_per_expert_E.tolist()):
        rows = slice(start, start + count)
        start += count
        h = F.silu(x_RD[rows] @ w1_EFD[e].T) * (x_RD[rows] @ w3_EFD[e].T)
        out_RD[rows] = h @ w2_EDF[e].T
    return out_RD


def random_weights(E, F_, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(E, F_, D, generator=g, dtype=dtype) / D**0.5
    w2 = torch.randn(E, D, F_, generator=g, dtype=dtype) / F_**0.5
    w3 = torch.randn(E, F_, D, generator=g, dtype=dtype) / D**0.5
    return w1, w2, w3


def experts_pair(config_factory, dim=32, hidden=48, num_experts=6, dtype=torch.float32):
    """torchtitan's GroupedExperts and an overridden one, with identical weights."""
    cfg = GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts)
    reference = cfg.build()
    w1, w2, w3 = random_weights(num_experts, hidden, dim)
    with torch.no_grad():
        reference.w1_EFD.copy_(w1)
        reference.w2_EDF.copy_(w2)
        reference.w3_EFD.copy_(w3)
    reference = reference.to(dtype)
    candidate = config_factory(cfg).build().to(dtype)
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate


def forward_backward(module, x_RD, counts_E, grad_out_RD):
    x = x_RD.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = module(x, counts_E)
    out.backward(grad_out_RD)
    grads = {"x": x.grad}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return out.detach(), grads


# ---------------------------------------------------------------- block layout


def test_block_layout_hand_example():
    # Expert 0: rows 0-2; expert 1: none; expert 2: rows 3-7; expert 3: row 8. Blocks of 4.
    layout = build_block_layout(torch.tensor([3, 0, 5, 1]), num_rows=9, block_size=4)
    pad = 9  # the dummy zero row
    assert layout.num_blocks == 5  # bound: 3 single-row experts + ceil(6 / 4)
    assert torch.equal(layout.block_to_expert_G, torch.tensor([0, 2, 2, 3, 3]))
    expected = torch.tensor(
        [
            [0, 1, 2, pad],  # expert 0
            [3, 4, 5, 6],  # expert 2, first block
            [7, pad, pad, pad],  # expert 2, second block
            [8, pad, pad, pad],  # expert 3
            [pad, pad, pad, pad],  # spare block (static bound), all padding
        ]
    )
    assert torch.equal(layout.token_position_to_id_P.view(5, 4), expected)


def test_block_layout_rows_past_counts_are_never_read():
    layout = build_block_layout(torch.tensor([2, 3]), num_rows=8, block_size=2)
    ids = layout.token_position_to_id_P
    assert sorted(ids[ids != 8].tolist()) == [0, 1, 2, 3, 4]  # rows 5-7: padding
    assert torch.equal(layout.block_to_expert_G[:3], torch.tensor([0, 1, 1]))


def test_block_layout_from_expert_ids_hand_example():
    # Ungrouped rows: expert 0 <- rows 1, 4; expert 2 <- rows 0, 2, 5; expert 3 <- row 3.
    layout = block_layout_from_expert_ids(
        torch.tensor([2, 0, 2, 3, 0, 2]), num_experts=4, block_size=2
    )
    pad = 6
    assert torch.equal(layout.block_to_expert_G, torch.tensor([0, 2, 2, 3, 3]))
    expected = torch.tensor([[1, 4], [0, 2], [5, pad], [3, pad], [pad, pad]])
    assert torch.equal(layout.token_position_to_id_P.view(5, 2), expected)


def test_max_num_blocks_is_the_tight_bound():
    for E, S, R in itertools.product(range(1, 5), range(1, 5), range(0, 9)):
        worst = max(
            sum(-(-c // S) for c in counts)
            for counts in itertools.product(range(R + 1), repeat=E)
            if sum(counts) == R
        )
        assert max_num_blocks(R, E, S) == worst, (R, E, S)


def test_layout_and_blockwise_need_no_host_sync():
    # Meta tensors have no data: any .item()/.tolist()/data-dependent shape would raise.
    counts = torch.empty(6, dtype=torch.int64, device="meta")
    layout = build_block_layout(counts, num_rows=50, block_size=8)
    assert layout.token_position_to_id_P.shape == (layout.num_blocks * 8,)
    w1, w2, w3 = (w.to("meta") for w in random_weights(6, 16, 8))
    out = blockwise_swiglu(torch.empty(50, 8, device="meta"), counts, w1, w2, w3, block_size=8)
    assert out.shape == (50, 8)


@pytest.mark.numerics
def test_blockwise_compiles_as_one_graph():
    # fullgraph=True fails on any graph break (a host sync, data-dependent Python control).
    compiled = torch.compile(
        lambda *args: blockwise_swiglu(*args, block_size=4), fullgraph=True, backend="aot_eager"
    )
    counts = torch.tensor([3, 0, 5, 1])
    x = torch.randn(11, 8, requires_grad=True)
    weights = [w.requires_grad_() for w in random_weights(4, 6, 8)]
    out = compiled(x, counts, *weights)
    out.sum().backward()
    torch.testing.assert_close(out, blockwise_swiglu(x, counts, *weights, block_size=4))


# ---------------------------------------------------------------- blockwise: exact math


def test_blockwise_gradcheck_float64():
    counts = torch.tensor([3, 0, 5, 1])
    x = torch.randn(11, 6, dtype=torch.float64, requires_grad=True)  # 2 padding rows
    weights = [w.requires_grad_() for w in random_weights(4, 5, 6, dtype=torch.float64)]

    def fn(x, w1, w2, w3):
        return blockwise_swiglu(x, counts, w1, w2, w3, block_size=2)

    assert torch.autograd.gradcheck(fn, (x, *weights))


@pytest.mark.numerics
@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=ROUTINGS.keys())
def test_blockwise_matches_loop_reference_fp32(routing):
    counts_list, block_size, extra = routing
    counts = torch.tensor(counts_list)
    R = sum(counts_list) + extra
    x = torch.randn(R, 32, requires_grad=True)
    weights = [w.requires_grad_() for w in random_weights(len(counts_list), 48, 32)]
    grad_out = torch.randn(R, 32)

    results = []
    for fn in (
        lambda *a: blockwise_swiglu(*a, block_size=block_size),
        loop_reference,
    ):
        out = fn(x, counts, *weights)
        grads = torch.autograd.grad(out, [x, *weights], grad_out)
        results.append((out, grads))
    (out, grads), (ref_out, ref_grads) = results
    # float32 both, sums in another order: a sum of n terms (n <= 48: the hidden dim, or an expert's rows
    # in its weights' gradients) rounds by at most n x 2^-24 = 2.9e-6 of the magnitudes summed, under 1e-5
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for g, ref_g, name in zip(grads, ref_grads, ["x", "w1", "w2", "w3"]):
        torch.testing.assert_close(g, ref_g, rtol=1e-5, atol=1e-5, msg=name)
    assert out[sum(counts_list) :].abs().sum().item() == 0  # padding rows: zero


# ---------------------------------------------------------------- blockwise vs torchtitan


@pytest.mark.numerics
@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=ROUTINGS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_blockwise_module_matches_torchtitan(routing, dtype):
    counts_list, block_size, extra = routing
    counts = torch.tensor(counts_list)
    reference, blockwise = experts_pair(
        lambda cfg: blockwise_experts(cfg, block_size=block_size), dtype=dtype
    )
    assert isinstance(blockwise, BlockwiseGroupedExperts)
    R = sum(counts_list) + extra
    x = torch.randn(R, 32, dtype=dtype)
    grad_out = torch.randn(R, 32, dtype=dtype)

    out, grads = forward_backward(blockwise, x, counts, grad_out)
    ref_out, ref_grads = forward_backward(reference, x, counts, grad_out)

    assert out.dtype == ref_out.dtype == dtype
    # Rows past the counted ones: torchtitan's grouped matmul leaves them uninitialised
    # (garbage, even NaN); the blockwise experts return zeros, and send them no gradient.
    counted = sum(counts_list)
    assert out[counted:].abs().sum().item() == 0
    assert grads["x"][counted:].abs().sum().item() == 0
    out, ref_out = out[:counted], ref_out[:counted]
    grads["x"], ref_grads["x"] = grads["x"][:counted], ref_grads["x"][:counted]

    # bf16: each side rounds each matmul's output (unit roundoff u = 2^-8, an error uniform in +-u): two
    # such roundings differ by sqrt(2/3) u = 3.2e-3 in norm, the SwiGLU's 3 in a row by sqrt(3) x that =
    # 5.5e-3; 1e-2 (2.6 u) bounds it, and rel_err below 1e-2 holds for every test of this file (float32:
    # only sums in another order, 48 x 2^-24 at most)
    assert rel_err(out, ref_out) < 1e-2
    assert set(grads) == {"x", "w1_EFD", "w2_EDF", "w3_EFD"}
    for name, ref_grad in ref_grads.items():
        assert grads[name].dtype == ref_grad.dtype, name
        assert rel_err(grads[name], ref_grad) < 1e-2, name
    # Experts without rows get exactly zero gradient.
    empty = [e for e, c in enumerate(counts_list) if c == 0]
    for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
        assert grads[name][empty].abs().sum().item() == 0, name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_blockwise_module_matches_torchtitan_on_cuda():
    counts_list, block_size, extra = ROUTINGS["uneven_with_empty_experts"]
    reference, blockwise = experts_pair(lambda cfg: blockwise_experts(cfg, block_size=block_size))
    reference, blockwise = reference.cuda(), blockwise.cuda()
    counts = torch.tensor(counts_list, device="cuda")
    x = torch.randn(sum(counts_list), 32, device="cuda")
    grad_out = torch.randn_like(x)
    out, grads = forward_backward(blockwise, x, counts, grad_out)
    ref_out, ref_grads = forward_backward(reference, x, counts, grad_out)
    assert rel_err(out, ref_out) < 1e-2
    for name, ref_grad in ref_grads.items():
        assert rel_err(grads[name], ref_grad) < 1e-2, name


# ---------------------------------------------------------------- a whole MoE layer


def tiny_moe_model_config():
    """torchtitan's qwen3 debugmodel_moe, shrunk to the project's TINY_MOE experts."""
    config = model_registry("debugmodel_moe").model
    config.layers = config.layers[: TINY_MOE["num_hidden_layers"]]
    E, K = TINY_MOE["num_experts"], TINY_MOE["num_experts_per_tok"]
    F_ = TINY_MOE["moe_intermediate_size"]
    for layer in config.layers:
        moe = layer.moe
        moe.num_experts = E
        moe.router.num_experts = E
        moe.router.gate.out_features = E
        moe.router.top_k = K
        moe.routed_experts.inner_experts.num_experts = E
        moe.routed_experts.inner_experts.hidden_dim = F_
        moe.routed_experts.token_dispatcher.num_experts = E
        moe.routed_experts.token_dispatcher.top_k = K
    return config


@pytest.mark.numerics
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_moe_layer_parity_including_router_gradients(top_k):
    stock = tiny_moe_model_config()
    for layer in stock.layers:
        layer.moe.router.top_k = top_k
        layer.moe.routed_experts.token_dispatcher.top_k = top_k
    overridden = copy.deepcopy(stock)
    apply_overrides(OverrideConfig(imports=[(BLOCKWISE, {"block_size": 16})]), overridden)
    moe_configs = [stock.layers[0].moe, overridden.layers[0].moe]
    assert isinstance(moe_configs[1].routed_experts.inner_experts, BlockwiseGroupedExperts.Config)

    torch.manual_seed(0)
    reference: MoE = moe_configs[0].build()
    for p in reference.parameters():
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    candidate: MoE = moe_configs[1].build()
    candidate.load_state_dict(reference.state_dict())
    assert isinstance(candidate.routed_experts.inner_experts, BlockwiseGroupedExperts)

    x = torch.randn(2, 48, stock.dim)
    grad_out = torch.randn(2, 48, stock.dim)
    results = []
    for module in (reference, candidate):
        xx = x.clone().requires_grad_()
        out = module(xx)
        out.backward(grad_out)
        grads = {"x": xx.grad, **{n: p.grad for n, p in module.named_parameters()}}
        results.append((out.detach(), grads))
    (out, grads), (ref_out, ref_grads) = results[1], results[0]
    assert rel_err(out, ref_out) < 1e-2
    assert "router.gate.weight" in ref_grads  # the routing scores' gradient path
    assert grads.keys() == ref_grads.keys()
    if top_k == 1:
        # Qwen3's router normalises its top-k scores (route_norm): with one expert per token the
        # score is s / s = 1 exactly, so the router's true gradient is zero and both layers only
        # hold float rounding (~1e-5 against ~1e3 for the experts'), whose relative error means
        # nothing. Both must be negligible; the other gradients are compared as for top_k > 1.
        assert reference.router.route_norm
        scores, _, _ = reference.router(x)
        assert torch.equal(scores, torch.ones_like(scores))
        largest = max(g.norm().item() for name, g in ref_grads.items() if name != "router.gate.weight")
        for router_grad in (ref_grads.pop("router.gate.weight"), grads.pop("router.gate.weight")):
            assert router_grad.norm().item() < 1e-6 * largest
    # bf16 (u = 2^-8): a gradient here passes the router's top-k scaling and up to 5 rounded matmuls
    # (3 forward, 2 backward), sqrt(5) x sqrt(2/3) u = 7.1e-3 apart in norm: 2e-2 bounds it
    for name, ref_grad in ref_grads.items():
        assert rel_err(grads[name], ref_grad) < 2e-2, name


# ---------------------------------------------------------------- override registry


def test_override_swaps_every_experts_node_and_logs_it():
    config = tiny_moe_model_config()
    lines = apply_overrides(OverrideConfig(imports=[BLOCKWISE]), config)
    fqns = [f"layers.{i}.moe.routed_experts.inner_experts" for i in range(len(config.layers))]
    assert lines == [
        f"[Override] {BLOCKWISE}: {fqn} GroupedExperts.Config -> BlockwiseGroupedExperts.Config"
        for fqn in fqns
    ]
    for layer in config.layers:
        experts = layer.moe.routed_experts.inner_experts
        assert type(experts) is BlockwiseGroupedExperts.Config
        assert experts.block_size == 128
        assert (experts.dim, experts.hidden_dim, experts.num_experts) == (
            config.dim,
            TINY_MOE["moe_intermediate_size"],
            TINY_MOE["num_experts"],
        )
        assert experts.param_init is not None  # torchtitan's init is kept


def test_override_kwargs_reach_the_factory():
    config = tiny_moe_model_config()
    lines = apply_overrides(OverrideConfig(imports=[(BLOCKWISE, {"block_size": 32})]), config)
    assert all(line.endswith("with block_size=32") for line in lines)
    assert {layer.moe.routed_experts.inner_experts.block_size for layer in config.layers} == {32}


def test_overrides_keep_the_state_dict():
    stock = tiny_moe_model_config()
    overridden = copy.deepcopy(stock)
    apply_overrides(OverrideConfig(imports=[BLOCKWISE]), overridden)
    with torch.device("meta"):
        stock_sd = stock.build().state_dict()
        overridden_sd = overridden.build().state_dict()
    assert {k: v.shape for k, v in stock_sd.items()} == {
        k: v.shape for k, v in overridden_sd.items()
    }
    assert "layers.0.moe.routed_experts.inner_experts.w1_EFD" in stock_sd


def test_two_experts_overrides_conflict():
    with pytest.raises(ValueError, match="both claim node"):
        apply_overrides(OverrideConfig(imports=[BLOCKWISE, MY_EXPERTS]), tiny_moe_model_config())


# ---------------------------------------------------------------- NKI (refusal off Trainium)


@pytest.mark.skipif(nki_available()[0], reason="NKI is available here")
def test_nki_factory_refuses_clearly_without_nki():
    ok, reason = nki_available()
    assert not ok and "torch-neuronx" in reason
    with pytest.raises(NkiUnavailableError) as excinfo:
        apply_overrides(OverrideConfig(imports=[NKI]), tiny_moe_model_config())
    message = str(excinfo.value)
    for needed in ("Trainium", "torch-neuronx", "neuronx-cc", "pip.repos.neuron.amazonaws.com"):
        assert needed in message
    assert "blockwise" in message  # and what to use instead


def test_nki_config_checks_the_tile_constraints():
    NkiGroupedExperts.Config(dim=256, hidden_dim=768, num_experts=8)  # fine
    with pytest.raises(ValueError, match="block_size"):
        NkiGroupedExperts.Config(dim=256, hidden_dim=768, num_experts=8, block_size=256)
    with pytest.raises(ValueError, match="hidden_dim"):
        NkiGroupedExperts.Config(dim=256, hidden_dim=100, num_experts=8)


# ---------------------------------------------------------------- the example user kernel


@pytest.mark.numerics
def test_example_user_kernel_matches_torchtitan():
    counts_list, _, _ = ROUTINGS["uneven_with_empty_experts"]
    counts = torch.tensor(counts_list)
    reference, mine = experts_pair(my_experts)
    assert isinstance(mine, LoopExperts)
    x = torch.randn(sum(counts_list), 32)
    grad_out = torch.randn_like(x)
    out, grads = forward_backward(mine, x, counts, grad_out)
    ref_out, ref_grads = forward_backward(reference, x, counts, grad_out)
    assert rel_err(out, ref_out) < 1e-2
    for name, ref_grad in ref_grads.items():
        assert rel_err(grads[name], ref_grad) < 1e-2, name

    # In fp32 it is the exact reference.
    cfg = GroupedExperts.Config(dim=32, hidden_dim=48, num_experts=6)
    exact = my_experts(cfg, compute_dtype="float32").build()
    exact.load_state_dict(reference.state_dict())
    expected = loop_reference(x, counts, reference.w1_EFD, reference.w2_EDF, reference.w3_EFD)
    torch.testing.assert_close(exact(x, counts), expected)


def test_example_user_kernel_through_the_registry():
    config = tiny_moe_model_config()
    lines = apply_overrides(OverrideConfig(imports=[MY_EXPERTS]), config)
    assert len(lines) == len(config.layers)
    assert all(
        type(layer.moe.routed_experts.inner_experts) is LoopExperts.Config
        for layer in config.layers
    )


@pytest.mark.numerics
@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_moe_layer_step_repeats_bit_for_bit_at_one_and_two_threads(threads):
    """Same weights, same batch: the same output and gradients every time (routing, torchtitan's
    token dispatch and bf16 grouped matmuls included), at the thread counts the CPU runs use."""
    config = tiny_moe_model_config()
    torch.manual_seed(0)
    moe: MoE = config.layers[0].moe.build()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    x, grad_out = torch.randn(2, 256, config.dim), torch.randn(2, 256, config.dim)

    def step() -> list[torch.Tensor]:
        moe.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        out = moe(xx)
        out.backward(grad_out)
        return [out.detach(), xx.grad, *(p.grad for p in moe.parameters())]

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        first = step()
        for _ in range(2):
            assert all(torch.equal(a, b) for a, b in zip(first, step()))
    finally:
        torch.set_num_threads(before)
