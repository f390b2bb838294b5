"""The hub instructor's cgroups (``cgroups.delegate``): root gives a user groups of their own, the user's
first process enters them (``ENTER_THEN_RUN``, as the hub's spawner starts the instructor's server), and
from then on that user, not root, makes and bounds a sandbox's groups under them as ``Cgroup`` does.
Without it a non-root grader has no cgroup: student code that starts a process is refused."""

import os
import pathlib
import shutil
import subprocess

import pytest
from mlbook_tools import cgroups

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("runuser") is None or cgroups.cgroups_available(),
        reason="needs root, runuser and writable cgroup v1",
    ),
]
USER = "nobody"
# what Cgroup does in each group, as the user: a child group, its bounds, the process moved into it
MAKE_CHILD = """
for procs in "$@"; do
    d=$(dirname "$procs")/child
    mkdir "$d" || exit 3
    for f in memory.limit_in_bytes:100000000 pids.max:8 cpu.cfs_quota_us:100000; do
        [ -e "$d/${f%%:*}" ] && { echo "${f#*:}" > "$d/${f%%:*}" || exit 4; }
    done
    echo $$ > "$d/cgroup.procs" || exit 5
done
cat /proc/self/cgroup
"""


def _as_user(groups: list[str], procs: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", USER, "--", "/bin/sh", "-c", cgroups.ENTER_THEN_RUN, "sh", *groups, "--"]
        + ["/", "/bin/sh", "-c", MAKE_CHILD, "sh", *procs],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_delegated_user_makes_and_enters_groups_of_its_own():
    procs = cgroups.delegate(USER)
    try:
        assert len(procs) >= 3, procs  # memory, pids, cpu(+cpuacct)
        run = _as_user(procs, procs)
        assert run.returncode == 0, (run.returncode, run.stderr)
        lines = {
            c: path
            for _, names, path in (r.split(":", 2) for r in run.stdout.splitlines())
            for c in names.split(",")
        }
        for c in cgroups.CONTROLLERS:
            assert lines[c].endswith(f"/mlbook-grader-{USER}/child"), (c, run.stdout)
    finally:
        for p in procs:
            for d in (pathlib.Path(p).parent / "child", pathlib.Path(p).parent):
                if d.is_dir():
                    d.rmdir()


def test_without_delegation_the_user_makes_no_group():
    """The control: the same user, not moved into groups of its own, cannot make one (the hub's
    instructor before delegation)."""
    mine = [str(cgroups.own_cgroup(c) / "cgroup.procs") for c in ("memory", "pids")]
    run = _as_user([], mine)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
