"""The trusted side of grading: it never runs student code, it only judges the data that comes back.

For one submission: read the notebook (any damage is a problem noted for this student, not a crash),
plan the namespace the way nbgrader would restore it (locked cells from the SOURCE notebook, the
student's solution cells), build it in a sandboxed runner cell by cell (a cell that crashes or
hangs the process is skipped after a restart), then run every graded check here, in this process,
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
import pathlib
import re
import secrets
import time
import types
import warnings
from dataclasses import dataclass, field

import nbformat
import torch

from mlbook_tools import protocol
from mlbook_tools.sandbox import RemoteError, Runner, RunnerDied

HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
EXTRA_PREFIX = "ex"
CELL_SECONDS = 20.0  # one solution cell while the namespace is built
CALL_SECONDS = 10.0  # one call into the student's code
CHECK_SECONDS = 90.0  # one whole check (the training test makes ~150 calls)
BUDGET_SECONDS = 300.0  # one submission, all checks
GRACE_SECONDS = 5.0  # past budget + grace the watchdog kills the sandbox, whatever it is doing
SECRET_FILE = "grading_secret.txt"
# Read-only cells import these for figures and display only; the graded functions never need them.
SKIP_IMPORTS = {"matplotlib", "IPython", "mlbook.figures", "mlbook.plotting", "tqdm"}


class CannotGrade(Exception):
    """The file cannot be graded at all (not a notebook, wrong assignment)."""


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


@dataclass
class Test:
    grade_id: str
    points: float
    call: str | None  # "check_gae(gae)", or None when the test is not a check_* call
    extra: bool


@dataclass
class Plan:
    cells: list[tuple[str, str, bool]]  # (grade_id, source, trusted)
    tests: list[Test]
    manual: list[tuple[str, float]]  # (grade_id, points) of manually graded cells
    student_names: dict[str, str]  # symbol -> grade_id of the solution cell that defines it
    problems: list[str] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None  # the student's, parsed


def _meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def _definitional(source: str, any_assignment: bool = False) -> str:
    """Only the imports, defs, classes and literal assignments of a trusted cell (no demo runs, no plots).

    ``any_assignment``: keep every top-level assignment (a student's own helper cell may compute a
    constant, ``EPS = torch.finfo(torch.float32).eps``); bare calls, loops and plots still go."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    lines, kept = source.splitlines(), []
    for node in tree.body:
        seg = "\n".join(
            lines[node.lineno - 1 - len(getattr(node, "decorator_list", [])) : node.end_lineno]
        )
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
            )
            if any(m.split(".")[0] in SKIP_IMPORTS or m in SKIP_IMPORTS for m in modules):
                continue
            kept.append(
                "try:\n"
                + "\n".join("    " + s for s in seg.splitlines())
                + "\nexcept ImportError:\n    pass"
            )
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            kept.append(seg)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            if any_assignment:
                kept.append(seg)
                continue
            try:
                ast.literal_eval(node.value)
                kept.append(seg)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
    return "\n\n\n".join(kept)


def _defined_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def _check_call(source: str) -> str | None:
    """The ``check_*(...)`` call that ends a test cell's hidden region."""
    if HIDDEN[0] not in source:
        return None
    hidden = source.split(HIDDEN[0], 1)[1].split(HIDDEN[1], 1)[0]
    calls = re.findall(r"^\s*(check_\w+\([\w, =]*\))\s*$", hidden, flags=re.M)
    return calls[-1] if calls else None


def make_plan(source_nb: nbformat.NotebookNode, submission_text: str) -> Plan:
    """Match the student's notebook against the source, cell by grade_id; note every kind of damage."""
    problems = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbformat's notes about missing cell ids
            student = nbformat.reads(submission_text, as_version=4)
        cells = student.cells
        if not isinstance(cells, list):
            raise ValueError("no cell list")
    except Exception as err:  # noqa: BLE001 - bad JSON, wrong schema, binary junk: all cannot-grade
        raise CannotGrade(
            f"the file is not a readable notebook ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    by_id: dict[str, dict] = {}
    added: dict[
        str, list[str]
    ] = {}  # cells the student added (no grade id), by the grade id above them
    anchor = ""
    for cell in cells:
        gid = _meta(cell).get("grade_id")
        if not isinstance(gid, str):
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                src = cell.get("source", "")
                added.setdefault(anchor, []).append(
                    "".join(src) if isinstance(src, list) else str(src)
                )
            continue
        anchor = gid
        if gid in by_id:
            problems.append(f"cell {gid!r} appears more than once: the first copy is graded")
            continue
        by_id[gid] = cell
    plan_cells, tests, manual, names = [], [], [], {}

    def add_student_cells(anchor: str) -> None:
        """The student's own cells below ``anchor`` (helpers their answers call), definitions only."""
        for i, src in enumerate(added.pop(anchor, []), 1):
            text = _definitional(src, any_assignment=True)
            if text:
                plan_cells.append((f"{anchor or 'top'}+{i}", text, False))

    previous = ""
    for cell in source_nb.cells:
        add_student_cells(previous)
        meta = _meta(cell)
        gid = meta.get("grade_id", "")
        previous = gid
        if meta.get("grade") and meta.get("solution"):
            manual.append((gid, float(meta.get("points", 0))))
            if gid not in by_id:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
            continue
        if cell.cell_type != "code":
            continue
        if meta.get("grade"):
            tests.append(
                Test(
                    gid,
                    float(meta.get("points", 0)),
                    _check_call(cell.source),
                    gid.startswith(EXTRA_PREFIX),
                )
            )
            mine = by_id.get(gid)
            if mine is None:
                problems.append(f"test cell {gid!r} is missing: restored from the course's copy")
            continue
        if meta.get("solution"):
            for name in _defined_names(cell.source):
                names[name] = gid
            if gid.endswith(
                "_demo"
            ):  # figures and sweeps for the manual questions: never run by the grader
                continue
            mine = by_id.get(gid)
            if mine is None:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
                continue
            src = mine.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            plan_cells.append((gid, src, False))
            continue
        text = _definitional(cell.source)
        if text:
            plan_cells.append((gid, text, True))
        mine = by_id.get(gid)
        if mine is not None and cell.cell_type == "code":
            src = mine.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            if src.strip() != cell.source.strip():
                problems.append(f"read-only cell {gid!r} was edited: the course's version was used")
    add_student_cells(previous)
    for anchor in list(added):  # below a cell the course does not have: run them last
        add_student_cells(anchor)
    return Plan(plan_cells, tests, manual, names, problems, student)


# ------------------------------------------------------------------------------- the session


class Session:
    """A sandboxed runner holding the student's namespace; restarted (cells replayed) after a crash or hang.

    ``deadline`` (time.monotonic) is the submission's budget: every cell, call and attribute read
    checks it first and gets at most what is left (no floor); past ``deadline + GRACE_SECONDS`` a
    watchdog kills the sandbox whatever is running. ``self.deadline`` may be lowered for one check."""

    def __init__(self, plan: Plan, trusted: bool, deadline: float):
        self.plan, self.trusted, self.deadline = plan, trusted, deadline
        self.hard_deadline = deadline  # never moves (self.deadline may be lowered for one check)
        self.runner: Runner | None = None
        self.bad_cells: dict[str, str] = {}  # grade_id -> why it is left out
        self.cell_errors: dict[str, str] = {}  # grade_id -> the error it raised (it stays in)
        self.restarts = 0
        self._build()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _start(self):
        if self.hard_deadline - time.monotonic() <= 0:
            raise RunnerDied("budget")
        kill_at = None if math.isinf(self.hard_deadline) else self.hard_deadline + GRACE_SECONDS
        self.runner = Runner(trusted=self.trusted, kill_at=kill_at)

    def _build(self):
        while True:
            self._start()
            try:
                for gid, source, trusted in self.plan.cells:
                    if gid in self.bad_cells:
                        continue
                    timeout = min(CELL_SECONDS if not trusted else 60.0, self.left())
                    try:
                        reply, _ = self.request(
                            {"op": "exec", "cell": gid, "source": source}, timeout
                        )
                    except RunnerDied as err:
                        if str(err) == "budget":
                            self.bad_cells[gid] = (
                                "did not run: the submission's time budget ran out"
                            )
                        elif str(err) == "timeout":
                            self.bad_cells[gid] = f"did not finish within {max(timeout, 0):.0f} s"
                        else:
                            self.bad_cells[gid] = (
                                "stopped the Python process (a crash, os._exit, or the memory limit)"
                            )
                        raise
                    if not reply.get("ok"):
                        self.cell_errors.setdefault(gid, str(reply.get("error", "error"))[:500])
                return
            except RunnerDied:
                self.runner.close()  # every error path: nothing of this runner survives
                self.restarts += 1
                if self.restarts > 6 or self.left() <= 0:
                    raise
            except BaseException:
                self.runner.close()
                raise

    def request(self, header: dict, timeout: float, blobs=()):
        """One request under the deadline: RunnerDied("budget") without sending when no time is left."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RunnerDied("budget")
        if self.runner is None or self.runner.dead:
            raise RunnerDied("died")
        try:
            return self.runner.request(header, blobs, timeout=min(timeout, left))
        except RunnerDied as err:
            if (
                str(err) == "timeout" and left <= timeout
            ):  # it was the budget that ran out, not this request's time
                raise RunnerDied("budget") from None
            raise

    def ensure(self):
        if self.runner is None or self.runner.dead:
            self.restarts += 1
            self._build()

    def defined(self, names: list[str]) -> set[str]:
        reply, _ = self.request({"op": "defined", "names": names}, 10)
        return set(reply.get("names", []))

    def close(self):
        if self.runner is not None:
            self.runner.close()

    def output(self) -> str:
        return self.runner.output() if self.runner else ""

    # -------------------------------------------------------------- calls
    def call(self, target, method, args, kwargs, attrs=()):
        """Call ``target`` (a name or handle) in the sandbox. Nothing comes back into ``args``: the driver's
        tensors stay as they were; a call that changed an input in place fails the check."""
        blobs, leaves = [], []
        codec = _codec(self)
        enc_args = [codec.encode(a, blobs, leaves) for a in args]
        enc_kwargs = {k: codec.encode(v, blobs, leaves) for k, v in kwargs.items()}
        header = {"op": "call", "target": target, "method": method, "args": enc_args, "kwargs": enc_kwargs,
                  "attrs": list(attrs)}  # fmt: skip
        name = target if isinstance(target, str) else "your code"
        timeout = min(CALL_SECONDS, self.left())
        try:
            reply, rblobs = self.request(header, CALL_SECONDS, blobs)
        except RunnerDied as err:
            if str(err) == "budget":
                raise AssertionError(
                    f"not finished: the time budget of this submission ran out before {name} was called"
                ) from None
            if str(err) == "timeout":
                raise AssertionError(
                    f"calling {name} did not return within {max(timeout, 0):.0f} s (an endless loop?)"
                ) from None
            if str(err) == "memory limit":
                raise AssertionError(
                    f"calling {name} went over the sandbox's memory limit"
                ) from None
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

    def __repr__(self):
        return f"<remote {self.type_name} {self.name}>"

    def __call__(self, *args, **kwargs):
        try:
            return self.session.call(self.handle, None, args, kwargs)
        except RemoteError as err:
            raise AssertionError(f"{self.name} raised {err}") from None

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            reply, rblobs = self.session.request(
                {"op": "getattr", "target": self.handle, "name": attr}, CALL_SECONDS
            )
        except RunnerDied as err:
            if str(err) == "budget":
                raise AssertionError(
                    f"not finished: the time budget ran out before {self.name}.{attr} was read"
                ) from None
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


@dataclass
class Verdict:
    grade_id: str
    points: float
    score: float
    message: str
    extra: bool
    seconds: float = 0.0


def _parse_call(call: str) -> tuple[str, list[str]]:
    node = ast.parse(call, mode="eval").body
    return node.func.id, [a.id for a in node.args]


def grade_plan(plan: Plan, checks: types.ModuleType, secret: bytes, student: str, trusted: bool = False,
               budget: float = BUDGET_SECONDS) -> dict:  # fmt: skip
    """Run every graded check of ``plan``; returns verdicts, problems and the (capped) printed output."""
    torch.set_num_threads(1)  # the driver's torch and the runner's must not fight over cores
    t_start = time.monotonic()
    deadline = t_start + budget
    verdicts: list[Verdict] = []
    session = None
    try:
        session = Session(plan, trusted, deadline)
    except RunnerDied:
        plan.problems.append(
            "the notebook's code could not be loaded: it crashed or hung the Python process repeatedly"
        )
    try:
        for test in plan.tests:
            t0 = time.monotonic()
            verdicts.append(_run_test(test, plan, session, checks, secret, student, deadline))
            verdicts[-1].seconds = time.monotonic() - t0
    finally:
        output = session.output() if session else ""
        if session is not None:
            for gid, why in session.bad_cells.items():
                plan.problems.append(f"cell {gid!r} {why}; it was skipped")
            session.close()
    return {"verdicts": verdicts, "problems": plan.problems, "output": output, "seconds": time.monotonic() - t_start,
            "cell_errors": dict(session.cell_errors) if session else {}}  # fmt: skip


def _run_test(test, plan, session, checks, secret, student, deadline) -> Verdict:
    def verdict(ok, message):
        return Verdict(test.grade_id, test.points, test.points if ok else 0.0, message, test.extra)

    if test.call is None:
        return verdict(
            False,
            "this test is not a graded check the sandboxed grader knows; it needs manual grading",
        )
    if session is None:
        return verdict(False, "not run: the notebook's code could not be loaded")
    if time.monotonic() >= deadline:
        return verdict(
            False,
            "not run: the time budget for this submission ran out (an earlier cell or call was too slow)",
        )
    fname, args = _parse_call(test.call)
    check = getattr(checks, fname, None)
    if check is None:
        return verdict(False, f"internal: the course has no check {fname}")
    try:
        session.ensure()
    except RunnerDied as err:
        if str(err) == "budget":
            return verdict(False, "not run: the time budget for this submission ran out")
        return verdict(False, "not run: the notebook's code crashes or hangs the Python process")
    student_args = [a for a in args if a in plan.student_names]
    defined = session.defined(list(plan.student_names))
    proxies = {
        name: Remote(session, name, name=name) for name in plan.student_names if name in defined
    }
    missing = [a for a in student_args if a not in defined]
    reference = None
    if any(a not in plan.student_names for a in args):
        reference = _reference_with(proxies)
        needed = [
            n
            for n in plan.student_names
            if n in reference and n not in defined and _uses(reference, args, n)
        ]
        missing += needed
    if missing:
        why = []
        for name in dict.fromkeys(missing):
            gid = plan.student_names.get(name)
            reason = (
                session.bad_cells.get(gid) or session.cell_errors.get(gid) or "it was not defined"
            )
            why.append(f"{name} is not available ({reason})")
        return verdict(False, "; ".join(why))
    call_args = [proxies[a] if a in proxies else reference[a] for a in args]
    seed = check_seed(secret, student, test.grade_id)
    session_deadline, session.deadline = (
        session.deadline,
        min(deadline, time.monotonic() + CHECK_SECONDS),
    )
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            check(*call_args, seed=seed)
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
    finally:
        session.deadline = session_deadline


def _uses(reference: dict, args: list[str], name: str) -> bool:
    """Whether a reference function passed to a check calls ``name`` (directly or through its callees)."""
    seen, todo = set(), [a for a in args if a in reference]
    while todo:
        fn = reference.get(todo.pop())
        if not isinstance(fn, types.FunctionType) or fn in seen:
            continue
        seen.add(fn)
        for ref in fn.__code__.co_names:
            if ref == name:
                return True
            todo.append(ref)
    return False


def summarise(verdicts: list[Verdict]) -> dict:
    core = [v for v in verdicts if not v.extra]
    extra = [v for v in verdicts if v.extra]
    return {
        "score": sum(v.score for v in core),
        "max_score": sum(v.points for v in core),
        "extra_credit": {
            "score": sum(v.score for v in extra),
            "max_score": sum(v.points for v in extra),
        },
        "grades": {
            v.grade_id: {"score": v.score, "max_score": v.points, "message": v.message}
            for v in verdicts
        },
    }


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, default=str)
