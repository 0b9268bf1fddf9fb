#!/usr/bin/env bash
# The GPU check on a machine with no network, from what bench/gpu_check_prepare.py wrote into DIR
# (.gpu_check): torch's wheel in parts, one call each, the other wheels with the last (DIR/plan.md).
#
#   bash bench/gpu_check_offline.sh receive DIR [--probe]   # which parts are here and sound (--probe: the image too)
#   bash bench/gpu_check_offline.sh run DIR [--budget-s S] [--device cuda|cpu]
#   bash bench/gpu_check_offline.sh probe                   # the image alone: versions, GPU, matmul peak
#
# run: joins the parts, checks every file against DIR/SHA256SUMS, installs the wheels with
# `pip install --no-index --no-deps --target SITE` (default /tmp/gpu_check_site) and runs
# bench/gpu_check.sh with PY (default python3, the image's) and SITE first on PYTHONPATH, in what is
# left of S seconds (default 540) after the install. torch's libraries find the image's NVIDIA ones
# through SITE/nvidia, a link to the image's (their RPATH: $ORIGIN/../../nvidia/...).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SITE=${SITE:-/tmp/gpu_check_site}
started=$(date +%s)
usage() { echo "usage: bash bench/gpu_check_offline.sh receive DIR [--probe] | run DIR [--budget-s S] [--device cuda|cpu] | probe" >&2; exit 2; }

probe() {  # what the check's plan depends on, read on the machine
    echo "== the image"
    "$PY" - <<'PYEOF'
import sys, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(f"python {sys.version.split()[0]} ({sys.executable}); torch {torch.__version__} ({torch.__file__}), "
      f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL "
      f"{'.'.join(map(str, torch.cuda.nccl.version())) if gpu else None}; GPU {gpu}")
PYEOF
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|tokenizers|huggingface.hub|safetensors|fsspec|typing.extensions|peft|numpy|pyarrow|pandas|pytest|nvidia-|cuda-)'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    df -h /tmp | tail -1
}

peaks() {  # the matmul peak measured here and the data-sheet one torchtitan's MFU uses
    local device=$1
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$device" <<'PYEOF'
import sys
from qwen3_neuron.report.peak_flops import datasheet_peak_flops, peak_flops
peak = peak_flops(sys.argv[1], "bfloat16", refresh=True)
sheet = datasheet_peak_flops(peak.device_name)
print(f"matmul peak {peak.describe()}; {peak.detail}")
print(f"data-sheet peak (torchtitan's MFU): " + (f"{sheet / 1e12:g} TFLOP/s, measured/sheet "
      f"{peak.flops_per_second / sheet:.3f}" if sheet else f"none for {peak.device_name}"))
PYEOF
}

# the parts listed in SHA256SUMS: which are here, and whether each is sound (exit code 1: one is
# not, 3: some are still to come)
check_parts() {
    local dir=$1 here=() missing=() bad=0 name
    while read -r _ name; do
        case "$name" in parts/*) ;; *) continue ;; esac
        if [ -f "$dir/$name" ]; then here+=("${name##*.part}"); else missing+=("${name##*.part}"); fi
    done <"$dir/SHA256SUMS"
    (cd "$dir" && grep ' parts/' SHA256SUMS | sha256sum -c --quiet --ignore-missing) || bad=1
    echo "parts here: ${here[*]:-none} (${#here[@]} of $((${#here[@]} + ${#missing[@]}))); missing: ${missing[*]:-none}"
    [ "$bad" -eq 0 ] || { echo "a part here does not match SHA256SUMS: send it again" >&2; return 1; }
    [ ${#missing[@]} -eq 0 ] || return 3
}

verb=${1:-}; shift || true
case "$verb" in
    probe)
        probe; peaks cuda; exit ;;
    receive)
        dir=${1:-}; [ -f "$dir/SHA256SUMS" ] || { echo "no SHA256SUMS in '$dir' (carry it with every call)" >&2; exit 2; }
        [ "${2:-}" = "--probe" ] && probe
        newest=$(ls -t "$dir"/parts/*.part* 2>/dev/null | head -1)
        [ -n "$newest" ] && echo "newest part $(basename "$newest") written $((started - $(stat -c %Z "$newest"))) s before this command"
        check_parts "$dir"
        [ $? -ne 1 ] || exit 1
        exit 0 ;;
    run) ;;
    *) usage ;;
esac

dir=${1:-}; shift || true
[ -f "$dir/SHA256SUMS" ] || { echo "no SHA256SUMS in '$dir' (carry it with every call)" >&2; exit 2; }
budget=540 device=cuda
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) budget=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        *) usage ;;
    esac
done
phase() { echo "== [$(($(date +%s) - started)) s] $*"; }

phase "join and check"
check_parts "$dir"
case $? in
    0) ;;
    3) echo "send the missing parts first (each a call), or run the image-only probe" >&2; exit 2 ;;
    *) exit 1 ;;
esac
joined=$(grep ' joined/' "$dir/SHA256SUMS" | awk '{print $2}')
mkdir -p "$dir/joined"
cat "$dir/parts/${joined#joined/}".part* >"$dir/$joined"
(cd "$dir" && sha256sum -c --quiet SHA256SUMS) ||
    { echo "a file above is missing or does not match SHA256SUMS (the last call carries wheels/ too)" >&2; exit 1; }
echo "$joined and $(ls "$dir"/wheels/*.whl | wc -l) wheels match SHA256SUMS"

phase "install into $SITE (no index, no dependencies)"
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$dir"/wheels/*.whl "$dir/$joined" || exit 1
rm -f "$dir/$joined"  # the parts stay: a second run joins them again
image_site=$(PYTHONPATH= "$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ -d "$image_site/nvidia" ] && ln -sfn "$image_site/nvidia" "$SITE/nvidia"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if [ "$device" = cuda ]; then
    # the image's cuDNN is a minor release behind the one torch's wheel asks for (cuDNN 9 keeps minor
    # releases compatible); torch refuses it at first use without this
    export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
    if ! "$PY" -c "import torch" 2>&1 | tail -1; then
        # the image's NCCL 2.28 lacks 8 functions torch 2.13's libtorch_cuda.so links to (suspend and
        # resume, signals, memory stats; one-GPU training calls none): torch then loads its libraries
        # with lazy binding (and RTLD_GLOBAL), so that a missing function fails only if called
        echo "torch does not load with the image's NVIDIA libraries as they are: again with TORCH_USE_RTLD_GLOBAL=1"
        export TORCH_USE_RTLD_GLOBAL=1
    fi
fi
if ! "$PY" -c "import torch, torchtitan.trainer, hydra, datasets, transformers; print(f'torch {torch.__version__} from {torch.__file__}; transformers {transformers.__version__}; CUDA available {torch.cuda.is_available()}')"; then
    echo "the installed packages do not import on this image: the image alone instead" >&2
    PYTHONPATH= probe; PYTHONPATH= peaks "$device"; exit 1
fi
peaks "$device"

left=$((budget - ($(date +%s) - started)))
phase "the GPU check in the $left s left"
PY="$PY" GPU_CHECK_BUDGET_S=$left bash bench/gpu_check.sh --device "$device"
