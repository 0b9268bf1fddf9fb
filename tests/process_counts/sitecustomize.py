"""Counts, per process, the parses of the framework's settings and the torchtitan configs built.

Python imports `sitecustomize` when it starts; a launch whose PYTHONPATH begins with this folder
(conftest's default_run) loads this in the launcher and in every worker. Each parse
(`parse_settings` applies the `model` section once) and each `Trainer.Config` built
(`build_trainer_config` applies the `training` section once) appends a line naming the process
to the file $QWEN3_NEURON_TEST_COUNTS: `launcher parse`, `rank1 build`, ...
"""

import os

if os.environ.get("QWEN3_NEURON_TEST_COUNTS"):
    from qwen3_neuron import fields

    applied = fields.apply_fields

    def counted(node, values, path, *args, **kwargs):
        counts = "parse" if path == "model" else "build" if path == "" and "training" in values else None
        if counts:
            process = f"rank{os.environ['RANK']}" if "RANK" in os.environ else "launcher"
            with open(os.environ["QWEN3_NEURON_TEST_COUNTS"], "a") as file:
                file.write(f"{process} {counts}\n")
        return applied(node, values, path, *args, **kwargs)

    fields.apply_fields = counted
