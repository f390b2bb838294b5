"""``nbgrader export --exporter mlbook_tools.export.WideCsvExport --to grades_wide.csv``.

One row per student, the layout an LMS upload wants: ``student_id, first_name, last_name, email``,
then for each assignment its core ``score``/``max_score``, ``extra_credit``/``extra_credit_max``,
``needs_manual_grade``, the submission ``timestamp`` and its ``status`` (as in the long CSV), then one
column per graded cell (``<assignment>:<grade id>``), empty while the cell has no score from anyone
(a written answer awaiting a person): a 0 there is a graded 0. nbgrader's own long format (``nbgrader export``,
with this course's ``plugins.CoreExtraCsvExport``) stays the default.

Both exports write every cell through ``csv_cell`` and ``csv_writer`` (OWASP's CSV-injection guidance):
a text a student controls (id, names, a misnamed file's name, an unreadable file's error text) is
never a formula, whatever separator the spreadsheet splits on (``,``, ``;``, tab, ``|``, a line break):

* a text starting with a formula character (``=`` ``+`` ``-`` ``@``, their full-width forms, or a
  tab/CR/LF), also after leading blanks or double quotes, gets a leading ``'``;
* inside a text, a formula character right after a separator (blanks and double quotes between
  allowed) gets a ``'`` before it: ``bob;=2+2`` becomes ``bob;'=2+2``, so a spreadsheet that
  splits that text into two cells still shows ``'=2+2`` as text;
* every text field is double-quoted (quotes inside doubled); numbers stay unquoted numbers.
"""

from __future__ import annotations

import csv
import re

from nbgrader.plugins import ExportPlugin

from mlbook_tools.gradebook import submission_status
from mlbook_tools.grading import assignment_points, export_course
from mlbook_tools.result import GradingResult

_TRIGGER = "=+\\-@\uff1d\uff0b\uff0d\uff20"  # = + - @ and their full-width forms
_STARTS = re.compile(f'[\\s"]*[{_TRIGGER}]|[\\t\\r\\n]')
_AFTER_SEPARATOR = re.compile(f'([,;|\\t\\r\\n][\\s"]*)(?=[{_TRIGGER}])')


def csv_cell(value):
    """One exported value: a number (``int``, ``float``, ``bool``) as it is, anything else as text
    that no spreadsheet evaluates, whichever separator it splits on (module docstring)."""
    if value is None:
        return ""
    if isinstance(value, int | float):
        return value
    text = _AFTER_SEPARATOR.sub(r"\1'", str(value))
    return "'" + text if _STARTS.match(text) else text


def csv_writer(fh, fieldnames) -> csv.DictWriter:
    """A ``DictWriter`` that double-quotes every text field (numbers stay numbers); pair with ``csv_cell``."""
    return csv.DictWriter(fh, fieldnames=fieldnames, restval="", quoting=csv.QUOTE_NONNUMERIC)


FIELDS = (
    "score",
    "max_score",
    "extra_credit",
    "extra_credit_max",
    "needs_manual_grade",
    "timestamp",
    "status",  # graded, needs manual grading, unreadable: why, misnamed: <file>, no submission
)


class WideCsvExport(ExportPlugin):
    """One row per student; a student with no submission gets empty cells for that assignment."""

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        rows, columns = [], ["student_id", "first_name", "last_name", "email"]
        cells: dict[str, list[str]] = {}
        points: dict[
            str, dict | None
        ] = {}  # assignment -> the course's points (extra credit's included)
        for assignment in gradebook.assignments:
            points[assignment.name] = assignment_points(export_course(self), assignment.name)
            columns += [f"{assignment.name}:{f}" for f in FIELDS]
            ids = [c.name for nb in assignment.notebooks for c in nb.grade_cells]
            cells[assignment.name] = ids
        for assignment in gradebook.assignments:
            columns += [f"{assignment.name}:{gid}" for gid in cells[assignment.name]]
        for student in gradebook.students:
            row = dict(
                student_id=student.id,
                first_name=student.first_name or "",
                last_name=student.last_name or "",
                email=student.email or "",
            )
            for assignment in gradebook.assignments:
                try:
                    sub = gradebook.find_submission(assignment.name, student.id)
                except MissingEntry:
                    status = submission_status(
                        export_course(self), assignment.name, student.id, None
                    )
                    row[f"{assignment.name}:status"] = status
                    continue
                scores = GradingResult.from_submission(sub, points[assignment.name])
                unscored = {  # no score from anyone yet: a written answer awaiting a person
                    g.name
                    for nb in sub.notebooks
                    for g in nb.grades
                    if g.auto_score is None and g.manual_score is None
                }
                core, extra, a = scores.core, scores.extra, assignment.name
                row.update(
                    {
                        f"{a}:score": core.score,
                        f"{a}:max_score": core.max_score,
                        f"{a}:extra_credit": extra.score,
                        f"{a}:extra_credit_max": extra.max_score,
                        f"{a}:needs_manual_grade": bool(sub.needs_manual_grade),
                        f"{a}:timestamp": sub.timestamp.isoformat() if sub.timestamp else "",
                    }
                )
                row[f"{a}:status"] = submission_status(export_course(self), a, student.id, sub)
                for gid, g in scores.grades.items():  # awaiting a person: empty, not a 0
                    row[f"{a}:{gid}"] = "" if gid in unscored else g.score
            rows.append(row)
        with open(self.to or "grades_wide.csv", "w", newline="") as fh:
            writer = csv_writer(fh, columns)
            writer.writeheader()
            writer.writerows(
                [{k: csv_cell(v) for k, v in row.items()} for row in rows]
            )  # never a formula
