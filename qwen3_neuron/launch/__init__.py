"""The launcher process, after Hydra composed the config (launcher side only).

`hydra_setup` prepares Hydra's composition (before it, in launch.py); `run_job` is the body of
launch.py: the job parsed, torchrun started, the plan (by its local rank 0) awaited, the
report, and each job's outcome (its exit code) returned; `run_lock` holds the run dir for one
launch at a time; `resume` reads the run dir a resume continues; `slurm` reads a SLURM
allocation, `process` runs torchrun and forwards signals, `progress` draws the live line,
`console` keeps the screen to what a user acts on, `workers_failed` says why the workers stopped.
Nothing in worker/ imports this package.
"""
