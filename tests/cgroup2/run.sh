#!/bin/bash
# make test-cgroup2: the tests that depend on cgroups, on a real cgroup v2 kernel. Boots Debian's kernel
# (linux-image-amd64) under qemu with virtme-ng over this machine's root file system (read-only; the
# checkout at its own path), runs tests/cgroup2/guest.sh there, and exits with the guest's status.
# KVM where a guest boots with it (MLBOOK_VM_KVM=1), else TCG (software emulation, slower).
# What is missing to boot a guest: a clear skip here, a failure in CI (MLBOOK_CI=1 or CI=true).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV_VM=${VENV_VM:-.venv-vm}
strict() { [ "${MLBOOK_CI:-}" = 1 ] || [ "${CI:-}" = true ]; }
skip() {
    echo "test-cgroup2: SKIPPED: $*" >&2
    strict && { echo "test-cgroup2: in CI a guest that cannot boot is a failure" >&2; exit 1; }
    exit 0
}
KERNEL=$(ls /boot/vmlinuz-*-amd64 2>/dev/null | sort -V | tail -n 1)
[ -n "$KERNEL" ] || skip "no Debian kernel (apt-get install linux-image-amd64)"
command -v qemu-system-x86_64 >/dev/null || skip "no qemu (apt-get install qemu-system-x86)"
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || skip "no busybox (apt-get install busybox-static)"
if [ ! -x "$VENV_VM/bin/vng" ]; then
    python3 -m venv "$VENV_VM" && "$VENV_VM/bin/pip" install --quiet --disable-pip-version-check \
        -r requirements/vm.txt || skip "virtme-ng could not be installed (requirements/vm.txt)"
fi
export PATH="$ROOT/$VENV_VM/bin:$PATH"  # vng runs virtme-run from PATH
OUT=$(mktemp -d /tmp/mlbook-cgroup2-XXXXXX)
# the sandbox's stage (hard links to the installed packages), built here: the guest reads this machine's
# files through 9p, where a hard link cannot reach and a copy of torch takes many minutes
STAGE=$(.venv/bin/python -c "from mlbook_tools.confine import staging; print(staging())") \
    || { echo "test-cgroup2: the sandbox's stage could not be built" >&2; exit 1; }
KVM=--disable-kvm
[ "${MLBOOK_VM_KVM:-}" = 1 ] && KVM=
echo "test-cgroup2: booting $KERNEL under qemu (${KVM:+TCG, }2 CPUs, 6 GiB); the tests' output: $OUT/log.txt"
start=$(date +%s)
timeout "${MLBOOK_VM_TIMEOUT:-2400}" vng --run "$KERNEL" $KVM --memory 6G --cpus 2 --rwdir="$OUT" \
    --exec "bash $ROOT/tests/cgroup2/guest.sh $OUT $STAGE" > "$OUT/vng.txt" 2>&1
vm=$?
[ -f "$OUT/log.txt" ] && cat "$OUT/log.txt"
cat "$OUT/guest.txt" 2>/dev/null
echo "test-cgroup2: $(( $(date +%s) - start )) s in all (boot included)"
[ -f "$OUT/rc" ] || { tail -n 30 "$OUT/vng.txt"; skip "the guest did not report (vng exit $vm)"; }
exit "$(cat "$OUT/rc")"
