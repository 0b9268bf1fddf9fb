"""Attention overrides: `sdpa` (CPU, and the shared SDPA-on-BlockMask math) and `neuron`."""
