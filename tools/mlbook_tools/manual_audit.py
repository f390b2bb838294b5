"""Manual scores that changed since the last ``grade-class``: a silent rewrite of the gradebook shows.

Manual scores (and extra credit) are what formgrader writes, and ``grade-class`` keeps them when it
regrades: a script that got into the instructor's browser (or anyone with the gradebook) could
change them unseen. ``grade-class`` therefore snapshots them at the end of every run
(``<course>/.mlbook_grading/<assignment>/manual_scores.json``) and, at the start of the next,
prints every difference: which student, which cell, old -> new. A grade the instructor gave on
purpose is listed once; anything else is a change to look into. (The extra credit of an autograded
``ex*`` test is the grader's own result, written by every grading: it is not compared.)
"""

from __future__ import annotations

import json
import pathlib
import sys

from mlbook_tools.config import state_in
from mlbook_tools.inert import printable
from mlbook_tools.result import EXTRA_PREFIX


def _state(course: pathlib.Path, assignment: str) -> pathlib.Path:
    return state_in(course, assignment) / "manual_scores.json"


def snapshot(course: pathlib.Path, assignment: str) -> dict[str, list]:
    """{"<student>\\t<cell>": [manual score, extra credit]} for every graded cell of the assignment."""
    from nbgrader.api import Gradebook, MissingEntry

    scores: dict[str, list] = {}
    with Gradebook(f"sqlite:///{(pathlib.Path(course) / 'gradebook.db').resolve()}") as gb:
        try:
            submissions = gb.find_assignment(assignment).submissions
        except MissingEntry:
            return scores
        for sub in submissions:
            for nb in sub.notebooks:
                for grade in nb.grades:
                    # an autograded extra-credit test (ex*) stores its result as extra credit: not manual
                    auto_extra = (
                        grade.name.startswith(EXTRA_PREFIX) and grade.auto_score is not None
                    )
                    extra = None if auto_extra else grade.extra_credit
                    scores[json.dumps([sub.student.id, grade.name])] = [grade.manual_score, extra]
    return scores


def changes(old: dict, new: dict) -> list[str]:
    """One line per cell whose manual score or extra credit differs between two snapshots."""

    def show(v):
        return "none" if v is None else f"{v:g}"

    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, [None, None]), new.get(key, [None, None])
        student, cell = json.loads(key)
        for i, what in enumerate(("manual score", "extra credit")):
            if before[i] != after[i]:
                lines.append(
                    printable(
                        f"{what} changed: {student} / {cell}: {show(before[i])} -> {show(after[i])}"
                    )
                )
    return lines


def report(course: pathlib.Path, assignment: str, out=None) -> list[str]:
    """Print (and return) the manual scores changed since the last run's snapshot; none on a first run."""
    out = sys.stdout if out is None else out
    path = _state(course, assignment)
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    lines = changes(old if isinstance(old, dict) else {}, snapshot(course, assignment))
    if lines:
        print(
            f"{len(lines)} manual score(s) changed since the last grade-class run (formgrader or anyone):",
            file=out,
        )
        for line in lines:
            print("  " + line, file=out)
    return lines


def save(course: pathlib.Path, assignment: str) -> None:
    """Snapshot the manual scores as this run leaves them."""
    path = _state(course, assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(snapshot(course, assignment)))
