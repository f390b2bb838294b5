"""The trusted side of grading: it never runs student code, it only judges the data that comes back.

For one submission: read the notebook (any damage is a problem noted for this student, not a crash),
plan the cells the way ``nbgrader autograde`` would run them (locked cells from the SOURCE notebook,
the student's answer cells and added cells, each whole, in notebook order; cells flagged as
demonstrations skipped), run them in a sandboxed IPython shell (``runner.py``; a cell that crashes
or hangs the process is skipped after a restart), then call every graded check declared in the
registry (``CHECKS`` of tests/ppo_checks.py) here, in this process,
with the student's functions replaced by remote proxies: each call sends plain tensors over the
pipe and gets plain tensors back, validated, under a deadline. The checks' inputs are seeded from
HMAC(course secret, student, test), so no submission can know them in advance and a regrade
reproduces the same verdicts. The end-to-end test runs the reference PPO loop from
``mlbook_solutions`` here, calling the student's math remotely at every step.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import importlib.util
import json
import math
import os
import pathlib
import re
import secrets
import threading
import time
import types
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import nbformat
import torch

from mlbook_tools.bounds import V3, OldFormat, scan
from mlbook_tools.errors import (  # noqa: F401 - CannotGrade, TooLarge, SandboxUnavailable: driver's API
    BudgetExceeded,
    CallTimeout,
    CannotGrade,
    Crashed,
    Interrupted,
    MemoryLimit,
    RemoteError,
    RunnerDied,
    SandboxUnavailable,
    TooLarge,
)
from mlbook_tools.inside import protocol
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits
from mlbook_tools.notebook_order import merged
from mlbook_tools.result import is_extra
from mlbook_tools.sandbox import Runner

SECRET_FILE = "grading_secret.txt"


def _mb(n: int) -> str:
    return f"{n / 1024**2:.1f} MB"


def read_submission(path, limits: GradingLimits = DEFAULT_LIMITS) -> str:
    """The text of a submission file; a file past ``max_notebook_bytes`` is refused without reading it whole."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(limits.max_notebook_bytes + 1)
    except OSError as err:
        raise CannotGrade(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    _check_raw(head, size, limits)
    return head.decode("utf-8", errors="replace")


def _check_raw(raw: bytes | str, size: int, limits: GradingLimits = DEFAULT_LIMITS) -> None:
    """Size and cell count of the raw text (milliseconds, nothing parsed): TooLarge past a bound."""
    key = b'"cell_type"' if isinstance(raw, bytes) else '"cell_type"'
    cells = raw[: limits.max_notebook_bytes + 1].count(
        key
    )  # a key; inside a JSON string its quotes are escaped
    more = "+" if size > len(raw) else ""
    if cells > limits.max_cells:
        raise TooLarge(
            f"too large: {cells}{more} cells (limit {limits.max_cells}), {_mb(size)}; nothing was run"
        )
    if size > limits.max_notebook_bytes:
        raise TooLarge(
            f"too large: {_mb(size)} (limit {_mb(limits.max_notebook_bytes)}); nothing was run"
        )


def _check_parsed(data, limits: GradingLimits = DEFAULT_LIMITS) -> None:
    """Exact cell count and source bytes of the parsed JSON (``bounds.scan`` bounded the rest)."""
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        return
    if len(cells) > limits.max_cells:
        raise TooLarge(f"too large: {len(cells)} cells (limit {limits.max_cells}); nothing was run")
    sources = 0
    for cell in cells:
        src = cell.get("source", "") if isinstance(cell, dict) else ""
        sources += (
            sum(len(s) for s in src if isinstance(s, str))
            if isinstance(src, list)
            else len(str(src))
        )
    if sources > limits.max_source_bytes:
        raise TooLarge(
            f"too large: {_mb(sources)} of cell sources (limit {_mb(limits.max_source_bytes)}); nothing was run"
        )


def bounded(text: str | bytes, limits: GradingLimits = DEFAULT_LIMITS) -> tuple[dict, list[str]]:
    """A submission's text, bounded before it is parsed (``bounds.scan``), then parsed: (its JSON,
    notes on what it stored beside its code that was left out). Every cell's metadata but its
    ``nbgrader`` entry (what matches it to the course's cell) is dropped before anything copies it.
    TooLarge past a bound on what is graded, CannotGrade for a file that is not a notebook."""
    _check_raw(text, len(text), limits)
    raw = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
    scanned = scan(raw, limits)
    try:
        data = json.loads(scanned.text.decode("utf-8", errors="surrogatepass"))  # a few MB at most
    except RecursionError:
        raise TooLarge(
            f"too large: JSON nested more than {limits.max_json_depth} levels deep; nothing was run"
        ) from None
    except ValueError as err:
        raise CannotGrade(
            f"the file is not a readable notebook ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    _check_parsed(data, limits)
    cells = data.get("cells") if isinstance(data, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and isinstance(cell.get("metadata"), dict):
            entry = cell["metadata"].get("nbgrader")
            cell["metadata"] = {"nbgrader": entry} if entry is not None else {}
    return data, scanned.notes


def check_bounds(text: str | bytes, limits: GradingLimits = DEFAULT_LIMITS) -> str:
    """Every bound of ``limits`` (max_*) on a submission's text, checked before it is parsed (TooLarge,
    CannotGrade); returns the text to read: what it stored beside its code past a bound left out."""
    data, _ = bounded(text, limits)
    return json.dumps(data, ensure_ascii=False)


def parse_submission(
    text: str, limits: GradingLimits = DEFAULT_LIMITS
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The student's notebook (nbformat 4), bounded before it is parsed (``bounded``), and the notes."""
    data, notes = bounded(text, limits)
    try:
        major, minor = nbformat.reader.get_version(data)
        if major != 4:
            raise OldFormat(V3.format(version=major))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbformat's notes about missing cell ids
            nb = nbformat.versions[4].to_notebook_json(data, minor=minor)
            try:
                nbformat.validate(nb)
            except nbformat.ValidationError:
                pass  # nbformat.reads only logs it: what the plan needs is checked there
        if not isinstance(nb.cells, list):
            raise ValueError("no cell list")
    except CannotGrade:
        raise
    except Exception as err:  # noqa: BLE001 - wrong schema, binary junk: all cannot-grade
        raise CannotGrade(
            f"the file is not a readable notebook ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    return nb, notes


# ------------------------------------------------------------------------------- the course secret


def course_secret(course: pathlib.Path) -> bytes:
    """The course's grading secret (created on first use, outside source/ so nbgrader never releases it)."""
    path = course / SECRET_FILE
    if not path.exists():
        path.write_text(secrets.token_hex(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip().encode()


def check_seed(secret: bytes, student: str, test: str) -> int:
    digest = hmac.new(secret, f"{student}\0{test}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# ------------------------------------------------------------------------------- the plan


# Cells that only demonstrate (training runs, sweeps, figures) carry the cell tag DEMO_TAG, written
# by `mlbook build` from the fragment header `demo=true`: metadata, so the reader sees no grader
# plumbing. The grader skips such a cell by the course's copy (a submission's cell metadata is
# dropped but for its nbgrader entry, ``bounded``), an answer cell too: the student's demonstration
# never costs a grade. A first line DEMO_FLAG (what earlier releases wrote) still skips a cell,
# the student's own included.
DEMO_TAG = "demo"
DEMO_FLAG = "# Demonstration only: the autograder skips this cell."
_DEMO = re.compile(r"\A\s*#\s*Demonstration only: the autograder skips this cell", re.IGNORECASE)


def is_demo(source: str) -> bool:
    """The legacy flag: ``source`` starts with DEMO_FLAG."""
    return bool(_DEMO.match(source))


def is_demo_cell(cell) -> bool:
    """A cell tagged DEMO_TAG, or one whose source starts with the legacy DEMO_FLAG."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    tags = meta.get("tags", []) if isinstance(meta, dict) else []
    return (isinstance(tags, list) and DEMO_TAG in tags) or is_demo(_text(cell))


@dataclass
class Test:
    grade_id: str
    points: float
    extra: bool
    at: int | None = None  # where it stands: the number of plan cells above it (None: below all)


@dataclass
class Plan:
    cells: list[tuple[str, str, bool]]  # (cell id, source, trusted), in notebook order, run whole
    tests: list[Test]
    manual: list[tuple[str, float]]  # (grade_id, points) of manually graded cells
    student_names: dict[str, str]  # symbol -> grade_id of the answer cell that defines it
    problems: list[str] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None  # the student's, parsed
    skipped: list[str] = field(default_factory=list)  # cells flagged as demonstrations


def cell_points(cell) -> float:
    """The points a graded cell is worth: its nbgrader points, or for extra credit (nbgrader points 0,
    scored as ``Grade.extra_credit``) the points ``mlbook build`` states in ``metadata.mlbook``."""
    mlbook = cell.get("metadata", {}).get("mlbook", {})
    if isinstance(mlbook, dict) and "extra_credit" in mlbook:
        return float(mlbook["extra_credit"])
    return float(_meta(cell).get("points", 0))


def _meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def _text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _defined_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def make_plan(
    source_nb: nbformat.NotebookNode, submission_text: str, limits: GradingLimits = DEFAULT_LIMITS
) -> Plan:
    """The cells ``nbgrader autograde`` would run, in notebook order, each whole; every kind of damage noted.

    Read-only cells come from the course's SOURCE notebook (a student's edit is undone, as nbgrader
    restores locked cells), answer cells and the cells a student added are the student's. Test cells
    are not run here: the driver calls their checks. Demonstration cells (``is_demo_cell``) are skipped.
    """
    student, problems = parse_submission(submission_text, limits)  # bounded before it is parsed
    cells = student.cells
    order, placement = merged(source_nb.cells, cells)  # the one notebook-order rule
    for gid in placement.duplicates:
        problems.append(f"cell {gid!r} appears more than once: the first copy is graded")
    plan_cells, tests, manual, names, skipped = [], [], [], {}, []
    counts: dict[str, int] = {}  # code cells the student added below each anchor, so far

    def add(cell_id: str, source: str, trusted: bool, demo: bool = False) -> None:
        if demo or is_demo(source):
            skipped.append(cell_id)
        elif source.strip():
            plan_cells.append((cell_id, source, trusted))

    for kind, where, cell in order:
        if kind == "added":  # run as the student's code, where the student put it
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                counts[where] = counts.get(where, 0) + 1
                add(f"{where or 'top'}+{counts[where]}", _text(cell), False)
            continue
        cell, mine = where, cell
        meta = _meta(cell)
        gid = meta.get("grade_id", "")
        if meta.get("grade") and meta.get("solution"):
            manual.append((gid, cell_points(cell)))
            if mine is None:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
            continue
        if cell.cell_type != "code":
            continue
        if meta.get("grade"):
            tests.append(Test(gid, cell_points(cell), is_extra(gid), at=len(plan_cells)))
            if mine is None:
                problems.append(f"test cell {gid!r} is missing: restored from the course's copy")
            continue
        if meta.get("solution"):
            for name in _defined_names(cell.source):
                names[name] = gid
            if mine is None:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
                continue
            add(gid, _text(mine), False, is_demo_cell(cell))  # the course's tag
            continue
        add(gid, cell.source, True, is_demo_cell(cell))
        if mine is not None and _text(mine).strip() != cell.source.strip():
            problems.append(f"read-only cell {gid!r} was edited: the course's version was used")
    return Plan(plan_cells, tests, manual, names, problems, student, skipped)


# ------------------------------------------------------------------------------- the session


class Session:
    """A sandboxed runner holding the student's namespace; restarted (cells replayed) after a crash or hang.

    ``deadline`` is the submission's budget on the session's clock (``clock()``: time.monotonic() at the
    start plus the seconds charged to the sandbox since, so a busy machine does not spend it): every
    cell, call and attribute read checks it first and gets at most what is left (no floor).
    What is charged is what the submission's own code did, once: each cell's first run, each call and
    attribute read (a request cut at its limit costs exactly that limit, ``Runner.request``). The
    grader's own work in the sandbox is not charged: starting a sandbox, replaying cells that already
    ran in an earlier sandbox after a restart, and its bookkeeping requests (``bind``, ``defined``), so
    how many restarts a submission causes, and how long each takes on a busy machine, moves no
    verdict (they are bounded by the cell limit each and by the wall-clock backstop).
    ``wall_deadline`` (time.monotonic, default ``wall_factor`` x the budget) is the wall-clock backstop;
    past it + ``grace_seconds`` a watchdog kills the sandbox whatever is running. ``self.deadline`` and
    ``self.wall_deadline`` are lowered for one check by ``within``."""

    def __init__(
        self,
        plan: Plan,
        trusted: bool,
        deadline: float,
        wall_deadline: float | None = None,
        limits: GradingLimits = DEFAULT_LIMITS,
        starting=None,
    ):
        self.plan, self.trusted, self.deadline, self.limits = plan, trusted, deadline, limits
        self.starting = (
            starting  # sandbox.Starting: the first runner, started before the plan was made
        )
        self.t0, self.spent = time.monotonic(), 0.0  # spent: charged to runners already closed
        self.free = 0.0  # measured by the runners but not charged: start-ups, replays, bookkeeping
        self.ran: set[str] = set()  # cells charged once already (their replays are free)
        if wall_deadline is None:
            wall_deadline = self.t0 + (deadline - self.t0) * limits.wall_factor
        self.wall_deadline = self.hard_deadline = wall_deadline  # hard_deadline never moves
        self.runner: Runner | None = None
        self.bad_cells: dict[str, str] = {}  # grade_id -> why it is left out
        # plan position -> {name: what it was bound to there} (the checks' view at each test cell,
        # as nbgrader runs a hidden test where it stands); taken again by every new runner
        self.bindings: dict[int, dict] = {}
        self.bad_bindings: set[int] = set()  # positions whose snapshot stopped the runner
        self.cell_errors: dict[str, str] = {}  # grade_id -> the error it raised (it stays in)
        self.restarts = 0
        self._build()

    @contextmanager
    def within(self, seconds: float):
        """Lower both deadlines for one block (a check): at most ``seconds`` charged, ``seconds`` x
        ``wall_factor`` of wall clock, never past the submission's own; both are restored on the way out."""
        kept = self.deadline, self.wall_deadline
        self.deadline = min(self.deadline, self.clock() + seconds)
        self.wall_deadline = min(
            self.hard_deadline, time.monotonic() + seconds * self.limits.wall_factor
        )
        try:
            yield self
        finally:
            self.deadline, self.wall_deadline = kept

    def clock(self) -> float:
        return self.t0 + self.spent - self.free + (self.runner.charged if self.runner else 0.0)

    @contextmanager
    def uncharged(self):
        """Whatever the current runner is charged inside this block is the grader's, not the submission's."""
        runner = self.runner
        before = runner.charged if runner is not None else 0.0
        try:
            yield
        finally:
            if runner is not None:
                self.free += runner.charged - before

    def left(self) -> float:
        """Charged seconds left of the budget."""
        return self.deadline - self.clock()

    def out_of_time(self) -> bool:
        return self.left() <= 0 or time.monotonic() >= self.wall_deadline

    def _start(self):
        if self.hard_deadline - time.monotonic() <= 0 or self.deadline - self.clock() <= 0:
            raise BudgetExceeded()
        if self.runner is not None:
            self.spent += self.runner.charged
            self.runner = None
        kill_at = (
            None
            if math.isinf(self.hard_deadline)
            else self.hard_deadline + self.limits.grace_seconds
        )
        start_seconds = self.limits.start_seconds
        start = min(
            start_seconds, self.hard_deadline - time.monotonic()
        )  # ends at the backstop too
        try:
            if self.starting is not None:  # the same Runner, its start-up overlapped with planning
                starting, self.starting = self.starting, None
                self.runner = starting.take()
            else:
                self.runner = Runner(
                    trusted=self.trusted, start_timeout=start, kill_at=kill_at, limits=self.limits
                )
            self.free += (
                self.runner.charged
            )  # its start-up (bubblewrap, import torch) is the grader's
        except SandboxUnavailable:
            if start < start_seconds and time.monotonic() >= self.hard_deadline:
                raise BudgetExceeded() from None  # the backstop, not the sandbox, stopped it
            raise

    def _bind(self, at: int) -> None:
        """What the student's graded names are bound to now, at plan position ``at`` (handles)."""
        if at in self.bad_bindings or not self.plan.student_names:
            return
        try:
            with self.uncharged():
                reply, rblobs = self.request(
                    {"op": "bind", "names": sorted(self.plan.student_names)}, 10
                )
        except CallTimeout:
            return  # the final bindings serve
        except RunnerDied:
            self.bad_bindings.add(at)
            raise
        if not reply.get("ok"):
            return
        try:
            bound = _codec(self).decode(
                reply.get("result"), rblobs, reply.get(protocol.TENSORS, [])
            )
        except protocol.ProtocolError:
            return
        if isinstance(bound, dict):
            for name, value in bound.items():
                if isinstance(value, Remote):
                    object.__setattr__(value, "name", name)
                    object.__setattr__(value, "label", name)
            self.bindings[at] = bound

    def bound_at(self, at: int | None) -> dict:
        """The student's graded names as a check at plan position ``at`` sees them ({} if unknown)."""
        return self.bindings.get(at, {}) if at is not None else {}

    def _build(self):
        while True:
            self._start()
            self.bindings = {}
            stops = sorted({t.at for t in self.plan.tests if t.at is not None})
            try:
                for i, (gid, source, _trusted) in enumerate(self.plan.cells):
                    while stops and stops[0] <= i:  # a test cell stands here
                        self._bind(stops.pop(0))
                    if gid in self.bad_cells:
                        continue
                    # read-only cells too: they may call student code
                    timeout = min(self.limits.cell_seconds, self.left())
                    replay = gid in self.ran  # charged on its first run, in an earlier sandbox
                    self.ran.add(gid)
                    try:
                        with self.uncharged() if replay else nullcontext():
                            reply, _ = self.request(
                                {"op": "exec", "cell": gid, "source": source},
                                timeout,
                                interrupt=True,
                            )
                    except Interrupted:  # as Jupyter's Interrupt: what it did so far stays
                        self.bad_cells[gid] = (
                            f"did not finish within {max(timeout, 0):.0f} s and was interrupted"
                        )
                        continue
                    except BudgetExceeded:
                        self.bad_cells[gid] = "did not run: the submission's time budget ran out"
                        raise
                    except CallTimeout:
                        self.bad_cells[gid] = f"did not finish within {max(timeout, 0):.0f} s"
                        raise
                    except RunnerDied:
                        self.bad_cells[gid] = (
                            "stopped the Python process (a crash, os._exit, or the memory limit)"
                        )
                        raise
                    if not reply.get("ok"):
                        self.cell_errors.setdefault(gid, str(reply.get("error", "error"))[:500])
                for at in stops:  # test cells below every cell
                    self._bind(at)
                return
            except RunnerDied:
                self.runner.close()  # every error path: nothing of this runner survives
                self.restarts += 1
                if self.restarts > 6 or self.out_of_time():
                    raise
            except BaseException:
                self.runner.close()
                raise

    def request(self, header: dict, timeout: float, blobs=(), interrupt: bool = False):
        """One request under the deadlines: BudgetExceeded without sending when no time is left.

        ``timeout`` is charged seconds; its wall-clock backstop is ``wall_factor`` times longer.
        ``interrupt``: cut at its limit, the student's code is interrupted (``Interrupted``: the
        runner lives on) rather than killed, where it lets itself be (``Runner.request``)."""
        left, wall_left = self.deadline - self.clock(), self.wall_deadline - time.monotonic()
        if left <= 0 or wall_left <= 0:
            raise BudgetExceeded()
        if self.runner is None or self.runner.dead:
            raise Crashed()
        wall = timeout * self.limits.wall_factor
        try:
            return self.runner.request(
                header,
                blobs,
                timeout=min(timeout, left),
                wall_timeout=min(wall, wall_left),
                interrupt=interrupt,
            )
        except CallTimeout:
            if left <= timeout or wall_left <= wall:  # the budget ran out, not this request's time
                raise BudgetExceeded() from None
            raise

    def ensure(self):
        if self.runner is None or self.runner.dead:
            self.restarts += 1
            self._build()

    def defined(self, names: list[str]) -> set[str]:
        with self.uncharged():
            reply, _ = self.request({"op": "defined", "names": names}, 10)
        return set(reply.get("names", []))

    def close(self):
        if self.runner is not None:
            self.runner.close()

    def output(self) -> str:
        return self.runner.output() if self.runner else ""

    # -------------------------------------------------------------- calls
    def call(self, target, method, args, kwargs, attrs=(), label=None):
        """Call ``target`` (a name or handle; ``label``: its name for messages) in the sandbox. Nothing
        comes back into ``args``: the driver's tensors stay as they were; a call that changed an input in
        place fails the check."""
        blobs, leaves = [], []
        codec = _codec(self)
        enc_args = [codec.encode(a, blobs, leaves) for a in args]
        enc_kwargs = {k: codec.encode(v, blobs, leaves) for k, v in kwargs.items()}
        header = {
            "op": "call",
            "target": target,
            "method": method,
            "args": enc_args,
            "kwargs": enc_kwargs,
            "attrs": list(attrs),
        }
        name = label or (target if isinstance(target, str) else "your code")
        timeout = min(self.limits.call_seconds, self.left())
        try:
            reply, rblobs = self.request(header, self.limits.call_seconds, blobs, interrupt=True)
        except BudgetExceeded:
            raise AssertionError(
                f"not finished: the time budget of this submission ran out before {name} was called"
            ) from None
        except CallTimeout:
            raise AssertionError(
                f"calling {name} did not return within {max(timeout, 0):.0f} s (an endless loop?)"
            ) from None
        except MemoryLimit:
            raise AssertionError(f"calling {name} went over the sandbox's memory limit") from None
        except RunnerDied:
            raise AssertionError(
                f"the process running {name} died (a crash, os._exit, or the memory limit)"
            ) from None
        if not reply["ok"]:
            raise RemoteError(reply["error"][:1000])
        metas = reply.get(protocol.TENSORS, [])
        try:
            result = codec.decode(reply.get("result"), rblobs, metas)
            grads = [codec.decode(g, rblobs, metas) for g in reply.get("grads", [])]
            extras = {k: codec.decode(v, rblobs, metas) for k, v in reply.get("attrs", {}).items()}
        except protocol.ProtocolError as err:
            raise AssertionError(f"{name} returned something that is not data ({err})") from None
        mutated = [str(m)[:80] for m in reply.get("mutated", [])]
        if mutated:
            which = ", ".join(f"`{m}`" for m in mutated[:5])
            raise AssertionError(
                f"{name} changed its input {which} in place; it must leave its inputs as they are "
                "(work on a copy, e.g. x = x.clone(), or use out-of-place ops)"
            )
        if reply.get("graph") and leaves:
            ok = len(grads) == len(leaves) and all(
                g is None or (isinstance(g, torch.Tensor) and g.shape == leaf.shape)
                for g, leaf in zip(grads, leaves, strict=False)
            )
            if ok:
                result = _attach(result, grads, leaves)
        return (result, extras) if attrs else result


def _codec(session) -> protocol.Codec:
    """The driver's codec: data and library types out, data and handles (as ``Remote``) in."""
    return protocol.Codec(make_handle=lambda h, type_name: Remote(session, h, type_name))


class _Attach(torch.autograd.Function):
    """Connect a remotely computed scalar to the local inputs it was computed from, with the remote gradient."""

    @staticmethod
    def forward(ctx, value, grads, *inputs):
        ctx.grads = grads
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        return (
            None,
            None,
            *[None if g is None else upstream * g.to(upstream.dtype) for g in ctx.grads],
        )


def _attach(result, grads, leaves):
    first = result[0] if isinstance(result, tuple | list) and result else result
    if not isinstance(first, torch.Tensor) or first.numel() != 1 or not first.is_floating_point():
        return result
    attached = _Attach.apply(first, grads, *leaves)
    if isinstance(result, tuple):
        return (attached, *result[1:])
    if isinstance(result, list):
        return [attached, *result[1:]]
    return attached


class Remote:
    """A function, class or object that lives in the sandbox: calling it is a request, attributes are requests."""

    def __init__(self, session: Session, handle, type_name="function", name=None):
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "handle", handle)
        object.__setattr__(self, "_protocol_handle", handle if isinstance(handle, int) else None)
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "name", name or type_name)
        object.__setattr__(self, "label", None)  # the graded name it is bound to, for messages

    def __repr__(self):
        return f"<remote {self.type_name} {self.name}>"

    def __call__(self, *args, **kwargs):
        try:
            return self.session.call(self.handle, None, args, kwargs, label=self.label)
        except RemoteError as err:
            raise AssertionError(f"{self.name} raised {err}") from None

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            reply, rblobs = self.session.request(
                {"op": "getattr", "target": self.handle, "name": attr},
                self.session.limits.call_seconds,
            )
        except BudgetExceeded:
            raise AssertionError(
                f"not finished: the time budget ran out before {self.name}.{attr} was read"
            ) from None
        except RunnerDied:
            raise AssertionError(
                f"the process running {self.name} died or hung reading .{attr}"
            ) from None
        if not reply["ok"]:
            raise AssertionError(f"{self.name}.{attr} is not available: {reply['error'][:300]}")
        try:
            value = _codec(self.session).decode(
                reply.get("result"), rblobs, reply.get(protocol.TENSORS, [])
            )
        except protocol.ProtocolError as err:
            raise AssertionError(f"{self.name}.{attr} is not data ({err})") from None
        if isinstance(value, Remote):
            object.__setattr__(value, "name", f"{self.name}.{attr}")
        return value


# ------------------------------------------------------------------------------- the checks


def load_checks(path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("mlbook_graded_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference_with(proxies: dict) -> dict:
    """The reference module's namespace with the student's symbols replaced by proxies (functions rebound)."""
    from mlbook_solutions import ppo_lm

    ns = dict(vars(ppo_lm))
    ns.update(proxies)
    for name, obj in vars(ppo_lm).items():
        if (
            isinstance(obj, types.FunctionType)
            and obj.__module__ == ppo_lm.__name__
            and name not in proxies
        ):
            fn = types.FunctionType(
                obj.__code__, ns, obj.__name__, obj.__defaults__, obj.__closure__
            )
            fn.__kwdefaults__ = obj.__kwdefaults__
            ns[name] = fn
    return ns


def _warm_up() -> None:
    """What the checks import on first use, imported while the sandbox runs the notebook's cells (the
    driver only waits then): the reference PPO loop, and ``torch._dynamo``, which torch imports at the
    first optimizer it makes (half a second of CPU). Imports only: nothing runs, no state is set."""
    import torch._dynamo  # noqa: F401
    from mlbook_solutions import ppo_lm  # noqa: F401


@dataclass
class Verdict:
    grade_id: str
    points: float
    score: float
    message: str
    extra: bool
    seconds: float = 0.0


def grade_plan(
    plan: Plan,
    checks: types.ModuleType,
    secret: bytes,
    student: str,
    trusted: bool = False,
    wall_deadline: float | None = None,
    limits: GradingLimits = DEFAULT_LIMITS,
    starting=None,
) -> dict:
    """Run every graded check of ``plan``; returns verdicts, problems and the (capped) printed output.

    ``starting``: a ``sandbox.Starting`` started with this run's bounds, taken as the first runner.

    ``limits.budget_seconds``: charged seconds (see ``Session``); ``wall_deadline`` (time.monotonic): the
    backstop, by default ``wall_factor`` x budget from now (the entry points pass one counted from reading the file)."""
    torch.set_num_threads(1)  # the driver's torch and the runner's must not fight over cores
    warm = threading.Thread(target=_warm_up, daemon=True, name="mlbook-warm-up")
    warm.start()
    t_start = time.monotonic()
    deadline = t_start + limits.budget_seconds
    if wall_deadline is None:
        wall_deadline = t_start + limits.budget_seconds * limits.wall_factor
    verdicts: list[Verdict] = []
    session = None
    try:
        session = Session(plan, trusted, deadline, wall_deadline, limits, starting)
    except RunnerDied:
        plan.problems.append(
            "the notebook's code could not be loaded: it crashed or hung the Python process repeatedly"
        )
    try:
        for test in plan.tests:
            t0 = time.monotonic()
            try:
                verdicts.append(_run_test(test, plan, session, checks, secret, student, deadline))
            except (
                RunnerDied
            ):  # whatever the sandbox does, it is this test's failure, never an engine error
                verdicts.append(
                    Verdict(
                        test.grade_id,
                        test.points,
                        0.0,
                        "the process running your code died or broke the protocol",
                        test.extra,
                    )
                )
            verdicts[-1].seconds = time.monotonic() - t0
    finally:
        output = session.output() if session else ""
        if session is not None:
            for gid, why in session.bad_cells.items():
                left_out = "" if why.endswith("interrupted") else "; it was skipped"
                plan.problems.append(f"cell {gid!r} {why}{left_out}")
            session.close()
        warm.join()
    return {
        "verdicts": verdicts,
        "problems": plan.problems,
        "output": output,
        "seconds": time.monotonic() - t_start,
        "cell_errors": dict(session.cell_errors) if session else {},
    }


class Missing:
    """A name the student's notebook does not define: a check or the reference loop fails only if it is used."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"{self.name} is not available ({self.reason})")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AssertionError(f"{self.name} is not available ({self.reason})")


def _run_test(test, plan, session, checks, secret, student, deadline) -> Verdict:
    def verdict(ok, message):
        return Verdict(test.grade_id, test.points, test.points if ok else 0.0, message, test.extra)

    check = checks.CHECKS.get(test.grade_id)
    if check is None:
        return verdict(
            False, "this test has no declared check (tests/ppo_checks.py); it needs manual grading"
        )
    if session is None:
        return verdict(False, "not run: the notebook's code could not be loaded")
    if session.clock() >= deadline or time.monotonic() >= session.hard_deadline:
        return verdict(
            False,
            "not run: the time budget for this submission ran out (an earlier cell or call was too slow)",
        )
    try:
        session.ensure()
        defined = session.defined(list(plan.student_names))
    except BudgetExceeded:
        return verdict(False, "not run: the time budget for this submission ran out")
    except RunnerDied:
        return verdict(
            False, "not run: the notebook's code crashes, hangs or breaks the Python process"
        )
    proxies: dict = {}
    here = session.bound_at(test.at)  # the names as they were bound at the test cell
    for name, gid in plan.student_names.items():
        if name in here:
            proxies[name] = here[name]
        elif name in defined:  # defined only below the test cell: its final binding
            proxies[name] = Remote(session, name, name=name)
        else:
            why = session.bad_cells.get(gid) or session.cell_errors.get(gid) or "it was not defined"
            proxies[name] = Missing(name, why)
    # a name the check takes that no answer cell defines is the course's own (read-only) code:
    # the reference implementation, calling the student's functions wherever it uses them
    reference = _reference_with(proxies) if any(n not in proxies for n in check.names) else {}
    for name in check.names:
        if isinstance(proxies.get(name), Missing):
            return verdict(False, f"{name} is not available ({proxies[name].reason})")
    call_args = [proxies[n] if n in proxies else reference[n] for n in check.names]
    seed = check_seed(secret, student, test.grade_id)
    try:
        with session.within(session.limits.check_seconds), torch.random.fork_rng():
            torch.manual_seed(seed)
            check.fn(*call_args, seed=seed)
        return verdict(True, "passed")
    except AssertionError as err:
        return verdict(False, str(err)[:1500] or "failed")
    except RemoteError as err:
        return verdict(False, f"your code raised {err}")
    except RunnerDied:
        return verdict(False, "the process running your code died during this test")
    except Exception as err:  # noqa: BLE001 - a value the check could not even compare
        return verdict(
            False,
            f"your function's result could not be checked: {type(err).__name__}: {str(err)[:300]}",
        )
