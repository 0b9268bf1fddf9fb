"""Counts, per process, the parses of the framework's settings, their checks and the torchtitan
configs built.

Python imports `sitecustomize` when it starts; a launch whose PYTHONPATH begins with this folder
(conftest's default_run) loads this in the launcher and in every worker. Each parse
(`parse_settings` applies the `model` section once), each `check_settings` and each
`Trainer.Config` built (`build_trainer_config` applies the `training` section once) appends a
line naming the process to the file $QWEN3_NEURON_TEST_COUNTS: `launcher parse`, `rank1 build`, ...
"""

import os

if os.environ.get("QWEN3_NEURON_TEST_COUNTS"):
    from qwen3_neuron import fields

    def count(what):
        process = f"rank{os.environ['RANK']}" if "RANK" in os.environ else "launcher"
        with open(os.environ["QWEN3_NEURON_TEST_COUNTS"], "a") as file:
            file.write(f"{process} {what}\n")

    applied = fields.apply_fields

    def counted_apply(node, values, path, *args, **kwargs):
        what = "parse" if path == "model" else "build" if path == "" and "training" in values else None
        if what:
            count(what)
        return applied(node, values, path, *args, **kwargs)

    fields.apply_fields = counted_apply  # before the modules that take it by name import
    from qwen3_neuron.job import settings

    checked = settings.check_settings

    def counted_check(*args, **kwargs):
        count("check")
        return checked(*args, **kwargs)

    settings.check_settings = counted_check  # before job.job takes it by name
