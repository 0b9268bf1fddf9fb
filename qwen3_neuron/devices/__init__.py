"""The device seam: the only package that knows cpu / cuda / neuron.

- `policy` (launcher side): which device, how many ranks, the workers' environment, the
  overrides and compile backend the device needs;
- `fixes` (worker side): `install(device)` before torchtitan is imported, each fix beside the
  probe that says whether this torch/torchtitan needs it;
- `torch_capabilities`: what this machine's torch can do (FSDP of spmd_types parameters, pipeline
  schedules of microbatch lists), probed, for the build, the plan's checks and the fixes;
- `matmul_peak`: the matmul benchmark a measured peak FLOP/s comes from (`report.peak_flops`).
"""
