"""The entrypoint: Hydra composes conf/ + the command line, the job does the rest.

    python launch.py model=native training.steps=50
    python launch.py experiment=cpu_qwen3_tiny_native
    python launch.py -m optimizer.lr=1e-3,3e-4
    python launch.py run.dry_run=true

Hydra runs in this process only; torchrun's workers rebuild the config from the run dir
(qwen3_neuron.worker.train).
"""

import sys

import hydra
from omegaconf import DictConfig

from qwen3_neuron.config.hydra_setup import experiment_without_plus, register

_composed = False  # Hydra got as far as a job


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    global _composed
    _composed = True
    # imported once Hydra has composed: the job imports torchtitan (seconds), which a
    # misspelled group option or a command-line typo need not wait for
    from qwen3_neuron.launch.job import run_job

    return run_job(cfg)


if __name__ == "__main__":
    register()  # torchtitan's sections and the project's resolvers, before Hydra composes
    sys.argv = experiment_without_plus(sys.argv)
    try:
        main()
    except SystemExit as e:
        # Hydra reports what it cannot compose (model=nativ, a bad override) and exits 1:
        # a config mistake, exit code 2 as for every other
        raise SystemExit(2 if e.code == 1 and not _composed else e.code) from None
    from qwen3_neuron.launch.job import exit_code
    from qwen3_neuron.process_exit import exit_without_teardown

    exit_without_teardown(exit_code())
