#!/usr/bin/env bash
# Debian's SLURM (slurm-wlm) and munge, for tests/test_slurm.py, which starts a one-node cluster
# on localhost from them. CI calls this before `make test`. It never fails the build: without
# root, apt or a package mirror it says why and exits 0, and the SLURM test then skips with the
# reason.
set -u

have_all() {
    for binary in munged slurmctld slurmd sbatch sinfo; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$binary" >/dev/null || return 1
    done
}

if have_all; then
    echo "install_slurm: slurm-wlm and munge are installed"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install_slurm: not root, cannot apt-get install slurm-wlm munge; tests/test_slurm.py will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install_slurm: no apt-get (not Debian/Ubuntu); tests/test_slurm.py will skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null; then
    echo "install_slurm: installed slurm-wlm and munge"
else
    echo "install_slurm: apt-get install slurm-wlm munge failed; tests/test_slurm.py will skip"
fi
exit 0
