"""torchrun whose workers are forked from one process that has imported torchtitan (CPU jobs).

    python -m qwen3_neuron.worker.forked_torchrun <torchrun's arguments> -m qwen3_neuron.worker.train <run dir>

On CPU most of a worker's start-up is importing torch and torchtitan: about 8 CPU-seconds per
rank, every launch, on cores the ranks then share. Here that import happens once: this process
reads the run dir's job, installs the device's fixes, imports what every rank imports
(`train.import_training`), then runs torch's own torchrun agent on the same arguments (torchrun's
parser and `config_from_args`: rendezvous, logs, tee and rank filter, restarts as torchrun has
them), with the workers forked from here and each running `train.main` on the job read here
(`train.forked_rank`).

Only CPU jobs start this way (`job.torchrun`): a CUDA or Neuron runtime must not be set up before a
fork, and nothing here promises that importing their stacks does not.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import uuid
from pathlib import Path

from qwen3_neuron.process_exit import exit_without_teardown


def main(argv: list[str]) -> int:
    # Importing torch and torchtitan makes a great many objects and little garbage, which the
    # cyclic collector's passes walk again and again. They import with it off, then, after one
    # collection, are frozen out of every other, here and in the forked ranks (whose trainer turns
    # automatic collection off itself: torchtitan's `training.gc_freq`): about a tenth less CPU
    # than importing with it on (bench/forked_imports.py).
    gc.disable()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    from qwen3_neuron.worker import train

    args = get_args_parser().parse_args(argv)
    if args.standalone:  # as torchrun's own `run`: one node, a local c10d store on a free port
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    (run_dir,) = args.training_script_args
    recorded_job = train.import_training(Path(run_dir))
    gc.collect()  # what importing left unreachable, once: frozen, it would stay in every rank
    gc.freeze()
    gc.enable()
    dynamic_rendezvous.get_method_name = _calling_method_name
    # torch's fork start gives each rank an error file in the temp dir, which it never removes:
    # here that temp dir is this launch's own, removed once the ranks are done (each rank goes
    # back to the usual one: `train.forked_rank`)
    with tempfile.TemporaryDirectory(prefix="qwen3-neuron-ranks-") as launch_temp:
        tempfile.tempdir = launch_temp
        try:
            elastic_launch(config, entrypoint=train.forked_rank)(Path(run_dir), recorded_job)
        except ChildFailedError as failed:  # each rank printed its own traceback; torchrun's report ends it
            print(f"{type(failed).__name__}: {failed.format_msg()}", file=sys.stderr, flush=True)
            return 1
    return 0


def _calling_method_name(depth: int = 2) -> str:
    """The name the rendezvous's event records carry (`dynamic_rendezvous.get_method_name`'s), read
    from the frame: torch's own calls `inspect.stack()` twice per record, which reads every frame's
    source file and, for each, searches sys.modules: after the import above, 0.4 to 1.2
    CPU-seconds for the 9 records of a one-node launch (bench/forked_imports.py)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than `depth`, as torch's
        return "no_method_name"


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))
