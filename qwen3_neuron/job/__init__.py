"""The one job and its plan, on both sides of torchrun.

Without torchtitan (the launcher reads these first): `job` (the composed config and the
framework's settings parsed from it once, `settings`; the paths it reads made absolute once,
`user_paths`), `trainer_keys` (torchtitan's keys, known to the launcher before any torchtitan
import) and `torchrun` (the device, ranks and torchrun command of one node).

With torchtitan: `trainer_config` (every rank's build: a settled job -> the `Trainer.Config` it
trains with; `loader_configs`: the `data` section as torchtitan's data loader configs), `plan`
(local rank 0, `worker.rank0_plan`, or the launcher for a dry run and `run.show_data`: builds the
config and checks it once, with torchtitan's own code and `checks/`) and `record` (the run dir's
job.yaml ...).

Imports models/, data/, finetune/, devices/, kernels/, eval/ and torchtitan; never launch/,
worker/ or report/.
"""
