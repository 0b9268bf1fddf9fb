"""The device seam: the only package that knows cpu / cuda / neuron.

- `policy` (launcher side): which device, how many ranks, the workers' environment, the
  overrides and compile backend the device needs;
- `fixes` (worker side): `install(device)` before torchtitan is imported, each fix beside the
  probe that says whether this torch/torchtitan needs it.
"""
