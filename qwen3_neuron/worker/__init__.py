"""Inside torchrun: each rank rebuilds the recorded Trainer.Config and trains (no Hydra here).

`train` mirrors `torchtitan.train.main`, after `rank0_plan` (local rank 0 of workers started before the
plan: makes and records it for the launcher); `metrics` writes metrics.jsonl through torchtitan's
override registry; `torchtitan_cli` runs torchtitan's own CLI with the device fixes (bare
torchtitan, for benchmarks). Imports job/ (its plan: local rank 0 only), models/, finetune/,
devices/, kernels/, run_dir; never launch/, report/ or Hydra.
"""
