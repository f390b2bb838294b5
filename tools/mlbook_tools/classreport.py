"""What grade-class says, one line per student (``entry_line``), what it finds beside the
submissions it grades: a folder without the notebook (``report_misnamed``) and files beside it
(``report_extra_files``), and its closing summary (``class_summary``). Every student text passes
``printable``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from mlbook_tools.classentry import ClassEntry, Outcome
from mlbook_tools.config import assignment as configured
from mlbook_tools.config import state_in
from mlbook_tools.inert import printable
from mlbook_tools.result import Part, is_extra


def report_misnamed(course: pathlib.Path, assignment: str, out) -> dict[str, ClassEntry]:
    """A submission folder without ``<assignment>.ipynb`` (e.g. only ``<assignment>-Copy1.ipynb``) is a
    problem of that student, named in the results, the summary and both exports (the student is
    added to the gradebook with no submission, the status column names the file found)."""
    from nbgrader.api import Gradebook, MissingEntry

    from mlbook_tools.exchange import student_id_problem

    misnamed = {}
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        if (folder / f"{assignment}.ipynb").exists():
            continue
        student = folder.parent.name
        if student_id_problem(student):  # refused, said once (refused_ids)
            continue
        found = (
            sorted(p.name for p in folder.glob("*.ipynb"))
            or sorted(p.name for p in folder.iterdir())[:5]
        )
        what = ", ".join(found) if found else "an empty folder"
        why = f"no {assignment}.ipynb in {folder.relative_to(course)}: found {what}; rename it to {assignment}.ipynb and rerun"
        entry = ClassEntry(student, Outcome.MISNAMED, problems=(why,), found=tuple(found))
        misnamed[student] = entry
        state = state_in(course, assignment) / f"{student}.json"
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(entry.to_state()))
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            try:
                gb.find_student(student)
            except MissingEntry:
                gb.add_student(student, last_name=student, first_name="")
        print(entry_line(entry, assignment), file=out)
    return misnamed


EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")  # what nbgrader's exchange adds


def _extra_files(folder: pathlib.Path, assignment: str, most: int) -> tuple[list[str], int]:
    """The first ``most`` names in ``folder`` beside the notebook (sorted per folder; a folder that
    is a link is named, never entered), and how many more (visiting at most 50 x ``most`` entries)."""
    names, more, todo, visits = [], 0, [""], 50 * most
    while todo and visits > 0:
        rel = todo.pop()
        try:
            entries = sorted(os.scandir(folder / rel), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            visits -= 1
            path = os.path.join(rel, entry.name)
            if entry.is_dir(follow_symlinks=False):
                todo.append(path)
                continue
            if path in (f"{assignment}.ipynb", *EXCHANGE_FILES):
                continue
            if len(names) < most:
                names.append(path)
            else:
                more += 1
    return sorted(names), more


def report_extra_files(
    course: pathlib.Path, assignment: str, out, most: int = 20, said: dict | None = None
) -> dict:
    """One line per student whose submission folder holds more than the notebook (and the exchange's
    files): their names, printable, for the instructor to look at as text. They are never graded,
    copied or served (formgrader_guard answers 404 for a submission's files). ``said``: student ->
    the class entry already printed for them (a misnamed notebook is named once, on its own line)."""
    found = {}
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        names, more = _extra_files(folder, assignment, most)
        entry = (said or {}).get(folder.parent.name)
        names = [n for n in names if entry is None or n not in entry.found]
        if not names:
            continue
        found[folder.parent.name] = names
        shown = ", ".join(printable(n).replace("\n", "\ufffd")[:120] for n in names)
        print(
            f"{printable(folder.parent.name):20s} EXTRA FILES (not graded, never served; "
            f"open them only as text): {shown}" + (f" and {more} more" if more else ""),
            file=out,
        )
    return found


def entry_line(entry: ClassEntry, assignment: str | None = None, booked: dict | None = None) -> str:
    """One student's line, by outcome. A grading (now or kept): core and extra credit, the failing
    checks by name, what awaits a person; a refused or unreadable file its flag instead (nothing of
    it was read: never "awaiting"). Not graded: why, and what to do. ``assignment``: its name
    (default: the default assignment's), which a misnamed submission's flag names. ``booked``: the
    gradebook's scores of the submission (``grading.read_scores``), which hold what a person graded
    in formgrader: the totals and what still awaits a person are then the exports' and the feedback's."""
    from mlbook_tools.flags import from_entry

    name = f"{entry.student:20s} "
    if entry.outcome is Outcome.REFUSED:  # the id itself is unsafe: said escaped, never padded raw
        return printable("NOT GRADED: " + "; ".join(entry.problems))
    if entry.outcome is Outcome.UNGRADED:
        return name + printable("; ".join(entry.problems))
    if entry.outcome is Outcome.MISNAMED:
        return name + "NOT GRADED: " + printable("; ".join(entry.problems))
    result = entry.result
    core, ex = result.core, result.extra
    if booked is not None:  # one score everywhere: manual grades and overrides included
        core = Part(booked["score"], core.max_score, booked["awaiting_manual"])
        extra = booked["extra_credit"]
        ex = Part(extra["score"], ex.max_score, extra["awaiting_manual"])
    text = (
        f"{name}core {core.score:4g}/{core.max_score:g}  extra {ex.score:g}/{ex.max_score:g}  "
        f"{entry.seconds:6.1f} s"
    )
    flag = from_entry(assignment or configured().name, entry)
    if flag is not None:
        text += f"  {flag.line()}"
    else:
        failed = [
            g.grade_id for g in result.grades.values() if not g.passed and not is_extra(g.grade_id)
        ]
        if failed:
            text += "  failed: " + ", ".join(failed)
        waiting = [*core.awaiting_manual, *ex.awaiting_manual]
        if waiting:
            text += f"  awaiting manual grading: {len(waiting)}"
        if result.problems:
            text += "  problems: " + printable("; ".join(result.problems)[:300])
    return text + ("  (unchanged, kept)" if entry.outcome is Outcome.UNCHANGED else "")


def class_summary(results: dict) -> int:
    """One line on what this run did: graded now, unchanged (skipped), not graded (and why); the
    exit status of `mlbook grade-class`."""
    by = {o: sorted(s for s, e in results.items() if e.outcome is o) for o in Outcome}
    now, kept = by[Outcome.GRADED], by[Outcome.UNCHANGED]
    ungraded, misnamed, refused = by[Outcome.UNGRADED], by[Outcome.MISNAMED], by[Outcome.REFUSED]
    unreadable = [s for s in now if results[s].result.error]
    line = f"{len(now)} submission{'' if len(now) == 1 else 's'} graded now"
    if kept:
        line += f", {len(kept)} unchanged since their last grading (kept; --force regrades them)"
    if not results:
        line = (
            "no submissions found: put them at submitted/<student>/<assignment>/<assignment>.ipynb"
        )
    print(
        line
        + ("; `nbgrader export` and `nbgrader generate_feedback` work on top" if results else "")
    )
    if unreadable:
        print(
            f"UNREADABLE OR REFUSED (scored 0, nothing of it run; its line above says why and what "
            f"to do): {', '.join(unreadable)}",
            file=sys.stderr,
        )
    if misnamed:
        names = "; ".join(f"{s}: {', '.join(results[s].found) or 'empty folder'}" for s in misnamed)
        print(f"NOT GRADED, misnamed (rename, then rerun): {names}", file=sys.stderr)
    if refused:
        print(
            f"NOT GRADED, student id not allowed (its line above says why): {len(refused)} folder"
            + "s" * (len(refused) > 1),
            file=sys.stderr,
        )
    if ungraded:
        print(f"UNGRADED (rerun grade-class to retry): {', '.join(ungraded)}", file=sys.stderr)
    return 1 if ungraded or misnamed or refused or not results else 0
