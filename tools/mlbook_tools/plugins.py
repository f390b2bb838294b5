"""The course's nbgrader plugins: ``nbgrader autograde`` through the sandboxed engine
(``SandboxedExecute``, ``BoundedNotebookExporter``, ``SaveAutoGradesExtraCredit``) and ``nbgrader
export``'s core/extra-credit CSV (``CoreExtraCsvExport``). ``autograde/nbgrader_config.py`` names them;
the feedback page's preprocessors are in ``feedback.py``, the engine's entry points in ``grading.py``."""

from __future__ import annotations

import json
import os
import pathlib
import time

from nbconvert.exporters import NotebookExporter
from nbconvert.preprocessors import Preprocessor
from nbgrader.plugins import ExportPlugin
from nbgrader.preprocessors import SaveAutoGrades
from traitlets import Dict, Float, validate

from mlbook_tools.cells import grade_id, is_solution, is_test
from mlbook_tools.export import csv_cell, csv_writer
from mlbook_tools.feedback import grading_notes, strip_hidden_tests, verdict_outputs
from mlbook_tools.gradebook import submission_status
from mlbook_tools.grading import (
    assignment_points,
    export_course,
    grade_submission,
    load_course,
    refused_result,
)
from mlbook_tools.inert import inert_notebook
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits, limits_from_config
from mlbook_tools.result import GradingResult, is_extra

CODE_STUB = (
    '# YOUR CODE HERE\nraise NotImplementedError("replace this line with your implementation")'
)


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

        from mlbook_tools import confine, sandbox
        from mlbook_tools.errors import TooLarge

        t0 = (
            time.monotonic()
        )  # the wall-clock backstop counts from here (the exporter read the file)
        limits = DEFAULT_LIMITS.updated(self.limits)
        if self.budget:
            limits = limits.replace(budget_seconds=float(self.budget))
        info = resources["nbgrader"]
        from mlbook_tools.exchange import student_id_problem

        if why := student_id_problem(str(info["student"])):  # collect and grade-class refuse it too
            raise ValueError(
                f"not autograded: {why}; rename its folder in submitted/ to such an id"
            )
        course = (
            pathlib.Path(resources["metadata"]["path"]).resolve().parents[2]
        )  # autograded/<student>/<id>
        if not (course / "source").is_dir():
            course = pathlib.Path.cwd()
        mine = nb.metadata.get("mlbook")
        refused = (
            mine.get(REFUSED) if isinstance(mine, dict) else None
        )  # BoundedNotebookExporter's mark
        trusted = confine.trusted_mode()
        why = None if trusted or refused else sandbox.check_available(limits)
        if why:
            raise sandbox.SandboxUnavailable(
                f"{why}\nnbgrader autograde stopped: in this course it grades only through the sandbox. "
                "Run `mlbook grade-class` (it says the same) or, for trusted files only, set MLBOOK_TRUSTED=1."
            )
        source_nb, checks, secret = load_course(course, info["assignment"])
        if refused:  # the course's release stands in for a submission past a bound: nothing is run
            result = refused_result(source_nb, TooLarge(str(refused)))
        else:
            wall = t0 + limits.budget_seconds * limits.wall_factor
            result, _ = grade_submission(
                nbformat.writes(nb),
                source_nb,
                checks,
                secret,
                info["student"],
                trusted=trusted,
                wall_deadline=wall,
                limits=limits,
                assignment=info["assignment"],
            )
        resources["mlbook_grades"] = result.grades
        for cell in nb.cells:
            if not is_test(cell):
                continue
            cell.source = strip_hidden_tests(cell.source).rstrip()
            cell.outputs = verdict_outputs(result.grades.get(grade_id(cell)))
        left_out = mine.get(LEFT_OUT, []) if isinstance(mine, dict) else []
        notes = [n for n in dict.fromkeys([result.error, *(result.problems or []), *left_out]) if n]
        if notes:
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(grading_notes(notes)))
        nb.metadata["mlbook"] = {"graded_by": "nbgrader autograde through the sandboxed engine"}
        if result.error:  # refused or unreadable: formgrader's page and the feedback say so
            from mlbook_tools.flags import from_error

            nb.metadata["mlbook"]["flag"] = from_error(result.error).to_dict()
        return nb, resources


REFUSED = (
    "refused"  # notebook metadata mlbook.refused: the submission was past a bound (set only below)
)
LEFT_OUT = (
    "left_out"  # notebook metadata mlbook.left_out: stored parts past a bound (set only below)
)


class BoundedNotebookExporter(NotebookExporter):
    """``nbgrader autograde``'s reader (``c.Autograde.exporter_class``): a submission is bounded before it
    is parsed (``submission.read_submission``/``check_bounds``: size, cells, sources, JSON values and nesting;
    stored outputs and metadata past a bound are left out of the text it reads). One past a bound
    becomes the course's release notebook marked ``mlbook.refused``, which ``SandboxedExecute`` grades
    as 0 with the "too large: ..." line as its grading note: recorded for that student only, in a second."""

    def from_file(self, file_stream, resources=None, **kw):
        import nbformat

        from mlbook_tools import submission
        from mlbook_tools.errors import CannotGrade, TooLarge

        try:
            size = os.fstat(file_stream.fileno()).st_size
        except (OSError, AttributeError, ValueError):
            size = 0
        limits = limits_from_config(self.config)
        text = file_stream.read(limits.max_notebook_bytes + 1)
        sanitizing = getattr(self.parent, "_sanitizing", True)
        left_out = []
        try:
            submission._check_raw(text, max(size, len(text)), limits)
            data, left_out = submission.bounded(text, limits)  # stored parts past a bound left out
            text = json.dumps(data, ensure_ascii=False)
        except TooLarge as err:
            return self.from_notebook_node(
                self._stub(resources, str(err)), resources=resources, **kw
            )
        except CannotGrade:
            pass  # nbgrader's own reader says what is wrong with it
        nb = nbformat.reads(text, as_version=4)
        mine = nb.metadata.get("mlbook")
        if sanitizing and isinstance(mine, dict):
            mine.pop(REFUSED, None)  # a student cannot write the markers
            mine.pop(LEFT_OUT, None)
        if (
            sanitizing and left_out
        ):  # said to the instructor in the grading notes (SandboxedExecute)
            nb.metadata.setdefault("mlbook", {})[LEFT_OUT] = list(left_out)
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
        gid = grade_id(cell)
        got = resources.get("mlbook_grades", {}).get(gid)
        if is_extra(gid) and not is_solution(cell) and got:
            grade = self.gradebook.find_grade(
                gid, self.notebook_id, self.assignment_id, self.student_id
            )
            grade.auto_score, grade.extra_credit = 0.0, float(got.score)
            self.gradebook.db.commit()


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
            writer = csv_writer(fh, keys)  # text quoted, never a formula
            writer.writeheader()
            for assignment in gradebook.assignments:
                points = assignment_points(root, assignment.name) or {}
                for student in gradebook.students:
                    row = dict(
                        assignment=assignment.name,
                        student_id=student.id,
                        last_name=student.last_name or "",
                        first_name=student.first_name or "",
                    )
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
                    row.update(
                        score=core.score,
                        max_score=core.max_score,
                        extra_credit=extra.score,
                        extra_credit_max=extra.max_score,
                        needs_manual_grade=manual,
                    )
                    row.update(standard_columns(assignment, student, sub, core.score))
                    row["status"] = submission_status(root, assignment.name, student.id, sub)
                    writer.writerow(
                        {k: csv_cell(v) for k, v in row.items()}
                    )  # a name is never a formula


# nbgrader's own CSV columns, in its order (``score`` here is the core score, late penalty taken off).
STANDARD_COLUMNS = [
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
]


def standard_columns(assignment, student, sub, core: float) -> dict:
    """nbgrader's columns for one row: raw_score is the core score before the late penalty."""
    penalty = float(sub.late_submission_penalty or 0.0) if sub is not None else 0.0
    stamp = sub.timestamp if sub is not None and sub.timestamp else ""
    return {
        "duedate": assignment.duedate or "",
        "timestamp": stamp,
        "email": student.email or "",
        "raw_score": core,
        "late_submission_penalty": penalty,
        "score": max(0.0, core - penalty),
    }


class InertStudentCells(Preprocessor):
    """``nbgrader autograde`` (the Autograde button): after grading, the notebook it writes keeps no
    active content (``inert.inert_notebook``, the rule ``mlbook grade-class``'s notebook follows).
    The caps are the course config's limits (``c.SandboxedExecute.limits``)."""

    enabled = True

    def preprocess(self, nb, resources):
        return inert_notebook(nb, limits_from_config(self.config)), resources
