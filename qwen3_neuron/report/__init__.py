"""What a run and a sweep report (launcher side, after torchrun).

`summary` (summary.json, what a sweep job returns), `loss_check` (first-step loss vs random
init), `peak_flops` (the peak MFU is measured against), `sweep_table` (summary.csv/.md,
loss.png), `hydra_callbacks` (writes the sweep table as jobs end), `outcome` (how each job
ended, and the launch's exit code); tracking while a job trains: `tracking` (the launcher's
writer, following metrics.jsonl), `job_tracking` (MLflow or W&B, as tracking= says), `mlflow_tracking`
(tracking=mlflow: each run, a sweep's parent and children), `wandb_tracking` (tracking=wandb),
`system_metrics` (the node's, the ranks', the run dir's disk).
"""
