"""Every bound the grader puts on a submission, in one frozen dataclass (CleanRL's ``Args`` style).

The defaults below are the only place a limit is written. A grading gets one ``GradingLimits``
object and passes it down explicitly (driver, sandbox, class workers); a class worker receives it as
plain JSON. Three ways to change one, later ones winning:

- the course config, ``autograde/nbgrader_config.py`` (or a course folder's copy)::

      c.SandboxedExecute.limits = {"memory_bytes": 2 * 1024**3, "cell_seconds": 30}

- the command line: ``mlbook grade ... --limit memory_bytes=2147483648 --limit cell_seconds=30``
  (``mlbook grade-class`` too);
- in code and tests: ``dataclasses.replace(GradingLimits(), cell_seconds=8.0)``.

An unknown name is refused everywhere, with the known ones listed (a typo never passes silently).
Times are seconds CHARGED to the sandbox (see ``sandbox.Runner.request``): its own CPU time, or the
time it ran or slept inside a request, never time it waited for a CPU held by other processes, so a
busy machine does not change a grade. Each has a wall-clock backstop ``wall_factor`` times larger.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class UnknownLimit(ValueError):
    """A limit name that ``GradingLimits`` does not have, or a value that is not a positive number."""


@dataclass(frozen=True)
class GradingLimits:
    # ---- time (charged seconds; see the module's docstring)
    cell_seconds: float = 20.0
    """one cell (answer or read-only) while the student's namespace is built"""
    call_seconds: float = 10.0
    """one call into the student's code (or one attribute read)"""
    check_seconds: float = 90.0
    """one whole graded check (the training test makes ~150 calls)"""
    budget_seconds: float = 300.0
    """one submission, every check together (``mlbook grade --timeout``, ``grade-class --budget``)"""
    wall_factor: float = 3.0
    """wall-clock backstop = this x each budget above (per submission: counted from reading the file)"""
    start_seconds: float = 60.0
    """wall clock for a sandbox to start (bubblewrap, import torch)"""
    grace_seconds: float = 5.0
    """past the submission's wall backstop + this, a watchdog kills the sandbox whatever runs"""

    # ---- the submission file, checked before it is parsed (``bounds.scan``). What is graded (the
    # file, its cells, their sources, the JSON around them) past one: "too large: ...", nothing runs.
    # What a notebook stores beside its code (outputs, attachments, metadata) past one is left out,
    # with a note, and the code is graded: the grader runs the code and never reads them.
    max_notebook_bytes: int = 20 * 1024**2
    """the file's size (checked before it is read whole)"""
    max_cells: int = 2000
    """cells (counted in the raw text first, then exactly)"""
    max_output_bytes: int = 16 * 1024**2
    """bytes of stored outputs, attachments and metadata kept (in file order; past it: left out)"""
    max_source_bytes: int = 4 * 1024**2
    """every cell's source together (code is sent to the sandbox and run)"""
    max_json_depth: int = 64
    """nesting of the notebook's JSON (a stored part nested deeper is left out)"""
    max_json_values: int = 200_000
    """JSON values of the notebook, counted before parsing as its ``{``, ``[`` and ``,`` outside
    strings (objects to parse and copy: 18 MB of ``{}`` are six million); stored parts past it are
    left out, the rest past it refused"""

    # ---- the sandbox: per sandbox (its cgroup) and per process (rlimits)
    memory_bytes: int = 3 * 1024**3
    """RAM of the whole sandbox, its tmpfs, /dev/shm and memfd pages included (cgroup)"""
    address_space_bytes: int = 4 * 1024**3
    """virtual memory per process (RLIMIT_AS; torch reserves more than it uses)"""
    cpu_seconds: int = 300
    """CPU seconds per process (RLIMIT_CPU)"""
    processes: int = 64
    """processes and threads of the whole sandbox (cgroup pids, RLIMIT_NPROC)"""
    file_bytes: int = 64 * 1024**2
    """largest file a process may write (RLIMIT_FSIZE)"""
    cpus: float = 1.0
    """CPUs' worth of time the sandbox may use at once (cgroup cpu quota)"""
    tmp_bytes: int = 256 * 1024**2
    """size of the sandbox's /tmp (a tmpfs)"""
    shm_bytes: int = 16 * 1024**2
    """size of the sandbox's /dev/shm (a tmpfs)"""

    # ---- a class run (``mlbook grade-class``)
    attempts: int = 2
    """gradings of one submission before it is reported UNGRADED"""
    worker_slack_seconds: float = 90.0
    """wall seconds a fresh worker may take to start (import torch, load the course) before it takes
    a submission; from then on the submission's backstop + ``grace_seconds`` holds, writing included"""

    # ------------------------------------------------------------------ building one
    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def _refuse_unknown(cls, keys) -> None:
        unknown = [k for k in keys if k not in cls.names()]
        if unknown:
            raise UnknownLimit(
                f"unknown grading limit {unknown[0]!r}; the known ones are: {', '.join(cls.names())}"
            )

    def replace(self, **changes) -> GradingLimits:
        """A copy with ``changes``; an unknown name is refused (UnknownLimit)."""
        self._refuse_unknown(changes)
        return dataclasses.replace(self, **changes)

    def updated(self, changes: dict | None) -> GradingLimits:
        """A copy with ``changes`` (a course config's or a JSON dict), names and values checked."""
        changes = dict(changes or {})
        self._refuse_unknown(changes)
        for key, value in changes.items():
            changes[key] = _number(key, value)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict | None) -> GradingLimits:
        """The defaults with ``data`` on top (a class worker's JSON, a course config's dict)."""
        return cls().updated(data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def with_options(self, options: list[str] | None) -> GradingLimits:
        """A copy with the command line's ``--limit name=value`` options applied."""
        changes = {}
        for option in options or []:
            key, sep, value = option.partition("=")
            if not sep:
                raise UnknownLimit(
                    f"--limit {option!r}: write it as name=value, e.g. cell_seconds=30"
                )
            changes[key.strip()] = value.strip()
        return self.updated(changes)

    def rlimits(self) -> dict:
        """The per-process rlimits the runner sets on itself before its first request."""
        return {
            "RLIMIT_AS": self.address_space_bytes,
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_CORE": 0,
        }


def _number(key: str, value) -> float | int:
    """``value`` as the field's type (int or float), positive; a string from the command line is parsed."""
    kind = {f.name: f.type for f in dataclasses.fields(GradingLimits)}[key]
    try:
        number = float(value) if isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
            raise ValueError
        if kind == "int":
            if number != int(number):
                raise ValueError
            number = int(number)
        else:
            number = float(number)
    except (ValueError, OverflowError, TypeError):
        raise UnknownLimit(
            f"grading limit {key!r} must be a positive {kind}, not {value!r}"
        ) from None
    return number


DEFAULT = GradingLimits()
HELP = "\n".join(
    f"  {f.name} = {getattr(DEFAULT, f.name)!r}" for f in dataclasses.fields(GradingLimits)
)
