"""The plan: a job -> its validated torchtitan `Trainer.Config`, checked once, and its record.

Runs in local rank 0 of the workers (`worker.plan`), or in the launcher for a dry run and
`run.show_data`. `plan` builds the config (`trainer_config`) and checks it with torchtitan's own
code and the checks torchtitan lacks (`layout`: parallel degrees; `static_shapes`: what Neuron's
compile needs; `memory`: the tensor memory per rank); `record` writes the run dir's record
(job.yaml ...). Imports config/, trainer_config/, models/, data/, devices/ and torchtitan; never
launch/, worker/ or report/.
"""
