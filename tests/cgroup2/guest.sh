#!/bin/bash
# Runs inside the cgroup v2 guest that tests/cgroup2/run.sh boots (Debian's kernel under qemu, this
# machine's root file system read-only, the checkout at its own path). $1: the host folder shared
# writable with the guest, where the results go. Everything the grader writes goes under /tmp.
# The lane: every test marked `cgroup` (the bounds with small Python processes, delegation to a
# non-root user, then the class of four with two workers, its time limits scaled for emulation).
set -u
OUT=$1
cd "$(dirname "$0")/../.."
export HOME=/tmp/home XDG_CACHE_HOME=/tmp/home/.cache PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
mkdir -p "$HOME"
mountpoint -q /dev/shm || { mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm; }
{
    echo "guest kernel: $(uname -r), $(nproc) CPUs"
    echo "guest /sys/fs/cgroup: $(stat -fc %T /sys/fs/cgroup), controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
} > "$OUT/guest.txt"
start=$(date +%s)
# --noconftest: these tests need none of tests/conftest.py (whose torch import and sandbox probe cost
# minutes under emulation)
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider --noconftest -v -m cgroup)
{
    .venv/bin/python -c "from mlbook_tools import cgroups; print(cgroups.describe())"
    "${PYTEST[@]}" tests/test_cgroup_bounds.py tests/test_cgroup_delegation.py && \
        MLBOOK_TIME_SCALE=${MLBOOK_TIME_SCALE:-30} "${PYTEST[@]}" tests/test_cgroup_class.py
} > "$OUT/log.txt" 2>&1
rc=$?
echo "guest: the tests took $(( $(date +%s) - start )) s" >> "$OUT/guest.txt"
echo "$rc" > "$OUT/rc"
