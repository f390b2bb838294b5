"""A second assignment, built and graded by the same commands as the chapter, no tooling file changed.

tests/assignment_support.py writes a tiny book in a scratch folder: its pyproject.toml's one
``[tool.mlbook.assignments.tiny]`` table names its checks and reference module, its course folder
is the chapter's config with its own course id. ``$MLBOOK_ROOT`` points every command at it:
``mlbook build`` writes its source, solved and released notebooks; ``mlbook grade``, ``mlbook
grade-class`` and ``nbgrader autograde`` (the course's SandboxedExecute) grade them in the sandbox.
The one check calls the reference module's ``quadruple``, which calls the student's ``double``: a
right answer earns the check's points, a wrong one 0.
"""

import json
import shutil
import sys

import assignment_support as tiny
import nbformat
import pytest
from mlbook_tools import cli
from mlbook_tools.config import assignment
from mlbook_tools.grading import read_scores, run_nbgrader

# the sandbox; nbgrader (the build's and grade-class's generate_assignment, autograde)
pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader]

GID = "test_double"


@pytest.fixture
def book(tmp_path, monkeypatch):
    """The tiny book (not built yet); every command pointed at it, grade-class's workers and
    nbgrader too (through the environment), its reference module importable."""
    root = tiny.write_book(tmp_path / "book")
    monkeypatch.setenv("MLBOOK_ROOT", str(root))
    monkeypatch.setenv("PYTHONPATH", str(root / "lib"))
    monkeypatch.syspath_prepend(str(root / "lib"))
    yield root
    sys.modules.pop(tiny.REFERENCE, None)


def _mlbook(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(list(args))
    return code, capsys.readouterr().out


def _answers(root, body: str) -> nbformat.NotebookNode:
    """The solved notebook with ``double`` returning ``body``."""
    nb = nbformat.read(root / "solved" / f"{tiny.NAME}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata["nbgrader"]["grade_id"] == "double"]
    assert "return 2 * x" in cell.source
    cell.source = cell.source.replace("return 2 * x", f"return {body}")
    return nb


def test_a_second_assignment_builds_and_grades_with_the_same_commands(book, capsys):
    code, _ = _mlbook(capsys, "build")
    assert code == 0
    this = assignment()
    assert this.name == tiny.NAME and this.course_id == tiny.COURSE_ID
    source = nbformat.read(this.source(book / "course"), as_version=4)
    test = next(c for c in source.cells if c.metadata["nbgrader"].get("grade_id") == GID)
    assert test.metadata["nbgrader"]["points"] == tiny.POINTS
    assert f"# Graded ({tiny.POINTS} points):" in test.source and "def check_double" in test.source
    released = this.release.read_text()
    assert "NotImplementedError" in released and "check_double" not in released

    right, wrong = book / "right.ipynb", book / "wrong.ipynb"
    nbformat.write(_answers(book, "x * 2"), right)
    nbformat.write(_answers(book, "x + 1"), wrong)
    said = {}
    for path, score in ((right, tiny.POINTS), (wrong, 0.0), (this.release, 0.0)):
        code, out = _mlbook(capsys, "grade", str(path), "--json")
        grade = json.loads(out)["grades"][GID]
        assert (code, grade["score"], grade["max_score"]) == (0, score, tiny.POINTS), (path, out)
        said[path] = grade["message"]
    assert said[right] == "passed"
    assert said[wrong].startswith(("double(", "quadruple(")), said  # the check's own words
    assert "NotImplementedError" in said[this.release], said

    course = book / "course"
    for student, path in (("alice", right), ("bob", wrong)):
        folder = course / "submitted" / student / tiny.NAME
        folder.mkdir(parents=True)
        shutil.copy(path, folder / f"{tiny.NAME}.ipynb")
    code, out = _mlbook(capsys, "grade-class", "--course", str(course), "--workers", "2")
    assert code == 0, out
    for student, score in (("alice", tiny.POINTS), ("bob", 0.0)):
        scores = read_scores(course / "gradebook.db", tiny.NAME, student)
        assert scores["grades"][GID]["score"] == score, (student, scores)
        assert (this.state(course) / f"{student}.json").is_file()
    assert "failed: test_double" in next(line for line in out.splitlines() if "bob" in line)

    # formgrader's Autograde button: `nbgrader autograde` through the course's SandboxedExecute
    folder = course / "submitted" / "carol" / tiny.NAME
    folder.mkdir(parents=True)
    shutil.copy(right, folder / f"{tiny.NAME}.ipynb")
    run_nbgrader(["autograde", tiny.NAME, "--student", "carol", "--force"], course)
    scores = read_scores(course / "gradebook.db", tiny.NAME, "carol")
    # (plain nbgrader would score it 0: the hidden test's `quadruple` is the reference's, not the notebook's)
    assert scores["grades"][GID]["score"] == tiny.POINTS, scores
    graded = nbformat.read(course / "autograded" / "carol" / tiny.NAME / f"{tiny.NAME}.ipynb", 4)
    assert graded.metadata["mlbook"]["graded_by"].endswith("through the sandboxed engine")
