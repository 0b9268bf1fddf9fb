"""The launcher process, after Hydra composed the config (launcher side only).

`job` is the body of launch.py: plan -> record -> torchrun -> export -> report, and the one place
that decides a launch's exit code. `record` writes the run dir, `slurm` reads a SLURM
allocation, `process` runs torchrun and forwards signals, `progress` draws the live line.
Nothing in worker/ imports this package.
"""
