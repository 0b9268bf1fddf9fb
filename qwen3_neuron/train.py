"""Stage 5, train: one torchrun worker. `python -m qwen3_neuron.train <run_dir>`.

Rebuilds the same Trainer.Config the launcher planned, from what it recorded in the run dir
(no Hydra here), applies the device's compatibility fixes, and runs torchtitan's trainer the way
`torchtitan.train.main` does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from qwen3_neuron import devices
from qwen3_neuron.record import read_job


def main(run_dir: Path) -> None:
    job = read_job(run_dir)
    device = job["device"]["type"]
    devices.install(device)  # before torchtitan modules copy the device type at import

    import torch
    from torchtitan.tools.logging import init_logger, logger

    from qwen3_neuron.plan import build_trainer_config

    init_logger()
    config = build_trainer_config(job, run_dir, device)
    trainer = None
    try:
        trainer = config.build()
        trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    logger.info("Training finished")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
