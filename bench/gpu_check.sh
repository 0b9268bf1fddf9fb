#!/usr/bin/env bash
# The GPU check, one command on a fresh checkout: set-up, the CUDA-marked tests, then launch.py vs
# bare torchtitan (tokens/s, MFU, ratios) for native Qwen3 0.6B (eager and compile.enable), the HF
# backend on the same shape and MoE debugmodel_moe with kernels=none|blockwise (bench/gpu_check.py).
#
#   bash bench/gpu_check.sh                 # CUDA, real shapes, about 6 minutes on one H200
#   bash bench/gpu_check.sh --device cpu    # tiny shapes on one CPU rank: proves the script end to end
#
# On a machine with no network (the device tool's H200): bench/gpu_check_prepare.py here, then the
# calls its plan lists (bench/gpu_check_offline.sh there), which end in this script.
#
# Output: printed, and in $OUT (default outputs/gpu_check/<time>): gpu_check.log (all of it),
# results.md (the table), results.json, runs.tar.gz (each run's log, summary and configs).
# Environment: PY=<python> uses an interpreter that is already set up instead of `make setup`
# (.venv); TORCH_PIP_ARGS is passed to pip for torch (`make setup`); GPU_CHECK_BUDGET_S (default
# 480 on CUDA) skips the rows that would not fit in it, counted from this script's start.
set -uo pipefail
started=$(date +%s)
cd "$(dirname "$0")/.."
device=${GPU_CHECK_DEVICE:-cuda}
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2; shift 2 ;;
        --device=*) device=${1#*=}; shift ;;
        *) echo "usage: bash bench/gpu_check.sh [--device cuda|cpu]" >&2; exit 2 ;;
    esac
done
out=${OUT:-outputs/gpu_check/$(date -u +%Y%m%d-%H%M%S)-$device}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee -a "$out/gpu_check.log") 2>&1
phase() { echo "== [$(($(date +%s) - started)) s] $*"; }
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

phase "set-up ($device)"
if [ -n "${PY:-}" ]; then
    "$PY" -m qwen3_neuron.assets >/dev/null || exit 1
else
    make setup ${TORCH_PIP_ARGS:+TORCH_PIP_ARGS="$TORCH_PIP_ARGS"} >/dev/null || exit 1
    PY=.venv/bin/python
fi
"$PY" - "$device" <<'PYEOF' || exit 1
import sys, torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, GPUs {torch.cuda.device_count()}")
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("no usable CUDA device for this torch: on a GPU machine `make setup` needs the CUDA wheel "
             "(PyPI's torch==2.13.0 for Linux is one; else TORCH_PIP_ARGS='--index-url <PyTorch's cuXXX index>')")
PYEOF

phase "CUDA-marked tests (pytest -m cuda)"
# only the files that hold CUDA tests: collecting the others imports what a GPU machine's bare image
# need not have (lm-eval, Optuna, submitit)
"$PY" -m pytest -q -rs -p no:cacheprovider -m cuda $(grep -l 'pytest.mark.cuda' tests/test_*.py)
tests_rc=$?
[ "$tests_rc" -eq 5 ] && tests_rc=0  # none collected is not a failure

phase "launch.py vs bare torchtitan"
budget=${GPU_CHECK_BUDGET_S:-$([ "$device" = cuda ] && echo 480 || echo 0)}
runs=$out/runs
[ -n "${OUT:-}" ] && runs=$(mktemp -d)  # the device tool returns few files from $OUT: runs.tar.gz holds the logs
"$PY" bench/gpu_check.py --device "$device" --out "$out" --runs "$runs" --budget-s "$budget" --started "$started"
bench_rc=$?
phase "done: tests exit $tests_rc, bench exit $bench_rc; output in $out"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
