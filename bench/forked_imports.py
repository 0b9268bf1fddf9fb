"""What a CPU launch's forking process (`qwen3_neuron.worker.forked_torchrun`) saves on its imports
and its rendezvous, measured in fresh processes, interleaved, against torch's defaults.

    .venv/bin/python bench/forked_imports.py [--repeats 5]

- imports: CPU seconds of a process that imports what the ranks import (torch's torchrun agent,
  then `train.import_training` on a tiny run dir's job) with Python's cyclic collector on, as
  torch's own torchrun runs, against off while importing (then frozen), as forked_torchrun runs.
- rendezvous records: CPU seconds of the method-name lookups of the 9 records a one-node launch's
  rendezvous makes, after that import: torch's `get_method_name` (`inspect.stack()`) against
  forked_torchrun's frame read.

Each repeat is printed, then the median ratio (forked_torchrun's way / torch's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

IMPORTS = """
import gc, resource, sys
from pathlib import Path
if sys.argv[1] == "off":
    gc.disable()
import torch.distributed.run
from qwen3_neuron.worker.train import import_training
import_training(Path(sys.argv[2]))
if sys.argv[1] == "off":
    gc.collect()
    gc.freeze()
    gc.enable()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""

RECORDS = """
import sys, time
from pathlib import Path
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import get_method_name
from qwen3_neuron.worker.forked_torchrun import _calling_method_name
from qwen3_neuron.worker.train import import_training
import_training(Path(sys.argv[2]))
lookup = _calling_method_name if sys.argv[1] == "frame" else get_method_name
class Handler:
    def _record(self):
        return lookup()
    def next_rendezvous(self):
        return self._record()
started = time.process_time()
for _ in range(9):
    Handler().next_rendezvous()
print(time.process_time() - started)
"""


def run(code: str, *args: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                            check=True)  # fmt: skip
    return float(result.stdout.split()[-1])


def tiny_run_dir(folder: Path) -> Path:
    """A dry run of the default job: its job.yaml is what import_training reads."""
    run_dir = folder / "run"
    subprocess.run([sys.executable, "launch.py", f"hydra.run.dir={run_dir}", "run.dry_run=true"], cwd=REPO,
                   capture_output=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    with tempfile.TemporaryDirectory() as folder:
        run_dir = str(tiny_run_dir(Path(folder)))
        figures: dict[str, list[float]] = {"imports on": [], "imports off": [], "records stack": [], "records frame": []}
        for _ in range(repeats):  # interleaved: machine noise hits both ways alike
            for way in ("on", "off"):
                figures[f"imports {way}"].append(run(IMPORTS, way, run_dir))
            for way in ("stack", "frame"):
                figures[f"records {way}"].append(run(RECORDS, way, run_dir))
    for name, values in figures.items():
        print(f"{name:14s} " + " / ".join(f"{v:.3f}" for v in values) + f"  (median {statistics.median(values):.3f} s)")
    ratios = {
        "imports (collector off, then frozen / on)": [a / b for a, b in zip(figures["imports off"], figures["imports on"])],
        "rendezvous records (frame / inspect.stack)": [a / b for a, b in zip(figures["records frame"], figures["records stack"])],
    }
    print(json.dumps({name: round(statistics.median(values), 3) for name, values in ratios.items()}))


if __name__ == "__main__":
    main()
