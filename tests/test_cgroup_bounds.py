"""The sandbox's cgroup back end (``cgroups.Cgroup``) bounding small Python processes, on whichever
hierarchy this machine mounts: cgroup v1 here, cgroup v2 in the guest that ``make test-cgroup2`` boots
(Debian's kernel under qemu). No torch, no bubblewrap: each test starts a plain ``python -S`` in the
group the way the sandbox starts bubblewrap (``sandbox._ENTER``) and asks the group what it saw.

Covered: a memory hog is killed by the group's bound and the kill reads as out-of-memory; pages held in
/dev/shm or a memfd count against the same bound; a fork bomb stops at ``pids.max``; CPU is charged
with the children and held to one CPU's worth; close leaves no process (a daemonised grandchild too)
and no group; the parsing that picks the hierarchy (unit tests in tests/test_cgroup_pick.py).
"""

import os
import pathlib
import subprocess
import sys
import time

import pytest
from mlbook_tools import cgroups, sandbox
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.cgroup,
    pytest.mark.skipif(
        cgroups.cgroups_available() is not None,
        reason=f"no usable cgroup here: {cgroups.cgroups_available()}",
    ),
]
MiB = 1024**2


def _group(**limits) -> cgroups.Cgroup:
    return cgroups.Cgroup(DEFAULT_LIMITS.replace(**limits))


def _start(group: cgroups.Cgroup, code: str) -> subprocess.Popen:
    """``python -S -c code`` inside ``group`` (it enters before it becomes Python, as bubblewrap does)."""
    cmd = [sys.executable, "-S", "-c", code]
    return subprocess.Popen(
        ["/bin/sh", "-c", sandbox._ENTER, "sh", *group.procs_files(), "--", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _gone(group: cgroups.Cgroup, dirs) -> None:
    group.remove()
    assert group.pids() == set()
    assert not any(pathlib.Path(d).exists() for d in dirs), dirs


def test_a_memory_hog_is_killed_by_the_bound_and_reads_as_out_of_memory():
    g = _group(memory_bytes=64 * MiB)
    dirs = list(g.dirs.values())
    try:
        p = _start(
            g,
            "held = []\nfor i in range(512):\n    held.append(b'x' * 2**20)\nprint('held 512 MiB')",
        )
        out, _ = p.communicate(timeout=120)
        assert p.returncode == -9 and "held" not in out, (p.returncode, out)
        assert g.oom_killed()
    finally:
        _gone(g, dirs)


WRITERS = {
    "dev-shm": "f = open('/dev/shm/mlbook-cgroup-test-{pid}', 'wb')",
    "memfd": "import os\nf = os.fdopen(os.memfd_create('hog'), 'wb')",
}


@pytest.mark.parametrize("where", sorted(WRITERS))
def test_pages_in_shared_memory_and_memfd_count_against_the_bound(where):
    if where == "dev-shm" and not os.path.ismount("/dev/shm"):
        pytest.skip("/dev/shm is not a tmpfs mount here")
    g = _group(memory_bytes=64 * MiB)
    dirs = list(g.dirs.values())
    shm = pathlib.Path(f"/dev/shm/mlbook-cgroup-test-{os.getpid()}")
    code = (
        WRITERS[where].format(pid=os.getpid())
        + "\nimport sys\nfor i in range(256):\n    f.write(b'1' * 2**20)\n    f.flush()\n"
        "print('wrote 256 MiB')\nsys.stdout.flush()"
    )
    try:
        p = _start(g, code)
        out, err = p.communicate(timeout=120)
        # killed for memory, or the write refused (ENOMEM/ENOSPC): never 256 MiB held
        assert "wrote" not in out, (p.returncode, out, err)
        assert p.returncode == -9 and g.oom_killed() or "Error" in err, (p.returncode, err)
    finally:
        shm.unlink(missing_ok=True)
        _gone(g, dirs)


def test_a_fork_bomb_stops_at_pids_max_and_close_kills_every_process():
    g = _group(processes=16)
    dirs = list(g.dirs.values())
    code = (
        "import os, sys, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\nsys.stdout.flush()\ntime.sleep(600)"
    )
    try:
        p = _start(g, code)
        line = p.stdout.readline()
        assert line.strip().isdigit(), line
        assert 5 <= int(line) < 16, line  # the first process counts too
        assert 5 < len(g.pids()) <= 16
        pids = g.pids()
    finally:
        _gone(g, dirs)
    assert not any(map(cgroups.running, pids))
    p.wait(timeout=10)


def test_cpu_is_charged_with_the_children_and_held_to_one_cpu():
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the quota cannot be told from the machine")
    g = _group(cpus=1)
    dirs = list(g.dirs.values())
    spin = "import time\\nt = time.monotonic() + 3\\nwhile time.monotonic() < t: pass"
    code = (
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-S', '-c', '{spin}']) for _ in range(2)]\n"
        "[p.wait() for p in ps]"
    )
    try:
        t0 = time.monotonic()
        p = _start(g, code)
        p.communicate(timeout=120)
        wall = time.monotonic() - t0
        used = g.cpu_seconds()
        assert p.returncode == 0
        # two spinning children for 3 s: ~6 s of CPU unbounded; one CPU's worth is at most the wall time
        assert 1.0 <= used <= 1.15 * wall + 0.3, (used, wall)
    finally:
        _gone(g, dirs)


def test_close_leaves_no_process_and_no_group_even_a_daemon():
    g = _group()
    dirs = list(g.dirs.values())
    code = (
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        print(os.getpid())\n        sys.stdout.flush()\n        time.sleep(600)\n    os._exit(0)\n"
        "time.sleep(600)"
    )
    try:
        p = _start(g, code)
        daemon = int(p.stdout.readline())
        assert cgroups.running(daemon) and daemon in g.pids()
    finally:
        _gone(g, dirs)
    assert not cgroups.running(daemon)
    p.wait(timeout=10)
