"""qwen3-neuron: Hydra experiments composed into torchtitan `Trainer.Config`s, run by torchrun.

Two sides of one boundary (torchrun's):

    launcher process (Hydra)                         torchrun workers (no Hydra)
    launch/   the job: plan, record, start, report   worker/   rebuild the config, train
    config/   compose -> validated Trainer.Config
    report/   summary, sweep table

Both sides use `models/`, `devices/`, `kernels/` (what torchtitan builds and runs) and agree on
the files of a run dir through `run_dir.py`; `errors.py` holds the error classes;
`process_exit.py` ends a finished worker or launcher without the interpreter's teardown.
"""
