"""The hub instructor's cgroups (``cgroups.delegate``): root gives a user groups of their own, the user's
first process enters them while still root (``cgroups.entering``, the hub spawner's preexec_fn), and
from then on that user, not root, makes, bounds and enters a sandbox's group under them with the
grader's own ``Cgroup``. Without it a non-root grader has no cgroup: student code that starts a process
is refused. On cgroup v1 (here) and v2 (``make test-cgroup2``'s guest) alike."""

import os
import pathlib
import shutil
import subprocess

import pytest
from mlbook_tools import cgroups

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.cgroup,
    pytest.mark.skipif(
        os.geteuid() != 0
        or shutil.which("runuser") is None
        or shutil.which("python3", path="/usr/bin:/bin") is None
        or cgroups.cgroups_available(),
        reason="needs root, runuser, /usr/bin/python3 and a writable cgroup hierarchy",
    ),
]
USER = "nobody"
# what the grader does as the user: a sandbox's group with its bounds, a process moved into it
MAKE_SANDBOX = """
import pathlib, subprocess, sys
from mlbook_tools import cgroups
from mlbook_tools.limits import DEFAULT
try:
    g = cgroups.Cgroup(DEFAULT.replace(processes=8))
except OSError as err:
    print(err)
    sys.exit(3)
enter = 'for f in "$@"; do echo $$ > "$f" || exit 5; done; cat /proc/self/cgroup'
run = subprocess.run(["/bin/sh", "-c", enter, "sh", *g.procs_files()], capture_output=True, text=True)
pids = pathlib.Path(g.dirs["pids"], "pids.max").read_text().strip()
g.remove()
print(run.returncode, pids)
print(run.stdout)
"""


# the user runs the system's Python over the checkout's tooling (the venv's interpreter may sit in a
# folder only root can enter); cgroups.py needs nothing beyond the standard library
PYTHON = shutil.which("python3", path="/usr/bin:/bin")
TOOLS = pathlib.Path(cgroups.__file__).parent.parent


def _as_user(groups: list[str]) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(TOOLS),
    }
    # as the hub's spawner starts the instructor's server: it enters the groups while still root
    # (cgroups.entering, its preexec_fn), then becomes the user, who starts in the folder given
    start = ["/bin/sh", "-c", cgroups.ENTER_THEN_RUN, "sh", "--", "/"]
    return subprocess.run(
        [shutil.which("runuser"), "-u", USER, "--", *start, PYTHON, "-c", MAKE_SANDBOX],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=cgroups.entering(groups),
    )


def _remove_delegated(procs: list[str]) -> None:
    for p in procs:
        mine = pathlib.Path(p).parent
        mine = mine.parent if mine.name == cgroups.LEAF else mine
        for d in sorted(mine.glob("**/"), key=lambda d: -len(d.parts)):  # the leaf, then the group
            if d.is_dir():
                d.rmdir()


def test_a_delegated_user_makes_bounds_and_enters_a_sandbox_group_at_every_start():
    """Twice, as the hub starts the instructor's server again after a stop: on v2 the first grader has
    enabled controllers in the delegated group by then, which no process may enter any more."""
    procs = cgroups.delegate(USER)
    try:
        v1 = cgroups.hierarchy().version == 1
        # v1: a group per controller (memory, pids, cpu, cpuacct); v2: the delegated group's leaf
        assert len(procs) >= 3 if v1 else len(procs) == 1, procs
        for start in (1, 2):
            assert cgroups.delegate(USER) == procs
            run = _as_user(procs)
            assert run.returncode == 0, (start, run.returncode, run.stdout, run.stderr)
            status, rest = run.stdout.split("\n", 1)
            assert status == "0 8", run.stdout  # entered, and pids.max is the user's bound
            lines = [line.split(":", 2) for line in rest.split()]
            paths = {
                c: path for _, names, path in lines for c in (names.split(",") if names else [""])
            }
            for c in cgroups.CONTROLLERS if v1 else [""]:
                assert f"/mlbook-grader-{USER}/mlbook-sandbox-" in paths[c], (c, rest)
            assert "could not enter" not in run.stderr, run.stderr
    finally:
        _remove_delegated(procs)


def test_without_delegation_the_user_makes_no_group():
    """The control: the same user, not moved into groups of its own, cannot make one (the hub's
    instructor before delegation)."""
    run = _as_user([])
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)


NAMESPACED = """
import pathlib, subprocess, sys
from mlbook_tools import cgroups
from mlbook_tools.limits import DEFAULT
assert cgroups.parse_own(open("/proc/self/cgroup").read())[""] == "/", "not in a cgroup namespace"
g = cgroups.Cgroup(DEFAULT.replace(processes=8))
enter = 'echo $$ > "$1" && cat /proc/self/cgroup'
run = subprocess.run(["/bin/sh", "-c", enter, "sh", *g.procs_files()], capture_output=True, text=True)
print(run.returncode, run.stdout.strip(), pathlib.Path(g.dirs["pids"], "pids.max").read_text().strip())
g.remove()
"""


@pytest.mark.skipif(
    cgroups.hierarchy().version != 2 or shutil.which("unshare") is None,
    reason="cgroup namespaces with their own cgroup2 mount: v2 only",
)
def test_in_a_containers_cgroup_namespace_the_grader_moves_its_processes_into_a_leaf(tmp_path):
    """A container (Docker, a Kubernetes pod) sees its own group as ``0::/`` under a cgroup2 mount of its
    own; unlike the hierarchy's true root, that group may not hold processes and hand out controllers."""
    ctr = cgroups.prepare_v2(cgroups.hierarchy().where) / "mlbook-test-container"
    ctr.mkdir()
    try:
        (tmp_path / "grader.py").write_text(NAMESPACED)
        inner = f"umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec {PYTHON} {tmp_path / 'grader.py'}"
        cmd = f'echo $$ > {ctr}/cgroup.procs && exec unshare -Cm /bin/sh -c "$1"'
        run = subprocess.run(
            ["/bin/sh", "-c", cmd, "sh", inner],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TOOLS), "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert run.returncode == 0, (run.stdout, run.stderr)
        assert run.stdout.startswith("0 0::/mlbook-sandbox-"), (
            run.stdout
        )  # entered, in its namespace
        assert run.stdout.split()[-1] == "8", run.stdout
        assert (ctr / cgroups.LEAF).is_dir() and (
            ctr / "cgroup.subtree_control"
        ).read_text().split()
    finally:
        for d in (ctr / cgroups.LEAF, ctr):
            if d.is_dir():
                d.rmdir()
