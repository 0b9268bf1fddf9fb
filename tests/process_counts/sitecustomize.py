"""Counts, per process, the parses of the framework's settings, their checks and the torchtitan
configs built.

Python imports `sitecustomize` when it starts; a launch whose PYTHONPATH begins with this folder
(conftest's default_run) loads this in the launcher and in every worker. Each parse
(`parse_settings` applies the `model` section once), each `check_settings` and each
`Trainer.Config` built (`build_trainer_config` applies the `training` section once) and each
read of a `config.json` by the project's code (Python's audit event for every open, counted where
the first caller outside the standard library is ours; Transformers' own reads, inside
torchtitan's backend, are not the project's) appends a line naming the process to the file
$QWEN3_NEURON_TEST_COUNTS: `launcher parse`, `rank1 build`, `rank0 config.json`, ...; so does each
first import of torch and of torchtitan (`torchrun torchtitan import`: the process that forks a
CPU job's ranks; the launcher imports neither).
"""

import os
import sys

if os.environ.get("QWEN3_NEURON_TEST_COUNTS"):
    from qwen3_neuron import fields

    def count(what):
        process = (f"rank{os.environ['RANK']}" if "RANK" in os.environ
                   else "torchrun" if "torchrun" in sys.argv[0]
                   else "launcher" if sys.argv[0].endswith("launch.py") else None)  # fmt: skip
        if process is None:  # a helper a rank started (the matmul peak's measurement): not the launch's own
            return
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

    def counted_open(event, args):
        if event != "open" or not isinstance(args[0], (str, os.PathLike)):
            return
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if mode else bool(flags & (os.O_WRONLY | os.O_RDWR))
        if not os.fspath(path).endswith("/config.json") or writes:
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(STDLIB) and "site-packages" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None and f"{os.sep}qwen3_neuron{os.sep}" in frame.f_code.co_filename:
            count("config.json")

    STDLIB = os.path.dirname(os.__file__) + os.sep

    sys.addaudithook(counted_open)

    class CountedImport:
        """Asked for a top-level package only while it is not imported yet: once a process, or
        never in a rank forked from a process that imported it. Counted when its module runs (a
        lookup alone, `importlib.util.find_spec("torch")`, imports nothing)."""

        def find_spec(self, name, path=None, target=None):
            if name not in ("torch", "torchtitan"):
                return None  # the usual finders import it
            spec = PathFinder.find_spec(name, path)
            if spec is not None:
                run = spec.loader.exec_module

                def counted_run(module):
                    count(f"{name} import")
                    run(module)

                spec.loader.exec_module = counted_run
            return spec

    from importlib.machinery import PathFinder

    sys.meta_path.insert(0, CountedImport())
