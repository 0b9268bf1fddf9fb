"""Stage 5, train: one torchrun worker. `python -m qwen3_neuron.worker.train <run_dir>`.

Rebuilds the same Trainer.Config the launcher planned, from what it recorded in the run dir
(no Hydra here), applies the device's compatibility fixes, and runs torchtitan's trainer the way
`torchtitan.train.main` does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from qwen3_neuron.devices.fixes import install
from qwen3_neuron.run_dir import FAILURE_FILE, complete_steps, read_job


def main(run_dir: Path) -> None:
    job = read_job(run_dir)
    device = job["device"]["type"]
    install(device)  # before torchtitan modules copy the device type at import

    import torch
    from torchtitan.tools.logging import init_logger, logger

    from qwen3_neuron.config.plan import build_trainer_config

    init_logger()
    config = build_trainer_config(job, run_dir, device)
    trainer = None
    try:
        trainer = config.build()
        trainer.train()
    except Exception as error:  # torchtitan raises on a non-finite loss, naming the step
        _record_failure(run_dir, error, config)
        raise
    finally:
        if trainer is not None:
            trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    logger.info("Training finished")


def _record_failure(run_dir: Path, error: Exception, config) -> None:
    """Rank 0 says why the run stopped and which checkpoint is the last good one."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    folder = run_dir / config.checkpoint.folder
    steps = complete_steps(folder) if config.checkpoint.enable else []
    failure = {
        "error": f"{type(error).__name__}: {error}",
        "last_checkpoint": str(folder / f"step-{steps[-1]}") if steps else None,
    }
    (run_dir / FAILURE_FILE).write_text(json.dumps(failure, indent=2) + "\n")
    print(f"[qwen3-neuron] training failed: {failure['error']} Last good checkpoint: "
          f"{failure['last_checkpoint'] or 'none'}.", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
