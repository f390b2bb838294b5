"""The sandbox's cgroups (v1): one group per controller for each sandbox, made under this process's
own groups, which bounds every process in it (memory including tmpfs, /dev/shm and memfd pages, a
process/thread count, one CPU's worth of time) and meters its CPU time (``cpuacct``); and ``delegate``,
which hands a non-root user groups of their own."""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import signal
import time

from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")  # cpuacct: the sandbox's own CPU time
_counter = itertools.count()


def own_cgroup(controller: str) -> pathlib.Path | None:
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return None


class Cgroup:
    """One cgroup v1 group per controller for one sandbox; ``kill`` empties and removes them."""

    def __init__(self, limits: GradingLimits):
        self.dirs: dict[str, pathlib.Path] = {}
        name = f"mlbook-sandbox-{os.getpid()}-{next(_counter)}"
        try:
            for c in CONTROLLERS:
                parent = own_cgroup(c)
                if parent is None or not parent.is_dir():
                    raise OSError(f"no {c} cgroup")
                if parent / name in self.dirs.values():  # co-mounted controllers (cpu,cpuacct)
                    self.dirs[c] = parent / name
                    continue
                (parent / name).mkdir()
                self.dirs[c] = parent / name
            mem = str(int(limits.memory_bytes))
            self._write("memory", "memory.limit_in_bytes", mem)
            if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", mem)
            self._write("pids", "pids.max", str(int(limits.processes)))
            self._write("cpu", "cpu.cfs_period_us", "100000")
            self._write("cpu", "cpu.cfs_quota_us", str(int(100000 * limits.cpus)))
        except OSError:
            self.remove()
            raise

    def _write(self, c, name, value):
        (self.dirs[c] / name).write_text(value)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def usage_file(self) -> str:
        """The file holding the CPU time used by every process of the sandbox so far (nanoseconds)."""
        return str(self.dirs["cpuacct"] / "cpuacct.usage")

    def cpu_seconds(self) -> float | None:
        try:
            return int(pathlib.Path(self.usage_file()).read_text()) / 1e9
        except (OSError, KeyError, ValueError):
            return None

    def pids(self) -> set[int]:
        found = set()
        for d in dict.fromkeys(self.dirs.values()):
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def oom_killed(self) -> bool:
        try:
            stat = (self.dirs["memory"] / "memory.oom_control").read_text()
            return any(
                line.split()[-1] != "0"
                for line in stat.splitlines()
                if line.startswith("oom_kill ")
            )
        except (OSError, KeyError, IndexError):
            return False

    def kill(self):
        """SIGKILL every process in the group until it is empty. ``pids.max`` drops to 0 first: no process
        in the group can make another meanwhile, so a fork bomb cannot outrun the loop. Returns once
        every process it killed has finished exiting (gone, or a zombie), or after 2 s: a dying process
        leaves the group's listing before the kernel has let go of its memory."""
        if "pids" in self.dirs:
            try:
                self._write("pids", "pids.max", "0")
            except OSError:
                pass
        killed = set()
        for _ in range(200):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed |= pids
            time.sleep(0.005)
        for _ in range(200):
            if not any(map(running, killed)):
                break
            time.sleep(0.01)

    def remove(self):
        self.kill()
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still emptying
                    time.sleep(0.01)
        self.dirs = {}


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not finished exiting (a zombie has: it only waits to be reaped)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


@functools.cache
def cgroups_available() -> str | None:
    """None if a per-sandbox cgroup can be made here, else why not (then memfd is denied instead)."""
    if os.environ.get("MLBOOK_NO_CGROUP") == "1":
        return "MLBOOK_NO_CGROUP=1"
    try:
        Cgroup(DEFAULT_LIMITS).remove()
    except OSError as err:
        return f"cannot create a cgroup v1 group: {err}"
    for c in CONTROLLERS:  # groups left by a grader that was killed (their processes died with it)
        parent = own_cgroup(c)
        for stale in parent.glob("mlbook-sandbox-*") if parent else []:
            pid = stale.name.split("-")[2]
            if pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists():
                try:
                    stale.rmdir()
                except OSError:
                    pass
    return None


# A user's first process enters the groups named before "--", then becomes the rest ("$1": the folder to
# start in). A group it cannot enter is skipped: without cgroups, grading refuses new processes instead.
ENTER_THEN_RUN = (
    'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" 2>/dev/null; shift; done; '
    'shift; cd "$1" && shift && exec "$@"'
)


def delegate(user: str) -> list[str]:
    """Give ``user`` a group per controller under this (root) process's own, owned by them, as
    systemd's ``Delegate=yes`` does for a service: returns their ``cgroup.procs`` files, which the
    user's first process enters (``ENTER_THEN_RUN``). Everything it starts is then in them, and
    ``Cgroup`` makes each sandbox's groups under them without root (a new group's files belong to
    whoever made it). ``mlbook hub`` does this for the instructor's server, so that ``grade-class`` and
    formgrader's Autograde run student code that starts processes as a kernel does. ``[]`` where
    cgroup v1 cannot be written here."""
    import pwd

    dirs: list[pathlib.Path] = []
    try:
        pw = pwd.getpwnam(user)
        for c in CONTROLLERS:
            parent = own_cgroup(c)
            if parent is None or not parent.is_dir():
                return []
            mine = parent / f"mlbook-grader-{user}"
            if mine not in dirs:  # co-mounted controllers (cpu,cpuacct) share one folder
                mine.mkdir(exist_ok=True)
                for path in (mine, mine / "cgroup.procs"):
                    os.chown(path, pw.pw_uid, pw.pw_gid)
                dirs.append(mine)
    except (OSError, KeyError):
        return []
    return [str(d / "cgroup.procs") for d in dirs]


def close_fd(fd):
    try:
        os.close(fd)
    except OSError:
        pass
