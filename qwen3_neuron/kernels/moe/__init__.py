"""MoE expert overrides: `block_layout` (tokens -> fixed-size blocks), `blockwise` (plain torch),
`nki` (the same per-block math as an NKI kernel)."""
