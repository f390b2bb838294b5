"""What a request costs a submission: the sandbox's own time, never a busy machine's.

Each request is sampled before and after (``Meter.sample``): the wall clock, the CPU time of the whole
sandbox (its cgroup's ``cpu.stat`` on v2, ``cpuacct.usage`` on v1; a trusted runner's own /proc stat), and how long the runner's
main thread and the calling (driver) thread waited for a CPU that others held (``schedstat``).
``Meter.charged`` turns two samples into the seconds the submission is charged.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time

from mlbook_tools.cgroups import close_fd

# (wall clock, the runner's wait for a CPU, the sandbox's CPU time, the driver thread's wait); None: unknown
Sample = tuple[float, float | None, float | None, float | None]


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
                        close_fd(fd)
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
                close_fd(fd)
            self.fds.clear()


def find_python(root: int, python: str) -> int | None:
    """The pid of the first process running ``python`` below ``root`` (bubblewrap's descendant)."""
    todo, binary = [root], python.encode()
    while todo and len(todo) < 16:
        pid = todo.pop()
        try:
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0] == binary:
                return pid
            todo += [
                int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            ]
        except (OSError, ValueError, IndexError):
            continue
    return None


class Meter:
    """Samples a sandbox's counters through kept file descriptors (``Counters``)."""

    def __init__(self):
        self.counters = Counters()

    def sample(self, pid: int | None, cgroup, trusted: bool) -> Sample:
        """``pid``: the runner's host pid; ``cgroup``: the sandbox's ``Cgroup`` (None without one)."""
        read = self.counters.number
        mine = read(f"/proc/self/task/{threading.get_native_id()}/schedstat", 1, 1e-9)
        delay = read(f"/proc/{pid}/task/{pid}/schedstat", 1, 1e-9) if pid is not None else None
        cpu = None
        if cgroup is not None:
            cpu = read(*cgroup.usage_counter())
        elif pid is not None and trusted:
            try:
                fields = self.counters.read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (AttributeError, ValueError, IndexError):
                pass
        return time.monotonic(), delay, cpu, mine

    @staticmethod
    def charged(s0: Sample, s1: Sample) -> float:
        """What a request window costs the submission: its CPU time, or the wall time it spent running or
        sleeping, whichever is larger. Time spent waiting for a CPU that other processes held is not
        charged: the runner's wait, and the driver's own (on a busy machine the driver reads a reply
        late; a call of a millisecond would otherwise be charged the driver's wait for a CPU)."""
        wall = s1[0] - s0[0]
        delay = s1[1] - (s0[1] or 0.0) if s1[1] is not None else 0.0
        cpu = s1[2] - s0[2] if s1[2] is not None and s0[2] is not None else 0.0
        mine = s1[3] - s0[3] if s1[3] is not None and s0[3] is not None else 0.0
        return max(wall - max(delay, 0.0) - max(mine, 0.0), cpu, 0.0)

    def close(self):
        self.counters.close()
