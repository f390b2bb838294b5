"""A bubblewrap sandbox around ``runner.py``, bounded as a whole, and the pipe that talks to it.

What the sandbox sees, read-only: the system's /usr (binaries, shared libraries), the interpreter's
standard library (its site-packages hidden), the installed packages that ``import torch, mlbook``
loads, and the files of ``inside/`` (``confine.INSIDE``). The packages are bound from a STAGING folder of hard links
under a neutral name (``~/.cache/mlbook/sandbox/<key>/``), so the host path of the repository
appears nowhere in the sandbox's mount table. It does not see the repository, the course folder,
the gradebook, the grading cache, other submissions, tests/, solutions/ or ``mlbook_solutions``.

Bounds, on the sandbox as a whole:
- no inherited file descriptor: bubblewrap starts with ``close_fds=True`` and ``pass_fds`` = the
  runner's two pipes and the seccomp program (read and closed by bubblewrap);
- a cgroup per sandbox (``cgroups.py``: cgroup v2 or v1, whichever holds memory, pids and cpu here):
  memory including tmpfs, /dev/shm and memfd pages (shmem is charged to the group, swap capped
  too), a process/thread count (``pids.max``), one CPU's worth of time, the CPU charge of every
  process in it, children included; ``close`` and the watchdog drop
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

import json
import os
import shutil
import signal
import subprocess
import threading
import time

from mlbook_tools.cgroups import Cgroup, cgroups_available, close_fd
from mlbook_tools.confine import (
    MAX_REPLY,
    RUNNER,
    _import_roots,
    bwrap_command,
    python_binary,
    seccomp_program,
)
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
from mlbook_tools.meter import Meter, Sample, find_python

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
        self._meter = Meter()  # what each request is charged (meter.py)
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
                close_fd(fd)
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
        if self._pid is None and self.proc is not None:
            self._pid = (
                self.proc.pid if self.trusted else find_python(self.proc.pid, python_binary())
            )
        return self._pid

    def _sample(self) -> Sample:
        return self._meter.sample(self._runner_pid(), self.cgroup, self.trusted)

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
                elif Meter.charged(s0, self._sample()) >= timeout:
                    if not (interrupt and self._interrupt()):
                        raise TimeoutError("timeout")
                    cut.append(time.monotonic())

            # the reply (to an interrupted request too) is read whole: the pipe stays in step
            deadline = wall_deadline + (self.limits.interrupt_seconds if interrupt else 0.0)
            reply, rblobs = protocol.read_frame(self.rep_r, deadline, MAX_REPLY, tick=tick)
            protocol.check_reply(reply, header.get("op"), len(rblobs))
            self.charged += timeout if cut else min(Meter.charged(s0, self._sample()), timeout)
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
            self.charged += timeout if cut else min(Meter.charged(s0, self._sample()), timeout)
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
        self._meter.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if not was_dead:
            for fd in (self.req_w, self.rep_r):
                close_fd(fd)

    def output(self) -> str:
        """What the student's code printed so far (capped)."""
        if self.dead:
            self.out.join(timeout=2)
            self.err.join(timeout=2)
        return (self.out.text() + self.err.text()).strip()


def check_available(limits: GradingLimits = DEFAULT_LIMITS) -> str | None:
    """None if a sandboxed runner starts here within ``limits.start_seconds``, else why not."""
    try:
        r = Runner(start_timeout=limits.start_seconds, limits=limits)
    except SandboxUnavailable as err:
        return str(err)
    except (OSError, ImportError) as err:
        return f"bubblewrap could not be started: {err}"
    r.close()
    return None
