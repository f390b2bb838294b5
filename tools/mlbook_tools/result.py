"""One submission's grade as a type (Otter-Grader's ``GradingResults``): per graded cell, and the
core and extra-credit totals, computed here and nowhere else.

A ``GradingResult`` comes from the engine (``grading.grade_submission``: the checks' verdicts, the
written answers awaiting a person, the run's notes) or from an nbgrader gradebook
(``from_submission``: what formgrader and the exports show). ``mlbook grade``, ``grade-class``, the
feedback page and both CSV exports read it. It crosses process boundaries (class workers) as plain
JSON only (``to_json``/``from_json``, never pickle); ``from_dict`` validates what it reads. A
result is frozen once built (``dataclasses.replace`` makes a changed copy).

The JSON form (``to_dict``) is what ``mlbook grade --json`` prints::

    {"score": 7.0, "max_score": 10.0, "awaiting_manual": [],            # core
     "extra_credit": {"score": 3.0, "max_score": 9.0, "awaiting_manual": ["ex_essay"]},
     "grades": {"test_gae": {"score": 2.0, "max_score": 2.0, "message": "passed"}, ...},
     "problems": [...], "manual": ["ex_essay"], "manual_points": {"ex_essay": 6.0}, "blank": [], "output": "...",
     "seconds": 12.3, "cell_errors": {...}}                           # the engine's run
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

EXTRA_PREFIX = "ex"  # grade ids of the optional extra-credit exercises start with this


def is_extra(grade_id: str) -> bool:
    """Whether a graded cell is extra credit (counted apart from the core score, everywhere)."""
    return str(grade_id).startswith(EXTRA_PREFIX)


class BadResult(ValueError):
    """A result's JSON that is not a well-formed grade (a broken worker, a hand-edited state file)."""


@dataclass(frozen=True)
class CellGrade:
    grade_id: str
    score: float
    max_score: float
    message: str | None = (
        None  # the engine's verdict, in the student's terms (None: from a gradebook)
    )
    awaiting_manual: bool = False  # a person still has to grade it (nbgrader's needs_manual_grade)

    @property
    def kind(self) -> str:
        return "extra" if is_extra(self.grade_id) else "core"

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score

    def to_dict(self) -> dict:
        out: dict = {"score": self.score, "max_score": self.max_score}
        if self.message is not None:
            out["message"] = self.message
        if self.awaiting_manual:
            out["needs_manual_grade"] = True
        return out


@dataclass(frozen=True)
class Part:
    """The totals of one part (core or extra credit)."""

    score: float
    max_score: float
    awaiting_manual: list[str]

    def to_dict(self) -> dict:
        return {
            "score": self.score,
            "max_score": self.max_score,
            "awaiting_manual": list(self.awaiting_manual),
        }


@dataclass(frozen=True)
class GradingResult:
    grades: dict[str, CellGrade] = field(default_factory=dict)  # graded cells, in notebook order
    manual_points: dict[str, float] = field(default_factory=dict)  # written answers not in grades
    # the engine's run (None: a result read from a gradebook)
    problems: list[str] | None = None
    output: str | None = None
    seconds: float | None = None
    cell_errors: dict[str, str] | None = None
    error: str | None = None  # the file could not be graded at all (unreadable, too large)
    # written answers left as released: they count in the maximum at 0, with nothing for a person to
    # grade (as nbgrader's gradebook records them), so they are not awaiting manual grading
    blank: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ the totals, computed once
    def part(self, extra: bool) -> Part:
        cells = [g for g in self.grades.values() if is_extra(g.grade_id) == extra]
        waiting = {gid: p for gid, p in self.manual_points.items() if is_extra(gid) == extra}
        return Part(
            score=sum(g.score for g in cells),
            max_score=sum(g.max_score for g in cells) + sum(waiting.values()),
            awaiting_manual=sorted(
                [
                    *(g for g in waiting if g not in self.blank),
                    *(g.grade_id for g in cells if g.awaiting_manual),
                ]
            ),
        )

    @property
    def core(self) -> Part:
        return self.part(False)

    @property
    def extra(self) -> Part:
        return self.part(True)

    @property
    def manual(self) -> list[str]:
        """The written answers a person still has to grade (the blank ones are 0 already)."""
        return [gid for gid in self.manual_points if gid not in self.blank]

    # ------------------------------------------------------------------ building one
    @classmethod
    def from_submission(cls, submission, points: dict[str, float] | None = None) -> GradingResult:
        """One nbgrader ``SubmittedAssignment`` (a gradebook row) as ``mlbook grade`` reports it.

        A cell's score is nbgrader's (manual, else auto, plus ``extra_credit``); its maximum is the
        course's points (``points``: for extra credit, what it may earn; nbgrader stores 0). A cell
        that needs manual grading is awaiting it, whatever nbgrader's placeholder 0.0 says."""
        points = points or {}
        grades = {}
        for nb in submission.notebooks:
            for grade in nb.grades:
                base = grade.manual_score if grade.manual_score is not None else grade.auto_score
                # nbgrader's Grade.score drops extra credit typed without a score; here it always counts
                score = float(base or 0.0) + float(grade.extra_credit or 0.0)
                grades[grade.name] = CellGrade(
                    grade.name,
                    score,
                    float(points.get(grade.name, grade.max_score)),
                    awaiting_manual=bool(grade.needs_manual_grade),
                )
        return cls(grades)

    @classmethod
    def unsubmitted(cls, points: dict[str, float]) -> GradingResult:
        """No submission: every graded cell 0 of its points (as nbgrader's own export counts it)."""
        return cls({gid: CellGrade(gid, 0.0, float(p)) for gid, p in points.items()})

    # ------------------------------------------------------------------ JSON, both ways
    def to_dict(self) -> dict:
        out = {
            **self.core.to_dict(),
            "extra_credit": self.extra.to_dict(),
            "grades": {gid: g.to_dict() for gid, g in self.grades.items()},
        }
        if self.problems is not None:
            out.update(
                problems=list(self.problems),
                manual=self.manual,
                manual_points=dict(self.manual_points),
                output=self.output or "",
                seconds=self.seconds or 0.0,
                cell_errors=dict(self.cell_errors or {}),
                blank=list(self.blank),
            )
        if self.error is not None:
            out["error"] = self.error
        return out

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text: str) -> GradingResult:
        try:
            data = json.loads(text)
        except ValueError as err:
            raise BadResult(f"not JSON: {err}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data) -> GradingResult:
        """The result ``to_dict`` wrote; BadResult when a field is missing, of the wrong type, or the
        totals it states are not the sums of its cells."""
        _expect(isinstance(data, dict), "a result is a JSON object")
        grades_in = data.get("grades")
        _expect(isinstance(grades_in, dict), "grades is an object")
        grades = {}
        for gid, g in grades_in.items():
            _expect(isinstance(g, dict), f"grade {gid!r} is an object")
            message = g.get("message")
            _expect(message is None or isinstance(message, str), f"grade {gid!r}: message is text")
            grades[gid] = CellGrade(
                gid,
                _number(g.get("score"), gid),
                _number(g.get("max_score"), gid),
                message,
                bool(g.get("needs_manual_grade", False)),
            )
        manual = data.get("manual_points", {})
        _expect(isinstance(manual, dict), "manual_points is an object")
        manual_points = {gid: _number(p, gid) for gid, p in manual.items()}
        run: dict = {}  # the engine's run, when the result has one
        if "problems" in data:
            problems, errors = data.get("problems"), data.get("cell_errors", {})
            _expect(
                isinstance(problems, list) and all(isinstance(p, str) for p in problems),
                "problems is a list of text",
            )
            _expect(
                isinstance(errors, dict) and all(isinstance(v, str) for v in errors.values()),
                "cell_errors maps cells to text",
            )
            _expect(isinstance(data.get("output", ""), str), "output is text")
            blank = data.get("blank", [])
            _expect(
                isinstance(blank, list) and all(g in manual_points for g in blank),
                "blank lists written answers",
            )
            run = dict(
                problems=list(problems),
                cell_errors=dict(errors),
                output=data.get("output", ""),
                seconds=_number(data.get("seconds", 0.0), "seconds"),
                blank=list(blank),
            )
        if data.get("error") is not None:
            _expect(isinstance(data["error"], str), "error is text")
            run["error"] = data["error"]
        result = cls(grades, manual_points, **run)
        for name, part in (("core", result.core), ("extra credit", result.extra)):
            given = data if name == "core" else data.get("extra_credit", {})
            for key in ("score", "max_score"):
                if key in given:
                    _expect(
                        math.isclose(_number(given[key], key), getattr(part, key), abs_tol=1e-9),
                        f"the {name} {key} is not the sum of its cells",
                    )
        return result


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise BadResult(f"not a grading result: {what}")


def _number(value, where: str) -> float:
    _expect(isinstance(value, int | float) and not isinstance(value, bool), f"{where}: a number")
    _expect(math.isfinite(value), f"{where}: a finite number")
    return float(value)
