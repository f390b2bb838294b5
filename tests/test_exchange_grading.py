"""grade-class refuses a submission folder whose student id is not in the safe set
(mlbook_tools/exchange.py's rule; tests/test_exchange.py tests the collection itself, in-process).
"""

import io
import os
import sys

import pytest
from mlbook_tools.classentry import Outcome
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.course import new_course
from nbgrader.api import Gradebook

pytestmark = (
    pytest.mark.nbgrader
)  # grade-class generates the assignment with nbgrader first (no sandbox starts)

NB = "rlhf_ppo"


def test_grade_class_refuses_unsafe_student_ids(tmp_path, monkeypatch):
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")  # alembic
    course = new_course(tmp_path / "course")
    release = (layout().release / f"{NB}.ipynb").read_text()
    for student in ("x;=2+2", ".hidden", "-rf", "a\x1b[2Jb"):
        folder = course / "submitted" / student / NB
        folder.mkdir(parents=True)
        (folder / f"{NB}.ipynb" if student != "-rf" else folder / "misnamed.ipynb").write_text(
            release
        )
    out = io.StringIO()
    results = grade_class(course, NB, workers=1, trusted=True, progress=False, out=out)
    said = out.getvalue()
    assert {s: e.outcome for s, e in results.items()} == {
        s: Outcome.REFUSED for s in ("x;=2+2", ".hidden", "-rf", "a\x1b[2Jb")
    }, results
    for student in ("x;=2+2", ".hidden", "-rf"):
        assert f"NOT GRADED: student id {student!r} is not allowed" in said, said
    assert "\x1b" not in said and "'a\\x1b[2Jb'" in said  # named, escaped
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert [s.id for s in gb.students] == []
