"""The session: a sandboxed runner holding the student's namespace, and the submission's deadlines as
one value (charged seconds on the session's own clock, and a wall-clock backstop)."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager, nullcontext

from mlbook_tools import remote
from mlbook_tools.errors import (
    BudgetExceeded,
    CallTimeout,
    Crashed,
    Interrupted,
    RunnerDied,
    SandboxUnavailable,
)
from mlbook_tools.inside import protocol
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits
from mlbook_tools.plan import Plan
from mlbook_tools.sandbox import Runner


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
            starting  # starting.Starting: the first runner, started before the plan was made
        )
        self.t0, self.spent = time.monotonic(), 0.0  # spent: charged to runners already closed
        self.free = 0.0  # measured by the runners but not charged: start-ups, replays, bookkeeping
        self.ran: set[str] = set()  # cells charged once already (their replays are free)
        if wall_deadline is None:
            wall_deadline = self.t0 + (deadline - self.t0) * limits.wall_factor
        self.wall_deadline = self.hard_deadline = wall_deadline  # hard_deadline never moves
        self.runner: Runner | None = None
        self.bad_cells: dict[str, str] = {}  # grade_id -> what happened to it (a sentence)
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
                    {"op": "bind", "names": sorted(self.plan.student_names)},
                    self.limits.request_seconds,
                )
        except CallTimeout:
            return  # the final bindings serve
        except RunnerDied:
            self.bad_bindings.add(at)
            raise
        if not reply.get("ok"):
            return
        try:
            bound = remote.codec(self).decode(
                reply.get("result"), rblobs, reply.get(protocol.TENSORS, [])
            )
        except protocol.ProtocolError:
            return
        if isinstance(bound, dict):
            for name, value in bound.items():
                if isinstance(value, remote.Remote):
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
                    except RunnerDied as err:  # each kind says what happened to the cell
                        self.bad_cells[gid] = err.student_message(f"cell {gid!r}")
                        if isinstance(err, Interrupted):  # as Jupyter's: what it did so far stays
                            continue
                        raise
                    if not reply.get("ok"):
                        error = str(reply.get("error", "error"))
                        self.cell_errors.setdefault(gid, error[: self.limits.shown_error_chars])
                for at in stops:  # test cells below every cell
                    self._bind(at)
                return
            except RunnerDied:
                self.runner.close()  # every error path: nothing of this runner survives
                self.restarts += 1
                if self.restarts > self.limits.restarts or self.out_of_time():
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
        except CallTimeout as err:
            if left <= timeout or wall_left <= wall:  # the budget ran out, not this request's time
                raise BudgetExceeded() from None
            err.seconds = min(timeout, left)  # what the student reads (``student_message``)
            raise

    def ensure(self):
        if self.runner is None or self.runner.dead:
            self.restarts += 1
            self._build()

    def defined(self, names: list[str]) -> set[str]:
        with self.uncharged():
            reply, _ = self.request({"op": "defined", "names": names}, self.limits.request_seconds)
        return set(reply.get("names", []))

    def close(self):
        if self.runner is not None:
            self.runner.close()

    def output(self) -> str:
        return self.runner.output() if self.runner else ""

    def call(self, target, method, args, kwargs, attrs=(), label=None):
        """Call ``target`` in the sandbox (``remote.call``)."""
        return remote.call(self, target, method, args, kwargs, attrs, label)
