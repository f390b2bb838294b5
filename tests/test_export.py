"""Both CSV exports (nbgrader export with the course's plugin, WideCsvExport) never hand a spreadsheet
a formula: not at the start of a cell, and not after any separator a spreadsheet may split on.

The plugins run in-process on a small gradebook (nbgrader's API, made in-process:
tests/gradebook_support.py); each exported cell is then split as a spreadsheet in each
locale would split it, quotes honoured or not.
"""

import csv
import json
import re

import gradebook_support
import pytest
from mlbook_tools.export import WideCsvExport, csv_cell
from mlbook_tools.plugins import CoreExtraCsvExport

pytestmark = pytest.mark.unit

NB = "rlhf_ppo"
SEPARATORS = [",", ";", "\t", "|", "\r", "\n"]
FORMULA = re.compile(r'^[\s"]*[=+\-@\uff1d\uff0b\uff0d\uff20]')  # blanks, quotes, then a trigger
TRIGGER = re.compile(FORMULA.pattern + r"|^[\t\r\n]")  # a whole field: no leading tab/CR/LF either
# student ids as hand-placed folders or gradebook rows could carry them (collection refuses them now)
HOSTILE_IDS = [f"bob{sep}=2+2" for sep in SEPARATORS] + ["x, -1+1", 'q;"=1"', "=HYPERLINK(1)"]


def _fields(text: str):
    """Every piece a spreadsheet could make a cell of: the CSV's own fields, then each field split on
    every separator, and the raw file split on every separator (a parser that ignores quotes)."""
    rows = list(csv.reader(text.splitlines(keepends=True)))
    fields = [f for row in rows for f in row]
    pieces = list(fields)
    lines = re.split(r"[\r\n]", text)
    for sep in SEPARATORS:
        for f in fields:
            pieces += f.split(sep)
        pieces += [p.strip('"') for line in lines for p in line.split(sep)]
    return fields, pieces


def test_csv_cell_neutralises_a_formula_after_any_separator():
    for sep in SEPARATORS:
        for formula in ("=2+2", "+1", "-1+1", "@SUM(A1)", " =1", '"=1"', "\uff1d1"):
            value = f"bob{sep}{formula}"
            safe = csv_cell(value)
            assert not TRIGGER.match(safe), (value, safe)
            for piece in safe.split(sep):
                assert not FORMULA.match(piece), (value, safe)
    for formula in ("=1", "+1", "-x", "@x", "\t=1", "\r=1", "\n=1", "  =1", '"=1'):
        assert csv_cell(formula).startswith("'"), formula
    # what is safe stays as it was; numbers stay numbers
    for plain in ("alice", "graded", "needs manual grading", "2026-12-01 17:00:00", "a-b, c"):
        assert csv_cell(plain) == plain
    assert csv_cell(-1.5) == -1.5 and csv_cell(3) == 3 and csv_cell(True) is True
    assert csv_cell(None) == ""


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A gradebook with hostile student ids, a misnamed file and an unreadable file's error text."""
    from nbgrader.api import Gradebook

    gradebook_support.in_process(monkeypatch)  # no alembic subprocess
    state = tmp_path / ".mlbook_grading" / NB
    state.mkdir(parents=True)
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_assignment(NB)
        gb.add_notebook(NB, NB)
        gb.add_grade_cell("core_1", NB, NB, max_score=10, cell_type="code")
        for i, student in enumerate(HOSTILE_IDS):
            gb.add_student(student, first_name=f"+SUM({i})", last_name=f"n;@x{i}", email="e;-1")
            if i % 3 == 0:  # no submission: status "misnamed: <file>" from grade-class's state
                (state / f"{student}.json").write_text(
                    json.dumps({"misnamed": [f"a;=2+2,{i}.ipynb"], "not_graded": True})
                )
                continue
            gb.add_submission(NB, student)
            if i % 3 == 1:  # unreadable: its error text
                (state / f"{student}.json").write_text(
                    json.dumps({"grades": {}, "error": f"not JSON\t=cmd|' /C calc'!A0;@x {i}"})
                )
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("plugin", [CoreExtraCsvExport, WideCsvExport])
def test_exports_hand_no_spreadsheet_a_formula(course, plugin):
    from nbgrader.api import Gradebook

    out = course / "out.csv"
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        plugin(to=str(out)).export(gb)
    text = out.read_text()
    fields, pieces = _fields(text)
    bad = [f for f in fields if TRIGGER.match(f)] + [p for p in pieces if FORMULA.match(p)]
    assert bad == [], bad[:10]
    # the hostile texts are there, neutralised, not dropped: ids, names, misnamed files, error text
    assert "bob;'=2+2" in fields and "'=HYPERLINK(1)" in fields and "'+SUM(0)" in fields
    assert any("a;'=2+2,0.ipynb" in f for f in fields), fields
    assert any("not JSON\t'=cmd|' /C calc'!A0;'@x" in f for f in fields), fields
    # every text field quoted, numbers not: a spreadsheet reads the scores as numbers
    header = text.splitlines()[0]
    assert all(h.startswith('"') for h in header.split(","))
    score = "score" if plugin is CoreExtraCsvExport else f"{NB}:score"
    rows = list(csv.DictReader(text.splitlines(keepends=True)))
    graded = [r for r in rows if r[score] != ""]
    assert graded and all(float(r[score]) == 0.0 for r in graded)
    assert re.search(r",0\.0,|,0,", text), "numbers are written unquoted"
