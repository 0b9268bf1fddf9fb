"""The entrypoint: Hydra composes conf/ + the command line, the job does the rest.

    python launch.py model=native training.steps=50
    python launch.py experiment=cpu_qwen3_tiny_native
    python launch.py -m optimizer.lr=1e-3,3e-4
    python launch.py run.dry_run=true

Hydra runs in this process only; torchrun's workers rebuild the config from the run dir
(qwen3_neuron.worker.train). The launch exits with its jobs' outcome.
"""

import sys

import hydra
from omegaconf import DictConfig

from qwen3_neuron.launch.hydra_setup import experiment_without_plus, register
from qwen3_neuron.process_exit import exit_without_teardown


def main() -> int:
    outcomes = []  # one per job this process ran (a sweep's launcher may run them elsewhere)

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def run(cfg: DictConfig) -> float | None:
        from qwen3_neuron.launch.job import run_job  # once composed: a misspelled group option need not wait

        outcomes.append(run_job(cfg))
        return outcomes[-1].objective

    try:
        run()
    except SystemExit as e:  # Hydra could not compose (model=nativ): a config mistake, exit 2 as every other
        return 2 if e.code == 1 and not outcomes else e.code or 0
    from qwen3_neuron.launch.job import launch_exit_code  # after run(): Hydra's --help needs none of it
    return launch_exit_code(outcomes)


if __name__ == "__main__":
    register()  # torchtitan's sections and the project's resolvers, before Hydra composes
    sys.argv = experiment_without_plus(sys.argv)
    exit_without_teardown(main())
