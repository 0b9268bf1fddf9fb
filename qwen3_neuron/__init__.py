"""qwen3-neuron: Hydra experiments composed into torchtitan `Trainer.Config`s, run by torchrun.

Two sides of one boundary (torchrun's):

    launcher process (Hydra)                         torchrun workers (no Hydra)
    launch/   compose, the job, start, report        worker/   local rank 0 plans; every rank trains
    report/   summary, sweep table
    job/      the one job, parsed once, and its plan (checks, record) and build (both sides)

Both sides use `models/`, `data/`, `finetune/`, `devices/`, `kernels/` (what torchtitan builds
and runs) and agree on the files of a run dir through `run_dir.py`; `errors.py` holds the error
classes, `fields.py` checks YAML values onto config dataclasses; `process_exit.py` ends a
finished worker or launcher without the interpreter's teardown. Imports point down only
(DEVELOPING.md, "How it works").
"""
