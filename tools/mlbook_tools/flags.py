"""What ``mlbook grade-class`` knows about a submission it could not grade, said where an instructor looks.

Three kinds, each one line of reason and one line of what to do:

* ``misnamed``: the student's folder holds no ``<assignment>.ipynb`` (e.g. ``<assignment>-Copy1.ipynb``);
  nothing was graded (nbgrader would say "needs autograding", and its Autograde button fails);
* ``refused``: the file is past a grading bound ("too large: ..."); nothing of it was run, it scores 0;
* ``unreadable``: the file is not a notebook the grader can read; nothing was run, it scores 0.

A refused or unreadable file's written answers were never read: it is never "awaiting manual grading".
The source of truth is what grade-class saved (``<course>/.mlbook_grading/<assignment>/<student>.json``,
read by ``classentry.saved``)
and, for a misnamed folder, the folder itself (a renamed file is no longer flagged). The exports'
``status`` column, grade-class's summary, formgrader (``formgrader_guard``) and the feedback page
(``feedback.CoreExtraSummary``) all read it here.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from mlbook_tools.cells import is_graded
from mlbook_tools.classentry import ClassEntry, Outcome, saved
from mlbook_tools.inert import printable

KINDS = ("misnamed", "refused", "unreadable")


@dataclasses.dataclass(frozen=True)
class Flag:
    kind: str  # one of KINDS
    reason: str  # one line: what is wrong
    todo: str  # one line: what the instructor does about it

    def line(self) -> str:
        return f"{self.kind.upper()}: {self.reason}. {self.todo}"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "line": self.line(), "for_student": self.for_student()}

    def for_student(self) -> str:
        """What the feedback page tells the student (the instructor's ``todo`` is not theirs to do)."""
        return STUDENT_TODO[self.kind]


STUDENT_TODO = {
    "misnamed": "Hand it in again under its original name, or ask your instructor to rename it.",
    "refused": "Nothing of it was run. Clear its outputs (Kernel > Restart Kernel and Clear Outputs), "
    "save, and hand it in again, or ask your instructor.",
    "unreadable": "Nothing of it was run. Check that it opens in JupyterLab, save, and hand it in "
    "again, or ask your instructor.",
}


def _one_line(text: str, most: int = 240) -> str:
    text = " ".join(printable(str(text)).split())
    return text if len(text) <= most else text[: most - 1] + "\u2026"


def misnamed(assignment: str, student: str, found: list[str]) -> Flag:
    what = ", ".join(found) if found else "an empty folder"
    return Flag(
        "misnamed",
        _one_line(f"no {assignment}.ipynb in submitted/{student}/{assignment}/ (found {what})"),
        f"Rename the notebook to {assignment}.ipynb there, then run `mlbook grade-class` again.",
    )


def from_error(error: str) -> Flag:
    """A grading error (``GradingResult.error``) as a flag: refused past a bound, else unreadable."""
    error = _one_line(error)
    if error.startswith("too large"):
        return Flag(
            "refused",
            error + "; scored 0, its answers unread",
            "Ask the student to clear outputs (Kernel > Restart Kernel and Clear Outputs), save and "
            "hand in again, or raise the bound in nbgrader_config.py; then run `mlbook grade-class` again.",
        )
    return Flag(
        "unreadable",
        error + "; scored 0, nothing was run",
        "Ask the student to hand in a notebook that opens in JupyterLab; then run `mlbook grade-class` again.",
    )


def from_entry(assignment: str, entry: ClassEntry) -> Flag | None:
    """The flag of one grade-class entry (or its saved state); None for a graded submission."""
    if entry.outcome is Outcome.MISNAMED:
        return misnamed(assignment, entry.student, list(entry.found)[:5])
    if entry.result is not None and entry.result.error:
        return from_error(entry.result.error)
    return None


def flag_of(course: pathlib.Path, assignment: str, student: str) -> Flag | None:
    """The flag of a student's submission now: a misnamed folder as it is on disk, else what
    grade-class saved (a misnamed folder renamed since is not flagged: it needs grading)."""
    folder = pathlib.Path(course) / "submitted" / student / assignment
    if folder.is_dir() and not (folder / f"{assignment}.ipynb").exists():
        found = sorted(p.name for p in folder.glob("*.ipynb"))[:5]
        return misnamed(assignment, student, found)
    state = saved(course, assignment, student)
    if state is None or state.outcome is Outcome.MISNAMED:
        return (
            None  # nothing saved, or renamed since: formgrader's own "needs autograding" is right
        )
    return from_entry(assignment, state)


def flags_of(course: pathlib.Path, assignment: str, students) -> dict[str, dict]:
    """{student: flag as a dict} for the flagged ones among ``students``."""
    out = {}
    for student in students:
        flag = flag_of(course, assignment, str(student))
        if flag is not None:
            out[str(student)] = flag.to_dict()
    return out


def written_extra_max(course: pathlib.Path, assignment: str) -> float:
    """The extra credit the assignment's written answers (graded markdown cells) may earn."""
    source = pathlib.Path(course) / "source" / assignment / f"{assignment}.ipynb"
    try:
        cells = json.loads(source.read_text()).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return 0.0
    total = 0.0
    for cell in cells:
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        if cell.get("cell_type") == "markdown" and is_graded(cell):
            total += float((meta.get("mlbook") or {}).get("extra_credit") or 0)
    return total
