"""Inside torchrun: each rank rebuilds the recorded Trainer.Config and trains (no Hydra here).

`train` mirrors `torchtitan.train.main`, after `rank0_plan` (local rank 0 of workers started before the
plan: makes and records it for the launcher); `forked_torchrun` forks a CPU job's ranks from one
process that has imported torchtitan; `metrics` writes metrics.jsonl through torchtitan's
override registry; `checkpoint_check` checks a checkpoint against its DCP `.metadata` before it
is loaded, `full_last_step` keeps the last step a full checkpoint beside an export, and
`lr_schedule` holds one learning-rate rule however a run is resumed or extended; `tensor_memory`
and `step_memory` measure the tensors a rank held (a step under MemTracker); `what_ran` records
what the built model ran; `end_of_training` ends `Trainer.train()` without its fixed wait;
`failure_record` writes why a worker stopped (failure.json); `torchtitan_cli` runs torchtitan's own
CLI with the device fixes (bare torchtitan, for benchmarks). Imports job/ (its plan: local rank 0
only), models/, finetune/, devices/, kernels/, run_dir; never launch/, report/ or Hydra.
"""
