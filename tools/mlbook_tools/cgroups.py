"""The sandbox's cgroups: one group per sandbox that bounds every process in it (memory including tmpfs,
/dev/shm and memfd pages, a process/thread count, one CPU's worth of time) and meters its CPU time; and
``delegate``, which hands a non-root user groups of their own.

Two back ends with one behaviour, picked from what the machine mounts (``hierarchy``):

- **cgroup v2** (the unified hierarchy: current distributions, Kubernetes nodes, CI runners, WSL2).
  Each sandbox is one group beside this process's own: ``memory.max`` and ``memory.swap.max`` 0,
  ``pids.max``, ``cpu.max``; its CPU charge is ``cpu.stat``'s ``usage_usec``, an out-of-memory kill is
  ``memory.events``' ``oom_kill``, and close is ``cgroup.kill`` (else freeze, kill, thaw). v2's rules are
  kept, not fought: a group that hands controllers to children holds no process, so before it writes
  ``cgroup.subtree_control`` the grader moves the processes of its own group into a leaf beside the
  sandboxes (``mlbook-graders``); controllers are enabled only where the parent offers them; nothing is
  written outside the group this process was started in.
- **cgroup v1** (one hierarchy per controller): a group per controller (memory, pids, cpu, cpuacct)
  under this process's own groups.

A hybrid machine (v1 and a v2 mount side by side) uses the hierarchy that holds the controllers.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import itertools
import os
import pathlib
import signal
import time

from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")  # v1; cpuacct: the sandbox's own CPU time
V2_CONTROLLERS = ("memory", "pids", "cpu")  # v2 meters CPU in every group (cpu.stat)
LEAF = "mlbook-graders"  # v2: where the grader's own group's processes go (no internal processes)
_counter = itertools.count()


# ---------------------------------------------------------------------------------------- which hierarchy
@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """What this machine mounts, for this process: ``version`` 1 or 2 (None: neither is usable for the
    sandbox's controllers), ``where``: the v2 group the sandboxes go under (v2 only), ``why``: what
    stands in the way, said to the instructor."""

    version: int | None
    where: pathlib.Path | None = None
    why: str = ""


def parse_mounts(text: str) -> tuple[dict[str, pathlib.Path], pathlib.Path | None]:
    """/proc/mounts → (v1 controller → its mount point, the cgroup2 mount point or None)."""
    v1, v2 = {}, None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, kind, options = pathlib.Path(fields[1].replace("\\040", " ")), fields[2], fields[3]
        if kind == "cgroup2" and v2 is None:
            v2 = point
        elif kind == "cgroup":
            for opt in options.split(","):
                v1.setdefault(opt, point)
    return v1, v2


def parse_own(text: str) -> dict[str, str]:
    """/proc/self/cgroup → controller → this process's path ('' keys the v2 line ``0::/path``)."""
    own = {}
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            own[name] = path
    return own


def pick(v1: dict, v2: pathlib.Path | None, v2_offers: set[str]) -> tuple[int | None, str]:
    """Which hierarchy holds the sandbox's controllers: (1, ''), (2, '') or (None, why not)."""
    on_v1 = [c for c in CONTROLLERS if c in v1]
    if len(on_v1) == len(CONTROLLERS):
        return 1, ""
    if v2 is not None and set(V2_CONTROLLERS) <= v2_offers:
        return 2, ""
    if not v1 and v2 is None:
        return None, "no cgroup file system is mounted"
    held = ", ".join(on_v1) or "none"
    offered = " ".join(sorted(v2_offers & set(V2_CONTROLLERS))) or "none"
    return None, (
        f"the sandbox needs memory, pids and cpu in one hierarchy; cgroup v1 holds {held}, "
        f"cgroup v2{f' at {v2}' if v2 else ' (not mounted)'} offers {offered}"
    )


@functools.cache
def _mounts() -> tuple[dict[str, pathlib.Path], pathlib.Path | None]:
    """This machine's cgroup mounts (``parse_mounts`` of /proc/mounts), read once per process."""
    return parse_mounts(pathlib.Path("/proc/mounts").read_text())


@functools.cache
def hierarchy() -> Hierarchy:
    v1, v2 = _mounts()
    offers = set()
    if v2 is not None:
        try:
            offers = set((v2 / "cgroup.controllers").read_text().split())
        except OSError:
            pass
    version, why = pick(v1, v2, offers)
    if version != 2:
        return Hierarchy(version, None, why)
    own = parse_own(pathlib.Path("/proc/self/cgroup").read_text()).get("", "/")
    here = v2 / own.lstrip("/")
    # a grader of this group already moved its processes into the leaf: the sandboxes go beside it
    return Hierarchy(2, here.parent if here.name == LEAF else here)


def own_cgroup(controller: str) -> pathlib.Path | None:
    """This process's v1 group of ``controller`` (None where v1 does not mount it)."""
    v1, _ = _mounts()
    path = parse_own(pathlib.Path("/proc/self/cgroup").read_text()).get(controller)
    if controller not in v1 or path is None:
        return None
    return v1[controller] / path.lstrip("/")


SYSTEMD_UNITS = (".slice", ".scope", ".service")


def delegated(group: pathlib.Path) -> bool:
    """Whether ``group`` is this process's to manage: systemd marks a unit it delegates (``Delegate=yes``)
    with the ``trusted.delegate`` (or, for a user manager, ``user.delegate``) attribute; a non-root
    user owns what was delegated to them; a group that is no systemd unit was made by its user (this
    grader's own, a container's, ``mlbook hub``'s). ``MLBOOK_CGROUP_DELEGATED=1`` says so by hand (a
    systemd too old to set the attribute)."""
    if os.environ.get("MLBOOK_CGROUP_DELEGATED") == "1" or not group.name.endswith(SYSTEMD_UNITS):
        return True
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(group, name) == b"1":
                return True
        except OSError:
            pass
    return os.geteuid() != 0 and group.stat().st_uid == os.geteuid()


def prepare_v2(parent: pathlib.Path) -> pathlib.Path:
    """Make ``parent`` hand memory, pids and cpu to child groups, keeping v2's rules: the processes of
    ``parent`` (this one among them) move into the leaf ``parent/mlbook-graders`` first (the hierarchy's
    true root, the one group without ``cgroup.type``, is exempt; a container's namespace root is not),
    then the controllers are enabled in ``parent/cgroup.subtree_control``. A systemd unit that was not
    delegated is left alone (systemd owns it). OSError, saying which file refused and what to do,
    where that cannot be done (not root and not delegated, or the parent does not offer a controller)."""
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    needed = [c for c in V2_CONTROLLERS if c not in enabled]
    if not needed:
        return parent
    offered = set((parent / "cgroup.controllers").read_text().split())
    if missing := [c for c in needed if c not in offered]:
        raise OSError(
            errno.EPERM,
            f"{parent} is not offered the {' and '.join(missing)} controller by its parent "
            "(ask for a delegated subtree with these controllers)",
        )
    if not delegated(parent):
        raise OSError(
            errno.EPERM,
            f"{parent} belongs to systemd, which did not delegate it: run the grader in a delegated "
            "scope (systemd-run --scope -p Delegate=yes ..., or --user as a non-root user)",
        )
    is_root = not (parent / "cgroup.type").exists()
    for attempt in range(20):
        pids = [] if is_root else (parent / "cgroup.procs").read_text().split()
        if pids:
            leaf = parent / LEAF
            leaf.mkdir(exist_ok=True)
            for pid in pids:
                try:
                    (leaf / "cgroup.procs").write_text(pid)
                except ProcessLookupError:
                    pass  # it exited meanwhile
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in needed))
            return parent
        except OSError as err:
            # EBUSY: a process was born in the group meanwhile; move it too
            if err.errno != errno.EBUSY or attempt == 19:
                where = parent / "cgroup.subtree_control"
                raise OSError(err.errno, f"cannot write {where}: {err.strerror}") from None
    return parent


# ---------------------------------------------------------------------------------------- one sandbox's group
class Cgroup:
    """The group(s) of one sandbox, on this machine's back end; ``kill`` empties them, ``remove`` also
    deletes them. ``procs_files``: the files a process writes its pid to to enter; ``usage_counter``:
    (file, field, scale) of the CPU seconds every process of it used so far."""

    def __init__(self, limits: GradingLimits):
        self.dirs: dict[str, pathlib.Path] = {}
        h = hierarchy()
        if h.version is None:
            raise OSError(errno.ENOTSUP, h.why)
        self.version = h.version
        name = f"mlbook-sandbox-{os.getpid()}-{next(_counter)}"
        try:
            if self.version == 2:
                self._make_v2(prepare_v2(h.where) / name, limits)
            else:
                self._make_v1(name, limits)
        except OSError:
            self.remove()
            raise

    def _make_v2(self, d: pathlib.Path, limits: GradingLimits):
        d.mkdir()
        self.dirs = {c: d for c in V2_CONTROLLERS}
        self._write("memory", "memory.max", str(int(limits.memory_bytes)))
        if (d / "memory.swap.max").exists():
            self._write("memory", "memory.swap.max", "0")
        self._write("pids", "pids.max", str(int(limits.processes)))
        self._write("cpu", "cpu.max", f"{int(100000 * limits.cpus)} 100000")

    def _make_v1(self, name: str, limits: GradingLimits):
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

    def _write(self, c, name, value):
        (self.dirs[c] / name).write_text(value)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def usage_counter(self) -> tuple[str, int, float]:
        """The CPU time of every process of the sandbox so far: (file, whitespace field, seconds per unit)."""
        if self.version == 2:
            return str(self.dirs["cpu"] / "cpu.stat"), 1, 1e-6  # "usage_usec N" is its first line
        return str(self.dirs["cpuacct"] / "cpuacct.usage"), 0, 1e-9

    def cpu_seconds(self) -> float | None:
        try:
            path, field, scale = self.usage_counter()
            return int(pathlib.Path(path).read_text().split()[field]) * scale
        except (OSError, KeyError, ValueError, IndexError):
            return None

    def _tree(self) -> list[pathlib.Path]:
        """Its groups, each with any group made inside it, innermost first (the order rmdir needs)."""
        out = []
        for d in dict.fromkeys(self.dirs.values()):
            inner = [p for p in d.glob("**/") if p != d] if d.is_dir() else []
            out += sorted(inner, key=lambda p: -len(p.parts)) + [d]
        return out

    def pids(self) -> set[int]:
        found = set()
        for d in self._tree():
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def oom_killed(self) -> bool:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            stat = (self.dirs["memory"] / name).read_text()
        except (OSError, KeyError):
            return False
        return any(
            line.split()[-1] != "0" for line in stat.splitlines() if line.startswith("oom_kill ")
        )

    def kill(self):
        """SIGKILL every process in the group until it is empty. ``pids.max`` drops to 0 first: no process
        in the group can make another meanwhile, so a fork bomb cannot outrun the loop (v2 kills the
        whole group in the kernel with ``cgroup.kill``, or freezes it first where that file is missing).
        Returns once every process it killed has finished exiting (gone, or a zombie), or after 2 s: a
        dying process leaves the group's listing before the kernel has let go of its memory."""
        if "pids" in self.dirs:
            try:
                self._write("pids", "pids.max", "0")
            except OSError:
                pass
        frozen = False
        if self.version == 2 and self.dirs:
            d = self.dirs["memory"]
            try:
                if (d / "cgroup.kill").exists():
                    (d / "cgroup.kill").write_text("1")  # the kernel kills the whole subtree
                else:  # kernels before 5.14: stop it, then kill what is listed (SIGKILL reaches frozen tasks)
                    (d / "cgroup.freeze").write_text("1")
                    frozen = True
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
        if frozen:
            try:
                self._write("memory", "cgroup.freeze", "0")
            except OSError:
                pass
        for _ in range(200):
            if not any(map(running, killed)):
                break
            time.sleep(0.01)

    def remove(self):
        self.kill()
        for d in self._tree():
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


def sandbox_parents() -> list[pathlib.Path]:
    """The groups this process makes its sandboxes' groups under (v2: one; v1: one per controller)."""
    h = hierarchy()
    if h.version == 2:
        return [h.where]
    return [p for p in map(own_cgroup, CONTROLLERS) if p is not None]


@functools.cache
def cgroups_available() -> str | None:
    """None if a per-sandbox cgroup can be made here, else why not (then memfd is denied instead)."""
    if os.environ.get("MLBOOK_NO_CGROUP") == "1":
        return "MLBOOK_NO_CGROUP=1"
    h = hierarchy()
    if h.version is None:
        return f"no usable cgroup: {h.why}"
    try:
        Cgroup(DEFAULT_LIMITS).remove()
    except OSError as err:
        where = f" at {h.where}" if h.where else ""
        return f"cannot create a cgroup v{h.version} group{where}: {err.strerror or err}"
    # groups left by a grader that was killed (their processes died with it)
    for parent in sandbox_parents():
        for stale in parent.glob("mlbook-sandbox-*"):
            pid = stale.name.split("-")[2]
            if pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists():
                try:
                    stale.rmdir()
                except OSError:
                    pass
    return None


def describe() -> str:
    """One line for ``mlbook doctor``: the cgroup version found, where, delegated or not, and whether the
    sandboxes can have a group of their own here (else why not)."""
    h = hierarchy()
    if h.version is None:
        return f"cgroup: none usable ({h.why})"
    if h.version == 2:
        owner = h.where.stat().st_uid if h.where.exists() else None
        who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
        delegated = (
            "delegated to this user" if owner == os.geteuid() and os.geteuid() != 0 else f"as {who}"
        )
        head = f"cgroup v2, sandboxes under {h.where} ({delegated})"
    else:
        head = "cgroup v1 (memory, pids, cpu, cpuacct), sandboxes under this process's own groups"
    why = cgroups_available()
    return f"{head}: " + ("usable" if why is None else f"NOT usable: {why}")


def refusal_note() -> str | None:
    """The line ``grade-class`` and ``mlbook grade`` print where no sandbox can have a group of its own:
    which back end was found, why it cannot be used, what is refused and how to fix it (None: usable)."""
    why = cgroups_available()
    if why is None:
        return None
    return (
        f"note: no cgroup for the sandboxes here ({why}): student code that starts a process "
        "(`!` lines, %%bash, subprocess, multiprocessing) is refused, and memory is bounded per "
        "process only. Grade as root, in a cgroup delegated to you (`mlbook hub` gives its "
        "instructor one; with systemd: systemd-run --user --scope -p Delegate=yes mlbook ...), "
        "or see `mlbook doctor`."
    )


# ---------------------------------------------------------------------------------------- delegation
# A user's first process enters the groups named before "--", then becomes the rest ("$1": the folder to
# start in). A group it cannot enter is said on stderr and skipped: without cgroups, grading refuses new
# processes instead.
ENTER_THEN_RUN = (
    'for f in "$@"; do [ "$f" = -- ] && break; echo $$ 2>/dev/null > "$f" || '
    'echo "mlbook: could not enter the cgroup $f: grading here refuses new processes" >&2; shift; done; '
    'shift; cd "$1" && shift && exec "$@"'
)
# v2 delegation: the files the delegatee writes (kernel docs, "Delegation Containment"; systemd's Delegate=yes)
V2_DELEGATED = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")


def entering(groups, then=None):
    """A ``preexec_fn``: the new process enters ``groups`` (``cgroup.procs`` files) while it is still
    root, then runs ``then`` (which drops to the user). On v2 only a process allowed to write the
    common ancestor's ``cgroup.procs`` may move one into a delegated group, so the user cannot enter
    it alone (``ENTER_THEN_RUN`` run as the user works on v1 only). A group it cannot enter is said
    on stderr and skipped: grading there refuses new processes instead."""
    import sys

    def preexec():
        for procs in groups:
            try:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
            except OSError as err:
                print(f"mlbook: could not enter the cgroup {procs}: {err}", file=sys.stderr)
        if then is not None:
            then()

    return preexec


def delegate(user: str) -> list[str]:
    """Give ``user`` groups of their own under this (root) process's own, as systemd's ``Delegate=yes``
    does for a service: returns their ``cgroup.procs`` files, which the user's first process enters
    while still root (``entering``; on v1 ``ENTER_THEN_RUN`` as the user works too). Everything it starts is then in them, and ``Cgroup`` makes each sandbox's
    groups under them without root. On v1 a group per controller, owned by the user (a new group's
    files belong to whoever made it); on v2 one group whose directory, ``cgroup.procs``,
    ``cgroup.subtree_control`` and ``cgroup.threads`` are the user's, with memory, pids and cpu offered
    to it (its own limits stay root's). ``mlbook hub`` does this for the instructor's server, so that
    ``grade-class`` and formgrader's Autograde run student code that starts processes as a kernel does.
    ``[]`` where no cgroup can be written here."""
    import pwd

    try:
        pw = pwd.getpwnam(user)
        h = hierarchy()
        if h.version == 2:
            mine = prepare_v2(h.where) / f"mlbook-grader-{user}"
            mine.mkdir(exist_ok=True)
            for path in (mine, *(mine / f for f in V2_DELEGATED)):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            # the user's processes start in the leaf, never in `mine`: once their grader has enabled
            # controllers in `mine`, no process may enter it (a second start of the server would fail)
            leaf = mine / LEAF
            leaf.mkdir(exist_ok=True)
            for path in (leaf, leaf / "cgroup.procs", leaf / "cgroup.threads"):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            return [str(leaf / "cgroup.procs")]
        if h.version is None:
            return []
        dirs: list[pathlib.Path] = []
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
