"""Grading on top of nbgrader: the sandboxed engine's verdicts, written where nbgrader expects them.

nbgrader stays the course workflow (release, collect, gradebook, formgrader, feedback, export), but
no hidden test runs inside a student's kernel any more. ``grade_submission`` plans the namespace
from the SOURCE notebook's locked cells and the student's answer cells, builds it in a bubblewrap
sandbox (``sandbox.py``, ``runner.py``) and computes every verdict in a trusted driver
(``driver.py``). ``record`` writes the scores into the nbgrader gradebook through its API and an
``autograded/<student>/<assignment>/<nb>.ipynb`` (locked cells restored, hidden tests removed, the
verdict messages as the test cells' outputs), so ``nbgrader generate_feedback``, ``nbgrader
export`` and formgrader work on top. Grade ids starting with ``ex`` are the optional extra-credit
exercises; they are reported apart from the core score everywhere.
"""

from __future__ import annotations

import copy
import csv
import os
import pathlib
import re
import subprocess
import sys
import time
import warnings

from nbconvert.exporters import NotebookExporter
from nbconvert.preprocessors import Preprocessor
from nbgrader.plugins import ExportPlugin
from nbgrader.preprocessors import GetGrades, SaveAutoGrades
from traitlets import Dict, Float, validate

from mlbook_tools.config import layout
from mlbook_tools.inert import csv_cell
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits
from mlbook_tools.result import CellGrade, GradingResult, is_extra

CODE_STUB = (
    '# YOUR CODE HERE\nraise NotImplementedError("replace this line with your implementation")'
)


class RedactHiddenTests(Preprocessor):
    """For feedback: drop hidden-test regions and cut test-cell tracebacks down to ``Error: message``.

    nbgrader's ClearHiddenTests removes the hidden source, but an error's traceback quotes the
    hidden lines that raised it; students keep the message (written for them) and nothing else.
    """

    enabled = True
    begin, end = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            return cell, resources
        kept, hidden = [], False
        for line in cell.source.split("\n"):
            if self.begin in line:
                hidden = True
            elif self.end in line:
                hidden = False
            elif not hidden:
                kept.append(line)
        cell.source = "\n".join(kept)
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                out.traceback = [f"{out.ename}: {out.evalue}"]
        return cell, resources


class GetGradesWithStatus(GetGrades):
    """nbgrader's GetGrades, plus what its 0.0 placeholder hides: whether the cell awaits manual grading."""

    def _get_score(self, cell, resources):
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)  # fmt: skip
        cell.metadata.nbgrader["needs_manual_grade"] = bool(grade.needs_manual_grade)


class CoreExtraSummary(Preprocessor):
    """For feedback: the header shows the core points and the extra credit apart (the numbers ``mlbook
    grade`` prints), each extra-credit cell its possible points, and ungraded written answers as awaiting."""

    enabled = True

    def preprocess(self, nb, resources):
        import nbformat

        from mlbook_tools.driver import cell_points

        result = GradingResult()
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if not meta.get("grade"):
                continue
            gid = meta.get("grade_id", "")
            result.grades[gid] = CellGrade(gid, float(meta.get("score") or 0.0), cell_points(cell),
                                           awaiting_manual=bool(meta.get("needs_manual_grade")))  # fmt: skip
            meta["points"] = cell_points(cell)  # what the cell may earn, shown next to its score
            meta["mlbook_extra_credit"] = is_extra(gid)  # the page's label (result.py decides)
        core, extra = result.core, result.extra
        waiting = [g.grade_id for g in result.grades.values() if g.awaiting_manual]
        info = resources.setdefault("nbgrader", {})
        info["score"], info["max_score"] = core.score, core.max_score
        info["extra_credit"], info["extra_credit_max"] = extra.score, extra.max_score
        lines = [
            f"**Core: {core.score:g} / {core.max_score:g} points.** Extra credit: {extra.score:g} / {extra.max_score:g} (optional, counted apart)."
        ]
        if waiting:
            lines.append("Awaiting manual grading: " + ", ".join(waiting) + ".")
        nb.cells.insert(0, nbformat.v4.new_markdown_cell("\n\n".join(lines)))
        return nb, resources


class CapOutputs(Preprocessor):
    """For feedback: every printed output cut to a readable length (a 50 MB line stays out)."""

    enabled = True
    limit = 2000

    def preprocess_cell(self, cell, resources, index):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and len(out.get("text", "")) > self.limit:
                out["text"] = (
                    out["text"][: self.limit]
                    + f"\n... [{len(out['text']) - self.limit} more characters]"
                )
            for key, value in list(out.get("data", {}).items()):
                if key.startswith("text/") and isinstance(value, str) and len(value) > self.limit:
                    out["data"][key] = value[: self.limit] + "\n... [cut]"
        return cell, resources


class SandboxedExecute(Preprocessor):
    """``nbgrader autograde`` (and so formgrader's per-student Autograde button) through the sandboxed engine.

    Configured in the course's ``nbgrader_config.py`` in place of nbgrader's ``Execute``: no student
    code runs in a kernel of the grader. The engine grades the sanitized notebook (nbgrader has
    restored the locked cells) exactly as ``mlbook grade-class`` does, and each test cell gets its
    verdict as output, its hidden tests removed; ``SaveAutoGradesExtraCredit`` then stores the
    scores. If the sandbox cannot start, autograding stops with a message naming ``mlbook grade-class``.
    """

    enabled = True
    budget = Float(
        None,
        allow_none=True,
        help="charged seconds per submission (default: GradingLimits.budget_seconds)",
    ).tag(config=True)
    limits = Dict(
        help="grading limits on top of GradingLimits' defaults (mlbook_tools/limits.py), e.g. "
        '{"memory_bytes": 2 * 1024**3, "cell_seconds": 30}; an unknown name is refused. '
        "`mlbook grade` and `mlbook grade-class` read them too.",
    ).tag(config=True)

    @validate("limits")
    def _known_limits(self, proposal):
        GradingLimits.from_dict(proposal["value"])  # UnknownLimit names the key and the known ones
        return proposal["value"]

    def preprocess(self, nb, resources):
        import nbformat

        from mlbook_tools import driver, sandbox

        t0 = (
            time.monotonic()
        )  # the wall-clock backstop counts from here (the exporter read the file)
        limits = DEFAULT_LIMITS.updated(self.limits)
        if self.budget:
            limits = limits.replace(budget_seconds=float(self.budget))
        info = resources["nbgrader"]
        course = (
            pathlib.Path(resources["metadata"]["path"]).resolve().parents[2]
        )  # autograded/<student>/<id>
        if not (course / "source").is_dir():
            course = pathlib.Path.cwd()
        mine = nb.metadata.get("mlbook")
        refused = (
            mine.get(REFUSED) if isinstance(mine, dict) else None
        )  # BoundedNotebookExporter's mark
        trusted = sandbox.trusted_mode()
        why = None if trusted or refused else sandbox.check_available()
        if why:
            raise sandbox.SandboxUnavailable(
                f"{why}\nnbgrader autograde stopped: in this course it grades only through the sandbox. "
                "Run `mlbook grade-class` (it says the same) or, for trusted files only, set MLBOOK_TRUSTED=1."
            )
        source_nb, checks, secret = load_course(course, info["assignment"])
        if refused:  # the course's release stands in for a submission past a bound: nothing is run
            result = refused_result(source_nb, driver.TooLarge(str(refused)))
        else:
            wall = t0 + limits.budget_seconds * limits.wall_factor
            result, _ = grade_submission(nbformat.writes(nb), source_nb, checks, secret, info["student"], trusted=trusted,
                                         wall_deadline=wall, limits=limits)  # fmt: skip
        resources["mlbook_grades"] = result.grades
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            cell.source = _without_hidden(cell.source)
            cell.outputs = verdict_outputs(result.grades.get(meta.get("grade_id")))
        notes = [n for n in dict.fromkeys([result.error, *(result.problems or [])]) if n]
        if notes:
            nb.cells.insert(
                0,
                nbformat.v4.new_markdown_cell(
                    "**Grading notes**\n\n" + "\n".join(f"* {n}" for n in notes)
                ),
            )
        nb.metadata["mlbook"] = {"graded_by": "nbgrader autograde through the sandboxed engine"}
        return nb, resources


REFUSED = (
    "refused"  # notebook metadata mlbook.refused: the submission was past a bound (set only below)
)


class BoundedNotebookExporter(NotebookExporter):
    """``nbgrader autograde``'s reader (``c.Autograde.exporter_class``): a submission is bounded before it
    is parsed (``driver.read_submission``/``check_bounds``: size, cells, outputs, nesting). One past a bound
    becomes the course's release notebook marked ``mlbook.refused``, which ``SandboxedExecute`` grades
    as 0 with the "too large: ..." line as its grading note: recorded for that student only, in a second."""

    def from_file(self, file_stream, resources=None, **kw):
        import nbformat

        from mlbook_tools import driver

        try:
            size = os.fstat(file_stream.fileno()).st_size
        except (OSError, AttributeError, ValueError):
            size = 0
        limits = limits_from_config(self.config)
        text = file_stream.read(limits.max_notebook_bytes + 1)
        sanitizing = getattr(self.parent, "_sanitizing", True)
        try:
            driver._check_raw(text, max(size, len(text)), limits)
            driver.check_bounds(text, limits)
        except driver.TooLarge as err:
            return self.from_notebook_node(
                self._stub(resources, str(err)), resources=resources, **kw
            )
        except driver.CannotGrade:
            pass  # nbgrader's own reader says what is wrong with it
        nb = nbformat.reads(text, as_version=4)
        mine = nb.metadata.get("mlbook")
        if sanitizing and isinstance(mine, dict):
            mine.pop(REFUSED, None)  # a student cannot write the marker
        return self.from_notebook_node(nb, resources=resources, **kw)

    def _stub(self, resources, why: str):
        import nbformat

        info = (resources or {}).get("nbgrader", {})
        coursedir = getattr(self.parent, "coursedir", None)
        root = pathlib.Path(getattr(coursedir, "root", ".") or ".")
        assignment, name = (
            info.get("assignment", ""),
            info.get("notebook", info.get("assignment", "")),
        )
        release = root / "release" / assignment / f"{name}.ipynb"
        nb = nbformat.read(
            release, as_version=4
        )  # generate_assignment wrote it: stubs, no hidden tests
        nb.metadata["mlbook"] = {REFUSED: why}
        return nb


class SaveAutoGradesExtraCredit(SaveAutoGrades):
    """nbgrader's SaveAutoGrades; an extra-credit test (``ex*``, 0 points) stores its result as ``extra_credit``."""

    def _add_score(self, cell, resources):
        super()._add_score(cell, resources)
        gid = cell.metadata["nbgrader"]["grade_id"]
        got = resources.get("mlbook_grades", {}).get(gid)
        if is_extra(gid) and not cell.metadata["nbgrader"].get("solution") and got:
            grade = self.gradebook.find_grade(
                gid, self.notebook_id, self.assignment_id, self.student_id
            )
            grade.auto_score, grade.extra_credit = 0.0, float(got.score)
            self.gradebook.db.commit()


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

    from mlbook_tools.driver import cell_points

    nb = nbformat.read(source, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: cell_points(c) for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")}  # fmt: skip


def assignment_points(course: pathlib.Path, assignment: str) -> dict[str, float] | None:
    """``course_points`` of the assignment's source notebook in ``course``; None when it is not there."""
    source = course / "source" / assignment / f"{assignment}.ipynb"
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


class CoreExtraCsvExport(ExportPlugin):
    """``nbgrader export``: one row per student and assignment, core points and extra credit apart.

    Extra credit (grade ids ``ex*``) is nbgrader's ``extra_credit``: nbgrader's own CSV adds it into
    ``score`` over a ``max_score`` without it; here ``score``/``max_score`` are the core points and
    ``extra_credit``/``extra_credit_max`` the optional ones, the same numbers ``mlbook grade`` prints.
    """

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        keys = STANDARD_COLUMNS + [
            "extra_credit",
            "extra_credit_max",
            "needs_manual_grade",
            "status",
        ]
        root = export_course(self)
        with open(self.to or "grades.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            for assignment in gradebook.assignments:
                points = assignment_points(root, assignment.name) or {}
                for student in gradebook.students:
                    row = dict(assignment=assignment.name, student_id=student.id, last_name=student.last_name or "",
                               first_name=student.first_name or "")  # fmt: skip
                    try:
                        sub = gradebook.find_submission(assignment.name, student.id)
                    except MissingEntry:  # no submission: zero, like nbgrader's own export
                        sub = None
                    if sub is None:
                        scores, manual = GradingResult.unsubmitted(points), False
                    else:
                        scores = GradingResult.from_submission(sub, points)
                        manual = bool(sub.needs_manual_grade)
                    core, extra = scores.core, scores.extra
                    row.update(score=core.score, max_score=core.max_score, extra_credit=extra.score,
                               extra_credit_max=extra.max_score, needs_manual_grade=manual)  # fmt: skip
                    row.update(standard_columns(assignment, student, sub, core.score))
                    row["status"] = submission_status(root, assignment.name, student.id, sub)
                    writer.writerow(
                        {k: csv_cell(v) for k, v in row.items()}
                    )  # a name is never a formula


# nbgrader's own CSV columns, in its order (``score`` here is the core score, late penalty taken off).
STANDARD_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
                    "email", "raw_score", "late_submission_penalty", "score", "max_score"]  # fmt: skip


def standard_columns(assignment, student, sub, core: float) -> dict:
    """nbgrader's columns for one row: raw_score is the core score before the late penalty."""
    penalty = float(sub.late_submission_penalty or 0.0) if sub is not None else 0.0
    stamp = sub.timestamp if sub is not None and sub.timestamp else ""
    return {"duedate": assignment.duedate or "", "timestamp": stamp, "email": student.email or "",
            "raw_score": core, "late_submission_penalty": penalty, "score": max(0.0, core - penalty)}  # fmt: skip


# ------------------------------------------------------------------------------------ the engine

OUTPUT_CAP = 2000  # characters of one printed output kept in autograded notebooks and feedback


def load_course(course: pathlib.Path, assignment: str):
    """(source notebook, graded checks module, course secret) of one assignment."""
    import nbformat

    from mlbook_tools import driver

    source = course / "source" / assignment / f"{assignment}.ipynb"
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: run `mlbook build` first")
    return (
        nbformat.read(source, as_version=4),
        driver.load_checks(layout().checks),
        driver.course_secret(course),
    )


def limits_from_config(config) -> GradingLimits:
    """The limits a course's nbgrader config sets (``c.SandboxedExecute.limits`` and ``.budget``)."""
    section = config.get("SandboxedExecute", {}) if config is not None else {}
    limits = DEFAULT_LIMITS.updated(section.get("limits") or {})
    if section.get("budget"):
        limits = limits.replace(budget_seconds=float(section["budget"]))
    return limits


def course_limits(course: pathlib.Path) -> GradingLimits:
    """``limits_from_config`` of ``course/nbgrader_config.py``; the defaults where it has none."""
    from traitlets.config.loader import PyFileConfigLoader

    path = pathlib.Path(course) / "nbgrader_config.py"
    if not path.is_file():
        return DEFAULT_LIMITS
    return limits_from_config(PyFileConfigLoader(path.name, str(path.parent)).load_config())


def refused_result(source_nb, err: Exception) -> GradingResult:
    """The result of a file that cannot be graded (unreadable, or past a bound): every test 0, ``err`` its note."""
    from mlbook_tools import driver

    empty = driver.make_plan(
        source_nb, '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    grades = {
        t.grade_id: CellGrade(t.grade_id, 0.0, t.points, f"not graded: {err}") for t in empty.tests
    }
    return GradingResult(grades, dict(empty.manual), problems=[str(err)], output="", seconds=0.0,
                         cell_errors={}, error=str(err))  # fmt: skip


def grade_submission(text: str, source_nb, checks, secret: bytes, student: str, trusted: bool = False,
                     wall_deadline: float | None = None, limits: GradingLimits = DEFAULT_LIMITS) -> tuple[GradingResult, object]:  # fmt: skip
    """Grade one notebook's text: (its GradingResult, the plan or None).

    ``limits.budget_seconds``: charged seconds; ``wall_deadline`` (time.monotonic): the wall-clock
    backstop, which the entry points count from reading the file."""
    from mlbook_tools import driver

    try:
        plan = driver.make_plan(source_nb, text, limits)
    except driver.CannotGrade as err:
        return refused_result(source_nb, err), None
    run = driver.grade_plan(
        plan, checks, secret, student, trusted=trusted, wall_deadline=wall_deadline, limits=limits
    )
    grades = {
        v.grade_id: CellGrade(v.grade_id, v.score, v.points, v.message) for v in run["verdicts"]
    }
    result = GradingResult(grades, dict(plan.manual), problems=run["problems"], output=run["output"],
                           seconds=round(run["seconds"], 2), cell_errors=run["cell_errors"])  # fmt: skip
    return result, plan


def grade_notebook(path: str | pathlib.Path, assignment: str = "rlhf_ppo", timeout: float | None = None,
                   course: pathlib.Path | None = None, trusted: bool = False, student: str = "student",
                   limits: GradingLimits | None = None) -> GradingResult:  # fmt: skip
    """Grade one notebook with the sandboxed engine (``mlbook grade``); no gradebook is touched.

    ``limits``: by default the course config's (``course_limits``); ``timeout``, if given, replaces
    their ``budget_seconds``; the wall-clock backstop (``wall_factor`` x it) counts from here."""
    from mlbook_tools import driver

    t0 = time.monotonic()
    course_dir = pathlib.Path(course) if course else layout().course
    limits = limits or course_limits(course_dir)
    if timeout:
        limits = limits.replace(budget_seconds=float(timeout))
    source_nb, checks, secret = load_course(course_dir, assignment)
    try:
        text = driver.read_submission(path, limits)  # bounded before it is read whole
    except driver.TooLarge as err:
        return refused_result(source_nb, err)
    result, _ = grade_submission(text, source_nb, checks, secret, student, trusted=trusted, limits=limits,
                                 wall_deadline=t0 + limits.budget_seconds * limits.wall_factor)  # fmt: skip
    result.seconds = round(time.monotonic() - t0, 2)
    return result


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` without control characters but newline and tab: a student's error message cannot move
    a terminal's cursor, hide lines or recolour a report (ANSI escapes)."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", str(text))


def _cap(text: str, limit: int = OUTPUT_CAP) -> str:
    text = printable(text)
    return (
        text
        if len(text) <= limit
        else text[:limit] + f"\n... [{len(text) - limit} more characters not shown]"
    )


def _cap_outputs(outputs: list) -> list:
    """A student's stored outputs as the autograded notebook keeps them: inert and capped (inert.py)."""
    from mlbook_tools.inert import inert_outputs

    return inert_outputs(outputs)


def _without_hidden(source: str) -> str:
    kept, hidden = [], False
    for line in source.split("\n"):
        if RedactHiddenTests.begin in line:
            hidden = True
        elif RedactHiddenTests.end in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept).rstrip()


def _added(cell):
    """A cell the student added, as the autograded notebook keeps it (inert.py): no active content."""
    from mlbook_tools.inert import inert_cell

    cell = copy.deepcopy(cell)
    inert_cell(cell, added=True)
    return cell


def _inert_attachments(attachments, source: str) -> dict:
    from mlbook_tools.inert import inert_attachments

    return inert_attachments(attachments, source)


def verdict_outputs(grade: CellGrade | None) -> list:
    """A test cell's outputs for a verdict: ``passed (2 / 2)`` on stdout, else the message as an
    AssertionError (capped, printable); no verdict at all is "not graded"."""
    import nbformat

    if grade is not None and grade.passed:
        return [nbformat.v4.new_output("stream", name="stdout",
                                       text=f"passed ({grade.score:g} / {grade.max_score:g})\n")]  # fmt: skip
    message = _cap((grade.message or "") if grade is not None else "not graded")
    return [nbformat.v4.new_output("error", ename="AssertionError", evalue=message,
                                   traceback=[f"AssertionError: {message}"])]  # fmt: skip


def autograded_notebook(source_nb, plan, result: GradingResult):
    """The notebook nbgrader's feedback and formgrader read: source order, locked cells restored, verdicts as outputs."""
    import nbformat

    from mlbook_tools import driver

    student = plan.notebook if plan is not None else None
    by_id, extras, last = {}, {None: []}, None
    for cell in student.cells if student is not None else []:
        gid = driver._meta(cell).get("grade_id") if isinstance(cell, dict) else None
        if isinstance(gid, str) and gid not in by_id:
            by_id[gid], last = cell, gid
            extras.setdefault(gid, [])
        elif gid is None and cell.get("cell_type") in ("code", "markdown"):
            extras.setdefault(last, []).append(cell)
    cells = []
    if result.error or result.problems:
        lines = [
            f"* {p}" for p in ([result.error] if result.error else []) + (result.problems or [])
        ]
        cells.append(nbformat.v4.new_markdown_cell("**Grading notes**\n\n" + "\n".join(lines)))
    cells += [_added(c) for c in extras[None]]
    for src in source_nb.cells:
        meta = src.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        mine = by_id.get(gid)
        cell = copy.deepcopy(src)
        if meta.get("solution") and mine is not None:
            text = mine.get("source", "")
            cell.source = "".join(text) if isinstance(text, list) else str(text)
            if cell.cell_type == "markdown":  # the student's images only (inert.py)
                cell.pop("attachments", None)
                if images := _inert_attachments(mine.get("attachments"), cell.source):
                    cell.attachments = images
        elif meta.get("solution"):
            cell.source = ""
        if cell.cell_type == "code":
            cell.source = _without_hidden(cell.source) if meta.get("grade") else cell.source
            cell.outputs = (
                _cap_outputs(mine.get("outputs", []))
                if mine is not None and not meta.get("grade")
                else []
            )
            cell.execution_count = None
            if meta.get("grade") and gid in result.grades:
                cell.outputs = verdict_outputs(result.grades[gid])
        cells.append(cell)
        cells += [_added(c) for c in extras.get(gid, [])] if gid in by_id else []
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(source_nb.metadata))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return nb


def record(
    course: pathlib.Path,
    assignment: str,
    student: str,
    result: GradingResult,
    source_nb,
    notebook: str | None,
) -> None:
    """Scores into the nbgrader gradebook (through its API) and the autograded notebook next to it."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    nb_name = assignment
    out = course / "autograded" / student / assignment / f"{nb_name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    if notebook:  # whole or not at all: written next to it, then renamed over it
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(notebook.encode("utf-8", errors="backslashreplace"))
        tmp.replace(out)
    with (
        Gradebook(f"sqlite:///{(course / 'gradebook.db').resolve()}") as gb,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # SQLAlchemy autoflush notes from inside nbgrader's own API
        try:  # a name formgrader can show ("None, None" otherwise); never overwrite a real one
            gb.find_student(student)
        except MissingEntry:
            gb.add_student(student, last_name=student, first_name="")
        stamp = (
            course / "submitted" / student / assignment / "timestamp.txt"
        )  # as nbgrader collects it
        try:  # the student's client writes it: one that does not parse is ignored, never fatal
            when = (
                {
                    "timestamp": parse_utc(
                        stamp.open("rb").read(200).decode(errors="replace").strip()
                    )
                }
                if stamp.is_file()
                else {}
            )
        except (ValueError, OverflowError, OSError):
            when = {}
        gb.update_or_create_submission(assignment, student, **when)
        blanks = blank_written_answers(notebook)
        for cell in source_nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if not meta.get("grade"):
                continue
            grade = gb.find_grade(meta["grade_id"], nb_name, assignment, student)
            if meta.get("solution"):  # a written answer: formgrader's job
                if meta["grade_id"] in blanks:  # as nbgrader's Autograde (button): untouched is 0
                    grade.auto_score, grade.needs_manual_grade = 0.0, False
                    continue
                grade.auto_score = None
                grade.needs_manual_grade = grade.manual_score is None
                continue
            got = result.grades.get(meta["grade_id"])
            score = float(got.score) if got else 0.0
            if is_extra(meta["grade_id"]):  # nbgrader's extra credit: 0 points + a bonus
                grade.auto_score, grade.extra_credit = 0.0, score
            else:
                grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None
        if result.error:  # unreadable: formgrader flags it for a person, never a plain 0
            flag_unreadable(gb, assignment, student)
        gb.db.commit()


# ------------------------------------------------ one status everywhere (grade-class, button, exports)

TEXT_STUB = "YOUR ANSWER HERE"  # nbgrader's ClearSolutions.text_stub in this course's config


def blank_written_answers(notebook: str | None) -> set[str]:
    """Grade ids of written answers (graded markdown answer cells) left as released or emptied.

    nbgrader's Autograde (formgrader's button) scores such a cell 0 with no manual grading needed
    (its checksum is unchanged); grade-class records the same, so both say one thing."""
    import json

    if not notebook:
        return set()
    try:
        cells = json.loads(notebook).get("cells", [])
    except ValueError:
        return set()
    out = set()
    for cell in cells:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if cell.get("cell_type") == "markdown" and meta.get("solution") and meta.get("grade"):
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            if src.strip() in ("", TEXT_STUB):
                out.add(meta.get("grade_id"))
    return out


def flag_unreadable(gb, assignment: str, student: str) -> None:
    """Every grade of an unreadable submission needs a person: formgrader lists it as needing
    manual grading (its autograded notebook says why), the exports' status says unreadable."""
    sub = gb.find_submission(assignment, student)
    for nb in sub.notebooks:
        for grade in nb.grades:
            grade.needs_manual_grade = True


def submission_status(course: pathlib.Path, assignment: str, student: str, sub) -> str:
    """What the exports' ``status`` column says: graded, needs manual grading, unreadable: why,
    misnamed: <file> (rename it to grade it), or no submission."""
    import json

    state = course / ".mlbook_grading" / assignment / f"{student}.json"
    try:
        saved = json.loads(state.read_text()) if state.is_file() else {}
    except (OSError, ValueError):
        saved = {}
    if saved.get("misnamed") and sub is None:
        return f"misnamed: {', '.join(saved['misnamed'])} (expected {assignment}.ipynb)"
    if sub is None:
        return "no submission"
    if saved.get("error"):
        return "unreadable: " + printable(str(saved["error"]))[:200]
    return "needs manual grading" if sub.needs_manual_grade else "graded"
