"""Forward + backward time of the MoE experts: blockwise reference vs torchtitan's default.

torchtitan's `GroupedExperts` uses `torch._grouped_mm` (on CPU a loop of one matmul per
expert); `BlockwiseGroupedExperts` pads rows into blocks (a static number of them, the worst
case over routings) and runs batched matmuls on per-block weight copies, operands stored
contraction dimension first. Both get the same weights, rows and routing; repetitions alternate
between the two so drift (thermal, other load) hits both alike; every repetition and the
medians are printed. On a shared machine, `--threads 1` makes the two less sensitive to load.

    .venv/bin/python -m bench.moe_experts                 # from the repo root; both shapes, CPU
    .venv/bin/python -m bench.moe_experts --device cuda --reps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchtitan.models.common.moe import GroupedExperts

from qwen3_neuron.kernels.moe.block_layout import max_num_blocks
from qwen3_neuron.kernels.moe.blockwise import DEFAULT_BLOCK_SIZE, blockwise_experts
from qwen3_neuron.models.tiny import TINY_MOE

# name -> (dim, moe hidden dim, experts, top k)
SHAPES = {
    "tiny_moe": (
        TINY_MOE["hidden_size"],
        TINY_MOE["moe_intermediate_size"],
        TINY_MOE["num_experts"],
        TINY_MOE["num_experts_per_tok"],
    ),
    "debugmodel_moe": (256, 768, 64, 8),  # torchtitan qwen3 debugmodel_moe
}


def routed_rows(tokens: int, num_experts: int, top_k: int, dim: int, device, seed=0):
    """Rows grouped by expert as torchtitan's dispatcher hands them: top-k of random scores."""
    g = torch.Generator().manual_seed(seed)
    expert_ids = torch.randn(tokens, num_experts, generator=g).topk(top_k, dim=-1).indices
    counts = torch.bincount(expert_ids.flatten(), minlength=num_experts)
    x = torch.randn(tokens * top_k, dim, generator=g)
    return x.to(device), counts.to(device)


def step_seconds(module, x_RD, counts_E, grad_out_RD, device) -> float:
    x = x_RD.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    module(x, counts_E).backward(grad_out_RD)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_shape(name, dim, hidden, num_experts, top_k, args, device) -> None:
    cfg = GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts)
    torch.manual_seed(0)
    grouped = cfg.build()
    for p in grouped.parameters():
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    blockwise = blockwise_experts(cfg, block_size=args.block_size).build()
    blockwise.load_state_dict(grouped.state_dict())
    modules = {"grouped_mm": grouped.to(device), "blockwise": blockwise.to(device)}

    x, counts = routed_rows(args.tokens, num_experts, top_k, dim, device)
    grad_out = torch.randn_like(x)
    times: dict[str, list[float]] = {name: [] for name in modules}
    for rep in range(args.warmup + args.reps):
        for label, module in modules.items():
            seconds = step_seconds(module, x, counts, grad_out, device)
            if rep >= args.warmup:
                times[label].append(seconds)

    medians = {label: statistics.median(ts) for label, ts in times.items()}
    rows = x.shape[0]
    blocks = sum(-(-c // args.block_size) for c in counts.tolist())
    static_blocks = max_num_blocks(rows, num_experts, args.block_size)
    print(
        f"{name}: dim {dim}, hidden {hidden}, {num_experts} experts, top {top_k}, "
        f"{args.tokens} tokens -> {rows} routed rows, {blocks} blocks of {args.block_size} "
        f"used ({rows / (blocks * args.block_size):.0%} full), {static_blocks} computed "
        f"(static bound: {static_blocks * args.block_size / rows:.2f}x the rows)"
    )
    for label, median in medians.items():
        each = " ".join(f"{t * 1e3:.1f}" for t in times[label])
        print(f"  {label:>10}: median {median * 1e3:8.1f} ms  (fwd+bwd; reps: {each})")
    ratio = medians["blockwise"] / medians["grouped_mm"]
    print(f"  blockwise / grouped_mm = {ratio:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads")
    for name in args.shapes:
        bench_shape(name, *SHAPES[name], args, device)


if __name__ == "__main__":
    main()
