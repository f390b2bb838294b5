"""Grading on top of nbgrader: the sandboxed engine's entry points and the gradebook.

nbgrader stays the course workflow (release, collect, gradebook, formgrader, feedback, export), but
no hidden test runs inside a student's kernel any more. ``grade_submission`` plans the namespace
from the SOURCE notebook's locked cells and the student's answer cells, builds it in a bubblewrap
sandbox (``sandbox.py``, ``inside/runner.py``) and computes every verdict in a trusted driver
(``driver.py`` and its parts): one ``GradingResult`` (``result.py``). ``gradebook.record`` writes its
scores into the nbgrader gradebook through its API, next to the autograded notebook
(``feedback.autograded_notebook``), so ``nbgrader generate_feedback``, ``nbgrader export`` and
formgrader work on top. The course's nbgrader
plugins are in ``plugins.py``, what students read in ``feedback.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import subprocess
import sys
import time

from mlbook_tools import cells as vocab  # the cell vocabulary
from mlbook_tools.config import assignment as configured
from mlbook_tools.config import layout, source_in
from mlbook_tools.gradebook import blank_written_answers
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits, limits_from_config
from mlbook_tools.result import CellGrade, GradingResult

KERNEL_AUTOGRADE = """
# A reference course: plain `nbgrader autograde`, the notebook executed in a real kernel, unconfined
# (nbgrader's own preprocessors; warnings on stderr ignored, as a student's course would set it).
c.Autograde.autograde_preprocessors = ["nbgrader.preprocessors.Execute", "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata"]
c.Execute.timeout = 120
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"(?i)warning"
"""


def use_kernel_autograde(course: pathlib.Path) -> None:
    """Make a (scratch) course copy's `nbgrader autograde` plain nbgrader again: the reference the
    sandboxed engine is compared with (tests, benchmark). Never for a course with real submissions."""
    config = course / "nbgrader_config.py"
    config.write_text(config.read_text() + KERNEL_AUTOGRADE)


def run_nbgrader(
    args: list[str], cwd: pathlib.Path, check: bool = True
) -> subprocess.CompletedProcess:
    """Run an nbgrader command in ``cwd`` with this interpreter (its bin/ first on PATH: nbgrader calls alembic)."""
    env = {
        **os.environ,
        "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    try:  # a scratch course outside the repo: its autograde (the sandboxed engine) still finds the checks
        env.setdefault("MLBOOK_ROOT", str(layout().root))
    except FileNotFoundError:
        pass
    cmd = [sys.executable, "-m", "nbgrader", *args, "--log-level=ERROR"]
    run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if check and run.returncode != 0:
        raise RuntimeError(
            f"nbgrader {' '.join(args)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
        )
    return run


def course_points(source: pathlib.Path) -> dict[str, float]:
    """Points of every graded cell of a source notebook (extra credit: the points it may earn)."""
    import nbformat

    nb = nbformat.read(source, as_version=4)
    return {vocab.grade_id(c): vocab.points(c) for c in nb.cells if vocab.is_graded(c)}


def assignment_points(course: pathlib.Path, assignment: str) -> dict[str, float] | None:
    """``course_points`` of the assignment's source notebook in ``course``; None when it is not there."""
    source = source_in(course, assignment)
    return course_points(source) if source.exists() else None


def export_course(plugin) -> pathlib.Path:
    """The course folder an ``nbgrader export`` plugin runs in (its app's course directory)."""
    return pathlib.Path(getattr(getattr(plugin.parent, "coursedir", None), "root", ".") or ".")


def read_scores(gradebook: pathlib.Path, assignment: str, student: str) -> dict:
    """Scores of one submission from an nbgrader gradebook (the course folder holding it), as ``mlbook
    grade`` sums them: ``GradingResult.from_submission``'s JSON form."""
    from nbgrader.api import Gradebook

    points = assignment_points(gradebook.parent, assignment)
    with Gradebook(f"sqlite:///{gradebook.resolve()}") as gb:
        return GradingResult.from_submission(
            gb.find_submission(assignment, student), points
        ).to_dict()


# ------------------------------------------------------------------------------------ the engine


def load_course(course: pathlib.Path, assignment: str):
    """(source notebook, graded checks module, course secret) of one assignment (its checks: the
    configured ``Assignment.checks``)."""
    import nbformat

    from mlbook_tools import judge

    source = source_in(course, assignment)
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: run `mlbook build` first")
    return (
        nbformat.read(source, as_version=4),
        judge.load_checks(configured(assignment).checks),
        judge.course_secret(course),
    )


def course_limits(course: pathlib.Path) -> GradingLimits:
    """``limits_from_config`` of ``course/nbgrader_config.py``; the defaults where it has none."""
    from traitlets.config.loader import PyFileConfigLoader

    path = pathlib.Path(course) / "nbgrader_config.py"
    if not path.is_file():
        return DEFAULT_LIMITS
    literal = _literal_settings(path)
    if literal is not None:
        return limits_from_config({"SandboxedExecute": literal})
    return limits_from_config(PyFileConfigLoader(path.name, str(path.parent)).load_config())


def _literal_settings(path: pathlib.Path) -> dict | None:
    """``c.SandboxedExecute.limits`` / ``.budget`` of a config file whose every SandboxedExecute
    setting is such a top-level assignment of a literal: read without running the file, which imports
    nbgrader's and the course's plugins (a second of a `mlbook grade` otherwise). None for any other
    form (set in a block, computed, a sub-config): the file is then run, as nbgrader runs it."""
    import ast

    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    if "load_subconfig" in ast.dump(tree):
        return None
    top = {id(stmt) for stmt in tree.body}
    found: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "SandboxedExecute":
            return None  # c["SandboxedExecute"], getattr(c, ...): not read here
        if not (isinstance(node, ast.Attribute) and node.attr == "SandboxedExecute"):
            continue
        owner = next(
            (
                stmt
                for stmt in tree.body
                if isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Attribute)
                and stmt.targets[0].value is node
            ),
            None,
        )
        if (
            owner is None
            or id(owner) not in top
            or owner.targets[0].attr not in ("limits", "budget")
        ):
            return None
        try:
            found[owner.targets[0].attr] = ast.literal_eval(owner.value)
        except ValueError:
            return None
    return found


def refused_result(source_nb, err: Exception) -> GradingResult:
    """The result of a file that cannot be graded (unreadable, or past a bound): every test 0, ``err`` its note."""
    from mlbook_tools.plan import make_plan

    empty = make_plan(
        source_nb, '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    grades = {
        t.grade_id: CellGrade(t.grade_id, 0.0, t.points, f"not graded: {err}") for t in empty.tests
    }
    return GradingResult(
        grades,
        dict(empty.manual),
        problems=[str(err)],
        output="",
        seconds=0.0,
        cell_errors={},
        error=str(err),
    )


def grade_submission(
    text: str,
    source_nb,
    checks,
    secret: bytes,
    student: str,
    trusted: bool = False,
    wall_deadline: float | None = None,
    limits: GradingLimits = DEFAULT_LIMITS,
    starting=None,
    assignment: str | None = None,
) -> tuple[GradingResult, object]:
    """Grade one notebook's text: (its GradingResult, the plan or None).

    ``assignment``: the configured assignment's name (default: the first); its reference module
    supplies a check's parameters that no answer cell defines (``judge.grade_plan``).

    ``limits.budget_seconds``: charged seconds; ``wall_deadline`` (time.monotonic): the wall-clock
    backstop, which the entry points count from reading the file. ``starting``: a ``starting.Starting``
    with these bounds, the first runner (its owner closes it if it is not taken)."""
    from mlbook_tools.errors import CannotGrade
    from mlbook_tools.judge import grade_plan
    from mlbook_tools.plan import make_plan

    try:
        plan = make_plan(source_nb, text, limits)
    except CannotGrade as err:
        return refused_result(source_nb, err), None
    run = grade_plan(
        plan,
        checks,
        secret,
        student,
        trusted=trusted,
        wall_deadline=wall_deadline,
        limits=limits,
        starting=starting,
        assignment=assignment,
    )
    written = [gid for gid, _ in plan.manual]
    blank = blank_written_answers(plan.notebook) & set(written)  # 0, nothing to grade by hand
    grades = {v.grade_id: CellGrade(v.grade_id, v.score, v.points, v.message) for v in run.verdicts}
    result = GradingResult(
        grades,
        dict(plan.manual),
        problems=list(run.problems),
        output=run.output,
        seconds=round(run.seconds, 2),
        cell_errors=run.cell_errors,
        blank=sorted(blank),
    )
    return result, plan


def grade_notebook(
    path: str | pathlib.Path,
    assignment: str | None = None,
    budget: float | None = None,
    course: pathlib.Path | None = None,
    trusted: bool = False,
    student: str = "student",
    limits: GradingLimits | None = None,
) -> GradingResult:
    """Grade one notebook with the sandboxed engine (``mlbook grade``); no gradebook is touched.

    ``assignment``: a configured assignment's name (``config.assignment``; default: the first).

    ``limits``: by default the course config's (``course_limits``); ``budget``, if given, replaces
    their ``budget_seconds``; the wall-clock backstop (``wall_factor`` x it) counts from here.

    The sandbox starts first, on a thread (``starting.Starting``): its start-up runs on one core while
    this process imports torch and nbformat (``judge``) and plans the cells on another."""
    from mlbook_tools.starting import Starting

    t0 = time.monotonic()
    course_dir = pathlib.Path(course) if course else layout().course
    limits = limits or course_limits(course_dir)
    if budget:
        limits = limits.replace(budget_seconds=float(budget))
    wall_deadline = t0 + limits.budget_seconds * limits.wall_factor
    starting = Starting(  # the bounds Session._start gives its first runner
        trusted=trusted,
        start_timeout=min(limits.start_seconds, wall_deadline - time.monotonic()),
        kill_at=None if math.isinf(wall_deadline) else wall_deadline + limits.grace_seconds,
        limits=limits,
    )
    try:
        from mlbook_tools import judge, submission  # noqa: F401 - torch, nbformat: while the sandbox starts
        from mlbook_tools.errors import TooLarge

        assignment = configured(assignment).name
        source_nb, checks, secret = load_course(course_dir, assignment)
        try:
            text = submission.read_submission(path, limits)  # bounded before it is read whole
        except TooLarge as err:
            return refused_result(source_nb, err)
        result, _ = grade_submission(
            text,
            source_nb,
            checks,
            secret,
            student,
            trusted=trusted,
            limits=limits,
            wall_deadline=wall_deadline,
            starting=starting,
            assignment=assignment,
        )
    finally:
        starting.close()  # a refused file, or a budget spent before the sandbox was needed
    return dataclasses.replace(result, seconds=round(time.monotonic() - t0, 2))
