"""Late submissions: the course's nbgrader late-penalty plugin, applied after ``mlbook grade-class``.

``nbgrader collect`` writes ``submitted/<student>/<assignment>/timestamp.txt``: with the course's
collect (``exchange.TrustedCollect``) the time the file system gave the submission (the latest ctime in
its inbound folder), never the one the student's client wrote or put in the folder's name; of several
submissions only the latest is collected, ``--update`` replaces an older one.
``nbgrader autograde`` runs nbgrader's ``AssignLatePenalties`` preprocessor; ``grade-class`` calls
``apply_late_penalties`` instead, which runs that same preprocessor with the course's configuration
(``c.AssignLatePenalties.plugin_class``) on every graded student, after refreshing the submission's
timestamp from ``timestamp.txt`` (a resubmission with the same text is not regraded, but its time counts).
It also copies the exchange's ``timestamp.txt`` and ``submission_secret.txt`` into ``autograded/``
(``keep_exchange_files``), which ``nbgrader release_feedback`` needs.
The due date is the assignment's in the gradebook (formgrader's "Manage Assignments" page, or
``nbgrader db assignment add <assignment> --duedate="2026-12-01 17:00:00 UTC"``); per-student extensions
are nbgrader's too. No due date: no penalty.
"""

from __future__ import annotations

import math
import pathlib
import shutil
import sys
import warnings

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float


class LatePenalty(LateSubmissionPlugin):
    """``per_day`` of the notebook's score (nbgrader's: points plus extra credit) per started day late,
    at most the score itself."""

    per_day = Float(0.1, help="fraction of the score taken per started day late").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float):
        if total_seconds_late <= 0:
            return None
        days = math.ceil(total_seconds_late / 86400)
        return round(min(score, score * self.per_day * days), 4)


def course_config(course: pathlib.Path):
    """The course's ``nbgrader_config.py`` as a traitlets config (the file nbgrader itself loads)."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()


EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


def keep_exchange_files(course: pathlib.Path, assignment: str, student: str) -> None:
    """The files nbgrader's exchange put next to the notebook, copied into ``autograded/`` as
    ``nbgrader autograde`` does: ``generate_feedback`` carries them to ``feedback/``, where
    ``release_feedback`` needs both (it files the page under a hash of the submission's secret)."""
    src = course / "submitted" / student / assignment
    dst = course / "autograded" / student / assignment
    if not dst.is_dir():
        return
    for name in EXCHANGE_FILES:
        if (src / name).is_file() and not (src / name).is_symlink():
            shutil.copyfile(src / name, dst / name)


def apply_late_penalties(course: pathlib.Path, assignment: str, students, out=None) -> dict:
    """{student: penalty or None}; nbgrader's ``AssignLatePenalties`` on each student's notebooks."""
    out = sys.stdout if out is None else out
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.preprocessors import AssignLatePenalties
    from nbgrader.utils import parse_utc

    course = pathlib.Path(course).resolve()
    db_url = f"sqlite:///{course / 'gradebook.db'}"
    config = course_config(course)
    found = {}
    for student in students:
        keep_exchange_files(course, assignment, student)
        stamp = course / "submitted" / student / assignment / "timestamp.txt"
        with Gradebook(db_url) as gb, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                when = (
                    parse_utc(stamp.read_text(errors="replace").strip())
                    if stamp.is_file()
                    else None
                )
            except (ValueError, OverflowError, OSError):
                when = None
            try:
                sub = gb.find_submission(assignment, student)
            except MissingEntry:
                continue
            if when is not None and sub.timestamp != when:
                sub.timestamp = when
                gb.db.commit()
            names = [nb.name for nb in sub.notebooks]
        for name in names:
            resources = {
                "nbgrader": {
                    "notebook": name,
                    "assignment": assignment,
                    "student": student,
                    "db_url": db_url,
                }
            }
            pre = AssignLatePenalties(config=config)
            pre.log.setLevel("ERROR")
            pre.preprocess(nbformat.v4.new_notebook(), resources)
        with Gradebook(db_url) as gb:
            sub = gb.find_submission(assignment, student)
            penalty = sum(nb.late_submission_penalty or 0.0 for nb in sub.notebooks)
            found[student] = penalty if sub.total_seconds_late > 0 else None
            if sub.total_seconds_late > 0:
                print(
                    f"{student:20s} late by {sub.total_seconds_late / 3600:.2f} h: penalty {penalty:g} points",
                    file=out,
                )
    return found
