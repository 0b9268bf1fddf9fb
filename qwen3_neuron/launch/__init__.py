"""The launcher process, after Hydra composed the config (launcher side only).

`job` is the body of launch.py: torchrun -> plan (by its local rank 0) -> export -> report, and
the one place that decides a launch's exit code. `slurm` reads a SLURM allocation, `process` runs torchrun and forwards signals, `progress` draws the live line.
Nothing in worker/ imports this package.
"""
