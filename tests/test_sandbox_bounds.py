"""The sandbox bounded as a whole: seccomp filter, file descriptors, mount table, cgroup, deadlines.

The seccomp program itself is tested directly in tests/test_seccomp.py (unit). Here real
sandboxes (conftest skips them where bubblewrap cannot start): only the
runner's pipes are open inside, the repository's path is nowhere in the mount table, memory held in
tmpfs, /dev/shm or memfd counts against the sandbox's limit, threads are capped, shell lines,
``%%bash`` and a small ``multiprocessing.Pool`` run in the working folder while a fork bomb stops at
pids.max and dies with the sandbox (without a cgroup: refused, with a message that says so), a
malformed reply frame written by code in the sandbox is "runner died" with everything killed, and
the hard deadline holds.
"""

import json
import os
import time

import pytest
from mlbook_tools import cgroups, driver, sandbox
from mlbook_tools.config import layout
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS

pytestmark = pytest.mark.sandbox  # conftest skips these where bubblewrap cannot start

ROOT = layout().root
needs_cgroup = pytest.mark.skipif(
    sandbox.cgroups_available() is not None, reason="no usable cgroup here"
)


# MLBOOK_TIME_SCALE: the cgroup v2 guest (make test-cgroup2) runs under emulation, many times slower
SCALE = float(os.environ.get("MLBOOK_TIME_SCALE", "1"))


def _runner(**kw):
    return sandbox.Runner(start_timeout=60 * SCALE, **kw)


def _run(r, source, timeout=60):
    timeout *= SCALE
    reply, _ = r.request({"op": "exec", "cell": "t", "source": source}, timeout=timeout)
    assert reply["ok"], reply
    reply, _ = r.request(
        {"op": "call", "target": "probe", "method": None, "args": [], "kwargs": {}}, timeout=timeout
    )
    assert reply["ok"], reply
    return reply["result"]


def test_only_the_runner_pipes_are_open_and_the_repository_is_not_mounted():
    r = _runner()
    try:
        got = _run(
            r,
            (
                "import os, json\n\ndef probe():\n    fds = []\n    for fd in os.listdir('/proc/self/fd'):\n"
                "        try:\n            fds.append([int(fd), os.readlink(f'/proc/self/fd/{fd}')])\n"
                "        except OSError:\n            pass  # the descriptor listdir itself used\n"
                "    config = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])\n"
                "    return json.dumps([fds, config['fds'], open('/proc/self/mountinfo').read()])\n"
            ),
        )
        fds, runner_fds, mountinfo = json.loads(got)
        assert sorted(fd for fd, _ in fds) == sorted([0, 1, 2, *runner_fds]), fds
        assert all(target.startswith(("pipe:", "/dev/null")) for _, target in fds), fds
        assert str(ROOT) not in mountinfo and "/sandbox/site" in mountinfo
    finally:
        r.close()


@needs_cgroup
@pytest.mark.cgroup
def test_memory_in_tmpfs_shm_and_memfd_counts_against_the_sandbox():
    r = _runner(limits=DEFAULT_LIMITS.replace(memory_bytes=400 * 1024**2))
    try:
        got = _run(
            r,
            (
                "import os\n\ndef probe():\n    out = {}\n    for path in ('/dev/shm/x', '/tmp/x'):\n        try:\n"
                "            with open(path, 'wb') as f:\n                for _ in range(300):\n                    f.write(b'1' * 2**20)\n"
                "            out[path] = 'wrote 300 MiB'\n        except OSError as err:\n            out[path] = err.errno\n"
                "        os.remove(path)\n    return out\n"
            ),
        )
        got = dict(got["dict"])  # ENOSPC (size-capped tmpfs) or EFBIG (RLIMIT_FSIZE): never 300 MiB
        assert got["/dev/shm/x"] == 28 and got["/tmp/x"] in (27, 28), got
        r.request(
            {
                "op": "exec",
                "cell": "m",
                "source": (
                    "import os\nfds = [os.memfd_create('hog') for _ in range(25)]  # 25 x 40 MiB: each under RLIMIT_FSIZE\n"
                    "for fd in fds:\n    for _ in range(40):\n        os.write(fd, b'1' * 2**20)\n"
                ),
            },
            timeout=60 * SCALE,
        )
        pytest.fail("1000 MiB in a memfd fitted in a 400 MiB sandbox")
    except sandbox.RunnerDied as err:
        assert isinstance(err, sandbox.MemoryLimit), repr(err)
    finally:
        r.close()
    assert r.proc.poll() is not None and not r.cgroup.dirs


@needs_cgroup
def test_threads_are_capped_and_close_leaves_no_cgroup():
    r = _runner()
    dirs = dict(r.cgroup.dirs)
    quota = "cpu.max" if r.cgroup.version == 2 else "cpu.cfs_quota_us"  # "Q 100000" / "Q"
    assert (dirs["cpu"] / quota).read_text().split()[0] == str(int(100000 * DEFAULT_LIMITS.cpus))
    try:
        got = _run(
            r,
            (
                "import threading, time\n\ndef probe():\n    n = 0\n    try:\n        for _ in range(500):\n"
                "            threading.Thread(target=time.sleep, args=(20,), daemon=True).start()\n            n += 1\n"
                "    except RuntimeError:\n        pass\n    return n\n"
            ),
        )
        assert 0 < got < DEFAULT_LIMITS.processes
    finally:
        r.close()
    assert not any(d.exists() for d in dirs.values())


def test_no_nested_user_namespace_so_no_cgroup_file_system_can_be_mounted():
    """A new user namespace would let code in the sandbox mount cgroup2 and, under a delegated non-root
    grader (whose uid owns the sandbox's group), raise its own bounds: bubblewrap's --disable-userns."""
    r = _runner()
    try:
        got = _run(
            r,
            (
                "import ctypes, os\n\ndef probe():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                "    rc = libc.unshare(0x10000000)  # CLONE_NEWUSER\n"
                "    return [rc, ctypes.get_errno(), os.path.exists('/sys/fs/cgroup/cgroup.procs')]\n"
            ),
        )
        assert got[0] == -1 and got[1] in (1, 28), got  # EPERM or ENOSPC
        assert got[2] is False, got
    finally:
        r.close()


def _exec(r, source, timeout=60):
    timeout *= SCALE
    reply, _ = r.request({"op": "exec", "cell": "t", "source": source}, timeout=timeout)
    return reply


@needs_cgroup
@pytest.mark.cgroup
def test_processes_run_in_the_working_folder_within_the_cgroup_and_die_with_it():
    """``!mkdir`` + ``%%writefile`` + import, a ``%%bash`` helper, a small Pool, children's CPU charged;
    a fork bomb stops at pids.max, and ``kill`` (what close and the watchdog call) leaves no process."""
    r = _runner()
    try:
        assert _exec(r, "!mkdir pkg\n!echo 'X = 41' > pkg/values.py\n") == {"ok": True}
        assert _exec(r, "%%writefile pkg/__init__.py\nfrom .values import X\n") == {"ok": True}
        bash = "%%bash\nprintf 'def f(x):\\n    return x + 1\\n' > helper_b.py\n"
        assert _exec(r, bash) == {"ok": True}
        pool = (
            "import multiprocessing, os\n\n\ndef sq(x):\n    return x * x\n\n\n"
            "with multiprocessing.Pool(2) as p:\n    squares = p.map(sq, range(6))\n"
        )
        assert _exec(r, pool) == {"ok": True}
        got = _run(
            r,
            "import pkg, helper_b\n\ndef probe():\n"
            "    return [pkg.X, helper_b.f(1), sum(squares), pkg.__file__, os.getcwd()]\n",
        )
        assert got == [41, 2, 55, "/tmp/pkg/__init__.py", "/tmp"]
        cpu0 = r.cgroup.cpu_seconds()
        burn = "import subprocess, sys\nsubprocess.run([sys.executable, '-S', '-c', 'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass'])\n"
        assert _exec(r, burn) == {"ok": True}
        assert r.cgroup.cpu_seconds() - cpu0 >= 0.9  # a child's CPU time is the sandbox's
        # a child that does not end (fork, or raw clone through ctypes) comes back to the runner: it
        # never answers a request (the runner's pipe has one writer), so the next requests still work
        stray = "import ctypes, os\nparent = os.getpid()\nos.fork()\nctypes.CDLL(None).syscall(56, 17, 0, 0, 0, 0)\n"
        assert _exec(r, stray) == {"ok": True}
        for _ in range(3):
            assert _run(r, "def probe():\n    return os.getpid() == parent\n") is True
        bomb = (
            "import os, time\nkids = 0\ntry:\n    while kids < 1000:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n        kids += 1\nexcept OSError:\n    pass\n"
            "\ndef probe():\n    return kids\n"
        )
        kids = _run(r, bomb)
        assert 0 < kids < DEFAULT_LIMITS.processes
        pids = r.cgroup.pids()
        assert len(pids) > kids
        r.kill()
        assert not r.cgroup.pids()
        assert not [p for p in pids if cgroups.running(p)]
    finally:
        r.close()


def test_without_a_cgroup_no_process_starts_and_the_error_says_why(monkeypatch):
    monkeypatch.setenv("MLBOOK_NO_CGROUP", "1")
    sandbox.cgroups_available.cache_clear()
    try:
        r = _runner()
    finally:
        sandbox.cgroups_available.cache_clear()
    try:
        assert r.cgroup is None
        assert _exec(r, "!mkdir pkg\nimport os\nmade = os.path.isdir('pkg')\n") == {"ok": True}
        reply = _exec(r, "import multiprocessing\nmultiprocessing.Pool(2)\n")
        assert not reply["ok"] and reply["error"].startswith("BlockingIOError"), reply
        assert "refuses new processes" in reply["error"] and "multiprocessing" in reply["error"]
        assert _run(r, "def probe():\n    return made\n") is False
    finally:
        r.close()
    assert "!mkdir pkg: not run while grading" in r.output()


MALFORMED_FROM_INSIDE = {
    "infinity": b'{"ok": true, "result": Infinity}',
    "deep_nesting": b'{"ok": true, "result": ' + b"[" * 50000 + b"]" * 50000 + b"}",
    "wrong_types": b'{"ok": "yes", "result": {"tensor": "0"}}',
    "forged_after": b'{"ok": true, "result": 1, "after": [{"tensor": 0}]}',
}


@pytest.mark.parametrize("name", sorted(MALFORMED_FROM_INSIDE))
def test_a_malformed_frame_from_the_sandbox_is_runner_died_and_kills_it(name):
    r = _runner()
    head = MALFORMED_FROM_INSIDE[name]
    source = (
        "import os, json, struct, time\n\ndef probe():\n"
        "    fd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])['fds'][1]\n"
        f"    head = {head!r}\n    body = struct.pack('<Q', len(head)) + head\n"
        "    os.write(fd, struct.pack('<Q', len(body)) + body)\n    time.sleep(60)\n"
    )
    r.request({"op": "exec", "cell": "t", "source": source}, timeout=60)
    with pytest.raises(sandbox.RunnerDied, match="protocol"):
        r.request(
            {"op": "call", "target": "probe", "method": None, "args": [], "kwargs": {}}, timeout=30
        )
    assert r.dead and r.proc.poll() is not None
    assert r.cgroup is None or not r.cgroup.dirs


def test_the_watchdog_kills_the_sandbox_at_its_hard_deadline():
    r = _runner(kill_at=time.monotonic() + 30)
    r.kill_at = time.monotonic() + 2
    t0 = time.monotonic()
    with pytest.raises(sandbox.RunnerDied):
        r.request({"op": "exec", "cell": "t", "source": "while True:\n    pass\n"}, timeout=100)
    assert time.monotonic() - t0 < 4
    r.close()


def test_no_combination_of_cells_and_attribute_reads_exceeds_the_budget():
    """120 cells of 0.95 s each (each got max(left, 1 s) before) and a slow property read in a loop."""
    cells = [(f"c{i}", "import time\ntime.sleep(0.95)", False) for i in range(120)]
    plan = driver.Plan(cells, [], [], {})
    t0 = time.monotonic()
    with pytest.raises(sandbox.RunnerDied):
        driver.Session(plan, trusted=False, deadline=t0 + 6)
    # 6 s charged (sleep is charged); the wall-clock bound is the backstop (a busy machine's start-up)
    assert time.monotonic() - t0 < 6 * DEFAULT_LIMITS.wall_factor + DEFAULT_LIMITS.grace_seconds + 1
    slow = "import time\n\nclass Slow:\n    @property\n    def beta(self):\n        time.sleep(0.5)\n        return 1.0\n\ndef make():\n    return Slow()\n"
    s = driver.Session(
        driver.Plan([("slow", slow, False)], [], [], {}), trusted=False, deadline=float("inf")
    )
    try:
        obj = driver.Remote(s, "make", name="make")()
        # the budget is on the session's clock (seconds charged to the sandbox), the bound on the wall
        s.deadline, t1 = s.clock() + 4, time.monotonic() + 4
        with pytest.raises(AssertionError, match="time budget"):
            for _ in range(800):
                obj.beta  # noqa: B018 - each read is a request
        assert time.monotonic() - t1 < 1
    finally:
        s.close()
