"""Inside torchrun: each rank rebuilds the recorded Trainer.Config and trains (no Hydra here).

`train` mirrors `torchtitan.train.main`; `metrics` writes metrics.jsonl through torchtitan's
override registry; `torchtitan_cli` runs torchtitan's own CLI with the device fixes (bare
torchtitan, for benchmarks). Imports config/ (build only), models/, devices/, kernels/, run_dir;
never launch/ or Hydra.
"""
