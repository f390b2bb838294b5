"""The nbgrader gradebook, as grade-class writes it: ``record`` puts one grading's scores into it
(through nbgrader's API) next to the autograded notebook, so that ``nbgrader generate_feedback``,
``nbgrader export`` and formgrader work on top; and one status everywhere (grade-class, formgrader's
Autograde button, the exports): blank written answers score 0 as the button scores them, an
unreadable submission needs a person, ``submission_status`` is the exports' column.
"""

from __future__ import annotations

import pathlib
import warnings

from mlbook_tools import cells as vocab  # the cell vocabulary
from mlbook_tools.inert import printable
from mlbook_tools.result import GradingResult, is_extra


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
            if not vocab.is_graded(cell):
                continue
            gid = vocab.grade_id(cell)
            grade = gb.find_grade(gid, nb_name, assignment, student)
            if vocab.is_solution(cell):  # a written answer: formgrader's job
                if gid in blanks:  # as nbgrader's Autograde (button): untouched is 0
                    grade.auto_score, grade.needs_manual_grade = 0.0, False
                    continue
                grade.auto_score = None
                grade.needs_manual_grade = grade.manual_score is None
                continue
            got = result.grades.get(gid)
            score = float(got.score) if got else 0.0
            if is_extra(gid):  # nbgrader's extra credit: 0 points + a bonus
                grade.auto_score, grade.extra_credit = 0.0, score
            else:
                grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None
        if result.error:  # unreadable: formgrader flags it for a person, never a plain 0
            flag_unreadable(gb, assignment, student)
        gb.db.commit()


# ------------------------------------------------ one status everywhere (grade-class, button, exports)

TEXT_STUB = "YOUR ANSWER HERE"  # nbgrader's ClearSolutions.text_stub in this course's config


def blank_written_answers(notebook: str | dict | None) -> set[str]:
    """Grade ids of written answers (graded markdown answer cells) left as released or emptied.

    ``notebook``: its JSON text, or the parsed (bounded) notebook. nbgrader's Autograde (formgrader's
    button) scores such a cell 0 with no manual grading needed (its checksum is unchanged);
    grade-class records the same, so both say one thing."""
    import json

    if not notebook:
        return set()
    try:
        cells = (json.loads(notebook) if isinstance(notebook, str) else notebook).get("cells", [])
    except ValueError:
        return set()
    out = set()
    for cell in cells:
        if cell.get("cell_type") == "markdown" and vocab.is_written_answer(cell):
            if vocab.text(cell).strip() in ("", TEXT_STUB):
                out.add(vocab.grade_id(cell))
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
    from mlbook_tools.classentry import Outcome, saved

    state = saved(course, assignment, student)
    if state is not None and state.outcome is Outcome.MISNAMED and state.found and sub is None:
        return f"misnamed: {', '.join(state.found)} (expected {assignment}.ipynb)"
    if sub is None:
        return "no submission"
    if state is not None and state.result is not None and state.result.error:
        return "unreadable: " + printable(state.result.error)[:200]
    return "needs manual grading" if sub.needs_manual_grade else "graded"
