"""The entrypoint: Hydra composes conf/ + the command line (`python launch.py training.steps=50`,
`-m optimizer.lr=1e-3,3e-4`, `run.dry_run=true`) in this process only; the job does the rest
(torchrun's workers rebuild its config from the run dir). Exits with the jobs' outcome."""

import sys

import hydra
from omegaconf import DictConfig

from qwen3_neuron.launch.hydra_setup import experiment_without_plus, register
from qwen3_neuron.process_exit import exit_without_teardown
from qwen3_neuron.report.outcome import SweepEnded, launch_exit_code


def main() -> int:
    outcomes = []  # one per job: run here, or read back when a sweep's jobs ran elsewhere (submitit)

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def run(cfg: DictConfig) -> float | None:
        from qwen3_neuron.launch.run_job import run_job  # once composed: a misspelled group option need not wait

        outcomes.append(run_job(cfg))
        return outcomes[-1].objective

    try:
        run()
    except SweepEnded as ended:
        outcomes.extend(ended.outcomes)
    except SystemExit as e:  # Hydra could not compose (model=nativ): a config mistake, exit 2 as every other
        return 2 if e.code == 1 and not outcomes else e.code or 0
    return launch_exit_code(outcomes)


if __name__ == "__main__":
    register()  # torchtitan's sections and the project's resolvers, before Hydra composes
    sys.argv = experiment_without_plus(sys.argv)
    exit_without_teardown(main())
