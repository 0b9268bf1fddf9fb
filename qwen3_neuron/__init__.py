"""qwen3-neuron: Hydra experiments composed into torchtitan `Trainer.Config`s, run by torchrun.

Two sides of one boundary (torchrun's):

    launcher process (Hydra)                         torchrun workers (no Hydra)
    launch/   compose, the job, start, report        worker/   local rank 0 plans; every rank trains
    report/   summary, sweep table                   planning/ the plan: checks, record (rank 0)
                                                     trainer_config/  the build (every rank)
    config/   the one job, parsed once (both sides, no torchtitan)

Both sides use `models/`, `devices/`, `kernels/` (what torchtitan builds and runs) and agree on
the files of a run dir through `run_dir.py`; `errors.py` holds the error classes;
`process_exit.py` ends a finished worker or launcher without the interpreter's teardown.
"""
