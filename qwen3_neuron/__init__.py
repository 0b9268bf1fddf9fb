"""qwen3-neuron: Hydra experiments composed into torchtitan `Trainer.Config`s, run by torchrun.

Two sides of one boundary (torchrun's):

    launcher process (Hydra)                         torchrun workers (no Hydra)
    launch/   compose, the job, start, report        worker/   local rank 0 plans; every rank trains
    report/   summary, sweep table
    job/      the one job, parsed once, and its plan (checks, record) and build (both sides)

Besides `launch/`, `report/`, `job/` and `worker/` (above), both sides use `models/`, `data/`,
`finetune/` (LoRA), `trainers/` (one torchtitan Trainer per objective), `generation/` (GRPO's
rollouts: KV caches, tools), `rewards/` (GRPO's rewards), `devices/`, `kernels/` (what torchtitan
builds and runs), `hf_io/` (HF exports, the
chat command), `eval/` (lm-eval on an export) and `assets/` (the tiny generated assets), and
agree on the files of a run dir through `run_dir.py`; `errors.py` holds the error classes,
`fields.py` checks YAML values onto config dataclasses, `handoff.py` passes the plan between the
launcher and local rank 0, `hf_backend.py` names torchtitan's Transformers backend;
`process_exit.py` ends a finished worker or launcher without the interpreter's teardown and
`parent_death.py` ends a process with its parent; `chat.py` is `python -m qwen3_neuron.chat`.
Imports point down only (DEVELOPING.md, "How it works").
"""
