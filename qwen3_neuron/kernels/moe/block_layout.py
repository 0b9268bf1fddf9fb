"""Block layout for blockwise MoE experts: the device-independent part shared by the
plain-torch reference (`blockwise.py`) and the NKI kernel (`nki.py`).

torchtitan hands the experts the routed rows already grouped by expert (`x_RD`, expert 0's
rows first, then expert 1's, ...) plus the group sizes `num_tokens_per_expert_E`. The
blockwise algorithm cuts every group into fixed-size blocks of `block_size` rows, pads each
group's last block, and then runs one dense SwiGLU per block with that block's expert weights.
This module builds the two maps that describe that layout:

- `block_to_expert_G[g]`: the expert whose weights block `g` uses.
- `token_position_to_id_P[p]`: the row of `x_RD` that sits at padded position `p`
  (block `p // block_size`, slot `p % block_size`). Padding positions hold `num_rows` (R),
  the index of a dummy zero row that callers append to `x_RD` (gather) and drop again from
  the output (scatter), so padding reads zeros and never writes a real row.

Everything is vectorised and sync-free: no `.item()`, no Python loop over tokens. The one
data-dependent size -- how many blocks the routing needs -- is replaced by a static upper bound
(`max_num_blocks`) computed from shapes alone, so the layout has fixed shapes for a given
(rows, experts, block size). That is what graph compilers (torch.compile, the Neuron compiler)
need; the price is a few all-padding blocks (at most E - 1 beyond what the routing uses), which
compute zeros and are dropped. Blocks past the ones the routing needs map to the last expert.

Shape suffix legend (torchtitan style, https://medium.com/@NoamShazeer/shape-suffixes-good-coding-style-f836e72e24fd):
  R = routed rows handed to the experts (rows at or past sum(num_tokens_per_expert_E) are
      treated as padding: nothing reads them)
  E = experts, D = model dim, F = expert hidden dim
  S = block size (row slots per block), G = number of blocks (static bound)
  P = padded positions = G * S
  N = routed (token, expert) pairs in `block_layout_from_expert_ids` (T * K)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockLayout:
    """Routed rows grouped by expert and padded into blocks of `block_size` rows."""

    block_size: int
    """S: row slots per block."""

    num_blocks: int
    """G: blocks in the layout, a static upper bound (see `max_num_blocks`)."""

    num_rows: int
    """R: rows of the routed input; also the index of the dummy zero row used by padding."""

    block_to_expert_G: torch.Tensor
    """(G,) int64: expert id of each block."""

    token_position_to_id_P: torch.Tensor
    """(G * S,) int64: routed-row index at each padded position; `num_rows` marks padding."""


def max_num_blocks(num_rows: int, num_experts: int, block_size: int) -> int:
    """The most blocks any routing of `num_rows` rows over `num_experts` experts can need.

    A group of c rows needs ceil(c / S) blocks. The sum over experts is largest when E - 1
    experts get one row each (one mostly-empty block apiece) and the last expert gets the rest.
    """
    if num_rows <= num_experts:
        return num_rows  # every row alone in its own block, at worst
    rest = num_rows - (num_experts - 1)
    return (num_experts - 1) + -(-rest // block_size)


def build_block_layout(
    num_tokens_per_expert_E: torch.Tensor, *, num_rows: int, block_size: int
) -> BlockLayout:
    """Block layout of `num_rows` rows grouped by expert, group sizes `num_tokens_per_expert_E`.

    Row `token_offset_E[e] + i` (the i-th row of expert e's group) goes to block
    `block_offset_E[e] + i // S`, slot `i % S`. Works on any device, without a host sync.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    device = num_tokens_per_expert_E.device
    num_experts = num_tokens_per_expert_E.shape[0]
    S = block_size
    G = max_num_blocks(num_rows, num_experts, S)

    tokens_E = num_tokens_per_expert_E.to(torch.int64)
    blocks_E = (tokens_E + S - 1) // S
    block_end_E = torch.cumsum(blocks_E, dim=0)  # exclusive end of each expert's blocks
    block_offset_E = block_end_E - blocks_E
    token_offset_E = torch.cumsum(tokens_E, dim=0) - tokens_E

    # Expert of each block = how many experts' block ranges end at or before it. A (G, E)
    # comparison instead of searchsorted: tiny, and every backend has it. Blocks past the used
    # ones count all E experts; clamp them onto the last expert (they hold only padding).
    block_G = torch.arange(G, device=device)
    block_to_expert_G = (block_end_E[None, :] <= block_G[:, None]).sum(dim=1)
    block_to_expert_G = block_to_expert_G.clamp(max=num_experts - 1)

    # For each padded position: its expert, and its index inside that expert's group.
    position_P = torch.arange(G * S, device=device)
    expert_P = block_to_expert_G.repeat_interleave(S)
    index_in_group_P = position_P - block_offset_E[expert_P] * S
    is_real_P = index_in_group_P < tokens_E[expert_P]
    token_position_to_id_P = torch.where(
        is_real_P, token_offset_E[expert_P] + index_in_group_P, num_rows
    )
    return BlockLayout(
        block_size=S,
        num_blocks=G,
        num_rows=num_rows,
        block_to_expert_G=block_to_expert_G,
        token_position_to_id_P=token_position_to_id_P,
    )


def block_layout_from_expert_ids(
    expert_ids_N: torch.Tensor, *, num_experts: int, block_size: int
) -> BlockLayout:
    """Block layout for rows that are *not* grouped: row n goes to expert `expert_ids_N[n]`.

    Same blocks as `build_block_layout` on the grouped rows, but positions point at the
    original (ungrouped) row ids, rows of one expert in their original order -- the form the
    NKI MoE kernels take when fed the T * K routed pairs directly.
    """
    expert_ids_N = expert_ids_N.reshape(-1).to(torch.int64)
    num_rows = expert_ids_N.shape[0]
    # scatter_add instead of bincount: bincount sizes its output from the data (a host sync).
    tokens_E = torch.zeros(num_experts, dtype=torch.int64, device=expert_ids_N.device)
    tokens_E.scatter_add_(0, expert_ids_N, torch.ones_like(expert_ids_N))
    layout = build_block_layout(tokens_E, num_rows=num_rows, block_size=block_size)

    # Grouped row j is original row grouped_to_original_N[j]; padding keeps pointing at R.
    grouped_to_original_N = torch.argsort(expert_ids_N, stable=True)
    grouped_to_original_padded = torch.cat(
        [grouped_to_original_N, grouped_to_original_N.new_full((1,), num_rows)]
    )
    return BlockLayout(
        block_size=layout.block_size,
        num_blocks=layout.num_blocks,
        num_rows=num_rows,
        block_to_expert_G=layout.block_to_expert_G,
        token_position_to_id_P=grouped_to_original_padded[layout.token_position_to_id_P],
    )
