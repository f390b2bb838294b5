"""Every bound the grader puts on a submission, in one frozen dataclass (CleanRL's ``Args`` style).

The defaults below are the only place a limit is written. A grading gets one ``GradingLimits``
object and passes it down explicitly (driver, sandbox, class workers); a class worker receives it as
plain JSON. Three ways to change one, later ones winning:

- the course config, ``autograde/nbgrader_config.py`` (or a course folder's copy)::

      c.SandboxedExecute.limits = {"memory_bytes": 2 * 1024**3, "cell_seconds": 30}

- the command line: ``mlbook grade ... --limit memory_bytes=2147483648 --limit cell_seconds=30``
  (``mlbook grade-class`` too; ``--budget S`` is ``--limit budget_seconds=S``);
- in code and tests: ``dataclasses.replace(GradingLimits(), cell_seconds=8.0)``.

An unknown name is refused everywhere, with the known ones listed (a typo never passes silently),
and every way of building one (``dataclasses.replace`` too) checks the values (``__post_init__``).
``mlbook limits`` lists every field with its docstring; ``mlbook limits --markdown`` writes the
README's table (``tests/test_limits.py`` compares them).
Times are seconds CHARGED to the sandbox (see ``sandbox.Runner.request``): its own CPU time, or the
time it ran or slept inside a request, never time it waited for a CPU held by other processes, so a
busy machine does not change a grade. Each has a wall-clock backstop ``wall_factor`` times larger.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class UnknownLimit(ValueError):
    """A limit name that ``GradingLimits`` does not have, a value that is not a positive number of
    the field's type, or limits whose relations do not hold (``GradingLimits.__post_init__``)."""


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
    """one submission, every check together (``--budget`` of ``mlbook grade`` and ``grade-class``)"""
    wall_factor: float = 3.0
    """wall-clock backstop = this x each budget above (per submission: counted from reading the file)"""
    start_seconds: float = 60.0
    """wall clock for a sandbox to start (bubblewrap, import torch)"""
    grace_seconds: float = 5.0
    """past the submission's wall backstop + this, a watchdog kills the sandbox whatever runs"""
    request_seconds: float = 10.0
    """the grader's own requests to the sandbox (binding names, reading which are defined; not charged)"""
    interrupt_seconds: float = 3.0
    """wall clock a cell or call cut at its limit has to stop after Jupyter's interrupt (SIGINT); past it
    the sandbox is killed and restarted"""
    restarts: int = 6
    """sandbox restarts (after a crash or a hang) one submission may cause; past them it stops"""

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
    printed_bytes: int = 8 * 1024
    """bytes kept of what the sandboxed process itself prints (stdout, stderr); the rest is counted"""

    # ---- what people read: the autograded notebook, formgrader, the feedback page (``inert.py``)
    shown_chars: int = 2000
    """characters of one text output or one verdict message kept (the rest: "... [N more characters]")"""
    shown_cell_outputs: int = 20
    """stored outputs of one cell kept"""
    shown_notebook_outputs: int = 200
    """stored outputs of the whole notebook kept (test cells' verdicts apart); the rest is one line"""
    shown_image_chars: int = 2_000_000
    """base64 characters of one kept PNG/JPEG image (an output or an attachment; larger: left out)"""
    shown_error_chars: int = 1500
    """characters of one error a verdict or a cell's note quotes (a check's AssertionError, an
    exception raised in the student's code)"""

    # ---- what one page renders (formgrader's submission page, the feedback page), spent in the
    # notebook's order: rich rendering costs (tags, typeset math), not text, so past a budget a cell
    # shows as plain text, folded with its size (``templates/formgrade/mlbook_fold.html.j2``)
    page_source_chars: int = 20_000
    """characters of one cell's source a page shows (the rest: "... N kB of source not shown")"""
    page_late_source_chars: int = 1000
    """the same, once the page has shown ``page_text_chars`` characters"""
    page_text_chars: int = 600_000
    """characters of sources a page shows at ``page_source_chars`` a cell"""
    page_highlight_chars: int = 100_000
    """characters of code a page highlights (pygments); past it, code is plain text"""
    page_code_tags: int = 8000
    """HTML tags of highlighted code on a page (nbconvert parses every tag again)"""
    page_markdown_chars: int = 300_000
    """characters of markdown a page renders; past it, markdown is plain text"""
    page_markdown_tags: int = 6000
    """HTML tags of rendered markdown on a page"""
    page_math: int = 3000
    """math delimiters of rendered markdown on a page (each one typeset)"""
    page_cells: int = 300
    """cells a page shows besides answer and test cells (which always show)"""
    page_outputs: int = 200
    """outputs a page shows (the rest is one line)"""

    # ---- a class run (``mlbook grade-class``)
    attempts: int = 2
    """gradings of one submission before it is reported UNGRADED"""
    worker_slack_seconds: float = 90.0
    """wall seconds a fresh worker may take to start (import torch, load the course) before it takes
    a submission; from then on the submission's backstop + ``grace_seconds`` holds, writing included"""

    # ------------------------------------------------------------------ building one
    def __post_init__(self) -> None:
        """Every field a positive number of its type (an int field takes a whole float, a float field
        an int), and the relations a grading needs; ``dataclasses.replace`` runs this too."""
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _number(f.name, getattr(self, f.name), parse=False))
        for low, high in _ORDERED:
            if getattr(self, low) > getattr(self, high):
                raise UnknownLimit(
                    f"grading limit {low!r} ({getattr(self, low)!r}) must not exceed "
                    f"{high!r} ({getattr(self, high)!r})"
                )
        if self.wall_factor < 1:
            raise UnknownLimit(
                f"grading limit 'wall_factor' must be at least 1 (a backstop is never shorter than "
                f"its budget), not {self.wall_factor!r}"
            )

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
        """A copy with ``changes`` (a course config's or a JSON dict, or the command line's strings),
        names and values checked."""
        changes = dict(changes or {})
        self._refuse_unknown(changes)
        for key, value in changes.items():
            changes[key] = _number(key, value, parse=True)
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

    def page_budget(self) -> dict:
        """What one page may render, as ``mlbook_fold.html.j2`` spends it: each ``page_*`` field
        without its prefix (``page.cells`` counts down), the totals for its notes, nothing noted yet."""
        budget = {
            f.name[5:]: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name.startswith("page_")
        }
        return dict(
            budget,
            cells_max=self.page_cells,
            outputs_max=self.page_outputs,
            cells_noted=False,
            outputs_noted=False,
        )

    def rlimits(self) -> dict:
        """The per-process rlimits the runner sets on itself before its first request."""
        return {
            "RLIMIT_AS": self.address_space_bytes,
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_CORE": 0,
        }


# (smaller, larger): pairs of limits whose order a grading relies on
_ORDERED = (
    ("call_seconds", "check_seconds"),  # a check makes calls
    ("shown_cell_outputs", "shown_notebook_outputs"),  # a cell is part of the notebook
    ("page_late_source_chars", "page_source_chars"),  # the late share is the smaller
    ("page_source_chars", "page_text_chars"),  # a cell is part of the page
)


def _number(key: str, value, parse: bool = True) -> float | int:
    """``value`` as the field's type (int or float), positive; a string (the command line's) is
    parsed when ``parse``, and refused otherwise (a dataclass built in code holds numbers)."""
    kind = {f.name: f.type for f in dataclasses.fields(GradingLimits)}[key]
    try:
        number = float(value) if isinstance(value, str) and parse else value
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


def limits_from_config(config) -> GradingLimits:
    """The limits a course's nbgrader config sets (``c.SandboxedExecute.limits``, and ``.budget``:
    the config's spelling of ``budget_seconds``, as ``--budget`` is the command line's)."""
    section = config.get("SandboxedExecute", {}) if config is not None else {}
    limits = DEFAULT.updated(section.get("limits") or {})
    if section.get("budget"):
        limits = limits.replace(budget_seconds=float(section["budget"]))
    return limits


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it in this file), one line each."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(GradingLimits)).body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _shown(name: str, value) -> str:
    """A default as a person reads it: 3 GiB, 16 MiB, 2,000,000, 20 s."""
    if name.endswith("_seconds"):
        return f"{value:g} s"
    if name.endswith("_bytes") and value >= 1024 and value % 1024 == 0:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def help_text(limits: GradingLimits = DEFAULT) -> str:
    """``--limit``'s help: every field, its value and what it bounds (generated from the fields)."""
    docs = field_docs()
    return "\n".join(
        f"  {f.name} = {getattr(limits, f.name)!r}: {docs[f.name]}"
        for f in dataclasses.fields(GradingLimits)
    )


def markdown_table(limits: GradingLimits = DEFAULT) -> str:
    """The README's limits table (``mlbook limits --markdown``), generated from the fields."""
    docs = field_docs()
    rows = ["| limit | default | what it bounds |", "| --- | --- | --- |"]
    for f in dataclasses.fields(GradingLimits):
        what = docs[f.name].replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{f.name}` | {_shown(f.name, getattr(limits, f.name))} | {what} |")
    return "\n".join(rows) + "\n"
