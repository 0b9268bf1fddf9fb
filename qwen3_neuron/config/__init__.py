"""Composed YAML -> a validated torchtitan `Trainer.Config` (launcher side, no processes).

`hydra_setup` prepares Hydra's composition; `settings` and `fields` read the framework's and
torchtitan's sections; `build` makes the Trainer.Config (the workers call it too, on the recorded
job); `plan` checks it (`layout`: parallel degrees; `resume`: what a resumed run may change) and
works out the torchrun command (`torchrun`: its arguments for one node of a job). Imports
models/, devices/, kernels/ and torchtitan; never launch/, worker/ or report/.
"""
