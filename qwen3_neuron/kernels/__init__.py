"""Kernels behind torchtitan's override registry: each is an `@override` factory named by
`module.function` in `override.imports` (conf/kernels/*.yaml list them).

- `attention/`: SDPA on torchtitan's BlockMask (CPU has no FlexAttention backward; Neuron
  compiles no FlexAttention);
- `moe/`: blockwise MoE experts (the NKI algorithm in plain torch, the parity oracle) and the
  NKI kernel (Trainium only).
"""
