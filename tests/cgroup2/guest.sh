#!/bin/bash
# Runs inside the cgroup v2 guest that tests/cgroup2/run.sh boots (Debian's kernel under qemu, this
# machine's root file system read-only, the checkout at its own path). $1: the host folder shared
# writable with the guest, where the results go. Everything the grader writes goes under /tmp.
# The lane: every test marked `cgroup` (the bounds with small Python processes, delegation to a
# non-root user; then, time limits scaled for emulation, the whole sandbox's memory bound with the
# out-of-memory verdict and its process styles, and the class of four with two workers).
set -u
OUT=$1
export MLBOOK_SANDBOX_STAGE=$2  # built on the host (tests/cgroup2/run.sh)
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
    # the lane proves v2: a guest where v2 is not the back end, or not usable, fails here (not skips)
    .venv/bin/python -c "from mlbook_tools import cgroups as c; print(c.describe()); \
assert c.hierarchy().version == 2 and c.cgroups_available() is None" && \
    "${PYTEST[@]}" tests/test_cgroup_bounds.py tests/test_cgroup_delegation.py && \
        MLBOOK_TIME_SCALE=${MLBOOK_TIME_SCALE:-60} "${PYTEST[@]}" tests/test_sandbox_bounds.py \
        tests/test_cgroup_class.py
} > "$OUT/log.txt" 2>&1
rc=$?
# nothing may skip there: every test of the lane applies on a v2 machine run as root
if [ "$rc" = 0 ] && grep -q "SKIPPED" "$OUT/log.txt"; then
    echo "a test was skipped in the cgroup v2 guest: the lane must run them all" >> "$OUT/log.txt"
    rc=1
fi
echo "guest: the tests took $(( $(date +%s) - start )) s" >> "$OUT/guest.txt"
echo "$rc" > "$OUT/rc"
