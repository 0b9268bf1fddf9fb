"""Composed YAML -> a validated torchtitan `Trainer.Config` (no processes started here).

`hydra_setup` prepares Hydra's composition (launcher); `settings` and `fields` read the
framework's and torchtitan's sections; `torchrun` works out the torchrun command for one node of
a job, without torchtitan, so the launcher starts it first; `build` makes the Trainer.Config (the
workers call it too, on the recorded job); `plan` checks it (`layout`: parallel degrees;
`resume`: what a resumed run may change), in local rank 0 of the workers or in the launcher, and
`record` writes it to the run dir. Imports models/, devices/, kernels/ and torchtitan; never
launch/, worker/ or report/.
"""
