"""The sandbox's seccomp program, tested directly in both policies (no sandbox starts).

A small C probe (tests/data/seccomp_probe.c, compiled here with gcc) loads the filter and tries one
way of making a process each: with a cgroup allowed (bounded by pids.max), without one refused; a
foreign ABI kills the process either way. tests/test_sandbox_bounds.py runs real sandboxes.
"""

import os
import pathlib
import shutil
import signal
import subprocess

import pytest
from mlbook_tools import sandbox

pytestmark = pytest.mark.unit

PROBE = pathlib.Path(__file__).parent / "data" / "seccomp_probe.c"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    exe = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(PROBE)], check=True)
    return exe


def _try(probe, what, cgroup):
    p = subprocess.run(
        [str(probe), what],
        input=sandbox.seccomp_program(cgroup=cgroup),
        capture_output=True,
        timeout=30,
    )
    return p.returncode, p.stdout.decode().strip()


# Without a cgroup nothing would bound the processes' number, memory or CPUs: none may be made.
EXPECT = {
    "thread": (0, "allowed"),
    "fork": (0, "refused 11"),  # EAGAIN
    "vfork": (0, "refused 11"),
    "clone": (0, "refused 11"),  # clone without CLONE_THREAD
    "clone3": (0, "refused 38"),  # ENOSYS: glibc falls back to clone for threads
    "i386_fork": (-signal.SIGSYS, ""),  # int 0x80: a foreign ABI kills the process
    "x32_fork": (-signal.SIGSYS, ""),
}
# With a cgroup (pids.max, memory, cpu, all killed at close): processes as in a kernel (vfork too:
# /bin/sh, dash, runs commands through it); clone3 still ENOSYS (its flags are out of the filter's
# reach) and a foreign ABI still kills.
EXPECT_WITH_CGROUP = {
    **EXPECT,
    "fork": (0, "allowed"),
    "vfork": (0, "allowed"),
    "clone": (0, "allowed"),
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe is x86-64")
@pytest.mark.parametrize("what", sorted(EXPECT))
def test_seccomp_filter_allows_threads_and_refuses_every_new_process(probe, what):
    assert _try(probe, what, cgroup=False) == EXPECT[what]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe is x86-64")
@pytest.mark.parametrize("what", sorted(EXPECT_WITH_CGROUP))
def test_seccomp_filter_with_a_cgroup_allows_processes_and_still_kills_foreign_abis(probe, what):
    assert _try(probe, what, cgroup=True) == EXPECT_WITH_CGROUP[what]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe is x86-64")
def test_memfd_is_denied_where_no_cgroup_bounds_it(probe):
    assert _try(probe, "memfd", cgroup=True) == (0, "allowed")
    assert _try(probe, "memfd", cgroup=False) == (0, "refused 38")
