"""Judging: every graded check declared in the registry (``CHECKS`` of the assignment's checks) called
here, in this process, with the student's functions replaced by remote proxies (``remote.py``). Each
check's inputs are seeded from HMAC(course secret, student, test), so no submission can know them in
advance and a regrade reproduces the same verdicts. A name a check takes that no answer cell defines
is the reference module's (the assignment's ``reference``, e.g. ``mlbook_solutions.ppo_lm``), calling
the student's functions wherever it uses them.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import importlib.util
import pathlib
import secrets
import threading
import time
import types
from dataclasses import dataclass, replace

import torch

from mlbook_tools.config import assignment as configured
from mlbook_tools.errors import RemoteError, RunnerDied
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits
from mlbook_tools.plan import Plan
from mlbook_tools.remote import Remote
from mlbook_tools.session import Session

SECRET_FILE = "grading_secret.txt"


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


def load_checks(path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("mlbook_graded_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_module(name: str | None = None) -> types.ModuleType:
    """The reference module ``name`` (a module name), by default the default assignment's."""
    return importlib.import_module(name or configured().reference)


def _reference_with(proxies: dict, reference: str | None = None) -> dict:
    """The reference module's namespace with the student's symbols replaced by proxies (functions rebound)."""
    module = reference_module(reference)
    ns = dict(vars(module))
    ns.update(proxies)
    for name, obj in vars(module).items():
        if (
            isinstance(obj, types.FunctionType)
            and obj.__module__ == module.__name__
            and name not in proxies
        ):
            fn = types.FunctionType(
                obj.__code__, ns, obj.__name__, obj.__defaults__, obj.__closure__
            )
            fn.__kwdefaults__ = obj.__kwdefaults__
            ns[name] = fn
    return ns


def _warm_up(reference: str | None = None) -> None:
    """What the checks import on first use, imported while the sandbox runs the notebook's cells (the
    driver only waits then): the reference module (the chapter's PPO loop), and ``torch._dynamo``,
    which torch imports at the first optimizer it makes (half a second of CPU). Imports only: nothing
    runs, no state is set."""
    import torch._dynamo  # noqa: F401

    reference_module(reference)


@dataclass(frozen=True)
class Verdict:
    """One graded check's outcome."""

    grade_id: str
    points: float  # what it is worth
    score: float  # what it earned: 0 or ``points``
    message: str  # what the student reads: "passed", or what failed
    extra: bool  # extra credit (not in the core total)
    seconds: float = 0.0  # wall clock the check took


@dataclass(frozen=True)
class EngineRun:
    """What ``grade_plan`` found: a verdict per graded check, in notebook order, and what the notebook did."""

    verdicts: tuple[Verdict, ...]
    problems: tuple[str, ...]  # sentences for the student: cells skipped, code that could not load
    output: str  # what the student's code printed (capped)
    seconds: float  # wall clock of the whole run
    cell_errors: dict[str, str]  # grade id of a cell that raised -> its error


def grade_plan(
    plan: Plan,
    checks: types.ModuleType,
    secret: bytes,
    student: str,
    trusted: bool = False,
    wall_deadline: float | None = None,
    limits: GradingLimits = DEFAULT_LIMITS,
    starting=None,
    assignment: str | None = None,
) -> EngineRun:
    """Run every graded check of ``plan``: its verdicts, problems and the (capped) printed output.

    ``starting``: a ``starting.Starting`` started with this run's bounds, taken as the first runner.
    ``assignment``: the configured assignment's name (default: the first), whose reference module
    (``Assignment.reference``) supplies a check's parameters that no answer cell defines.

    ``limits.budget_seconds``: charged seconds (see ``Session``); ``wall_deadline`` (time.monotonic): the
    backstop, by default ``wall_factor`` x budget from now (the entry points pass one counted from reading the file)."""
    torch.set_num_threads(1)  # the driver's torch and the runner's must not fight over cores
    reference = configured(assignment).reference
    warm = threading.Thread(target=_warm_up, args=(reference,), daemon=True, name="mlbook-warm-up")
    warm.start()
    t_start = time.monotonic()
    deadline = t_start + limits.budget_seconds
    if wall_deadline is None:
        wall_deadline = t_start + limits.budget_seconds * limits.wall_factor
    verdicts: list[Verdict] = []
    session = None
    try:
        session = Session(plan, trusted, deadline, wall_deadline, limits, starting)
    except RunnerDied as err:  # its last start or restart failed too
        plan.problems.append(
            "the notebook's code could not be loaded: " + err.student_message("running it")
        )
    try:
        for test in plan.tests:
            t0 = time.monotonic()
            try:
                found = _run_test(test, plan, session, checks, secret, student, deadline, reference)
            except RunnerDied as err:  # whatever the sandbox does, it is this test's failure
                found = Verdict(test.grade_id, test.points, 0.0, err.student_message(), test.extra)
            verdicts.append(replace(found, seconds=time.monotonic() - t0))
    finally:
        output = session.output() if session else ""
        if session is not None:
            for why in session.bad_cells.values():
                left_out = "" if why.endswith("interrupted") else "; it was skipped"
                plan.problems.append(f"{why}{left_out}")
            session.close()
        warm.join()
    return EngineRun(
        verdicts=tuple(verdicts),
        problems=tuple(plan.problems),
        output=output,
        seconds=time.monotonic() - t_start,
        cell_errors=dict(session.cell_errors) if session else {},
    )


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


def _run_test(test, plan, session, checks, secret, student, deadline, reference=None) -> Verdict:
    def verdict(ok, message):
        return Verdict(test.grade_id, test.points, test.points if ok else 0.0, message, test.extra)

    check = checks.CHECKS.get(test.grade_id)
    if check is None:
        return verdict(
            False,
            "this test has no declared check (the assignment's checks); it needs manual grading",
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
    except RunnerDied as err:  # restarting the notebook's code failed: each kind says how
        return verdict(False, "not run: " + err.student_message("the notebook's code"))
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
    needs_course_code = any(n not in proxies for n in check.names)
    course_code = _reference_with(proxies, reference) if needs_course_code else {}
    for name in check.names:
        if isinstance(proxies.get(name), Missing):
            return verdict(False, f"{name} is not available ({proxies[name].reason})")
    call_args = [proxies[n] if n in proxies else course_code[n] for n in check.names]
    seed = check_seed(secret, student, test.grade_id)
    try:
        with session.within(session.limits.check_seconds), torch.random.fork_rng():
            torch.manual_seed(seed)
            check.fn(*call_args, seed=seed)
        return verdict(True, "passed")
    except AssertionError as err:
        return verdict(False, str(err)[: session.limits.shown_error_chars] or "failed")
    except (RemoteError, RunnerDied) as err:  # each kind carries its sentence
        return verdict(False, err.student_message("your code"))
    except Exception as err:  # noqa: BLE001 - a value the check could not even compare
        return verdict(
            False,
            f"your function's result could not be checked: {type(err).__name__}: "
            + str(err)[: session.limits.shown_error_chars],
        )
