"""What a run and a sweep report (launcher side, after torchrun).

`summary` (summary.json, what a sweep job returns), `loss_check` (first-step loss vs random
init), `peak_flops` (the peak MFU is measured against), `sweep_table` (summary.csv/.md,
loss.png), `hydra_callbacks` (writes the sweep table as jobs end), `outcome` (how each job
ended, and the launch's exit code), `mlflow_tracking` (tracking=mlflow: each run, and a sweep's
parent and children, logged from the run dirs as the jobs end).
"""
