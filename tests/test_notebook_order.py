"""The notebook-order rule (notebook_order.py): where a student's added cell belongs among the
course's cells, on small fixture notebooks built with nbformat (nbgrader's style). The plan (what
runs) and the autograded notebook (what people read) both follow it: a unit test, no sandbox
(test_notebook_order_sandbox.py grades the same small notebooks in the sandbox)."""

from __future__ import annotations

import nbformat
import pytest
from mlbook_tools import driver, feedback
from mlbook_tools.notebook_order import TOP, grade_id, merged, place
from mlbook_tools.result import GradingResult
from notebook_support import cell as _cell
from notebook_support import source as _source
from notebook_support import split_student as _split_student
from notebook_support import written_source as _written_source

pytestmark = pytest.mark.unit

v4 = nbformat.v4


def _student():
    src = _source()
    cells = [
        _cell("code", "import math  # added at the top"),
        src.cells[0],
        src.cells[1],
        _cell("code", "f = lambda x: 2 * x  # answered in a new cell"),
        _cell("markdown", "my notes"),
        src.cells[2],
        _cell("code", "print('renamed')", "not_in_course"),  # metadata names no course cell
        _cell("code", "y = 1  # below the renamed cell"),
        src.cells[4],
        _cell("code", "z = g  # below answer_g, although the student moved answer_g up"),
        src.cells[3],
        _cell("code", "HELPER = 4  # a copy of helper again below"),
        _cell("code", "HELPER = 5", "helper"),  # a duplicate of a course cell
        _cell("code", "w = 0  # below the duplicate"),
    ]
    return v4.new_notebook(cells=cells)


def _sources(cells) -> list[str]:
    return [c.source.split("  #")[0] if isinstance(c, dict) else c for c in cells]


def test_each_added_cell_belongs_below_the_nearest_course_cell_above_it():
    student = _student()
    placement = place(student.cells, {grade_id(c) for c in _source().cells})
    assert list(placement.copies) == ["intro", "answer_f", "test_f", "answer_g", "helper"]
    assert placement.duplicates == ["helper"]
    added = {anchor: _sources(cells) for anchor, cells in placement.added.items()}
    assert added == {
        TOP: ["import math"],
        "answer_f": ["f = lambda x: 2 * x", "my notes"],
        "test_f": ["print('renamed')", "y = 1"],  # an unknown grade id does not move the anchor
        "answer_g": ["z = g"],
        "helper": ["HELPER = 4", "w = 0"],  # a duplicate moves it (both copies are "helper")
    }


def test_the_course_order_wins_and_added_cells_follow_their_anchor():
    order, _ = merged(_source().cells, _student().cells)
    seq = [(kind, grade_id(x) if kind == "course" else x) for kind, x, _ in order]
    assert seq == [
        ("added", TOP),
        ("course", "intro"),
        ("course", "answer_f"),
        ("added", "answer_f"),
        ("added", "answer_f"),
        ("course", "test_f"),
        ("added", "test_f"),
        ("added", "test_f"),
        ("course", "helper"),
        ("added", "helper"),
        ("added", "helper"),
        ("course", "answer_g"),
        ("added", "answer_g"),
    ]


def test_an_untouched_or_empty_notebook_adds_nothing():
    src = _source()
    order, placement = merged(src.cells, src.cells)
    assert [k for k, _, _ in order] == ["course"] * 5 and not placement.added
    order, placement = merged(src.cells, [])
    assert all(mine is None for _, _, mine in order) and not placement.copies


def test_the_plan_and_the_autograded_notebook_follow_the_same_order():
    source, student = _source(), _student()
    plan = driver.make_plan(source, nbformat.writes(student))
    ran = [cid for cid, _, _ in plan.cells]
    assert ran == [
        "top+1",
        "answer_f",
        "answer_f+1",
        "test_f+1",
        "test_f+2",
        "helper",
        "helper+1",
        "helper+2",
        "answer_g",
        "answer_g+1",
    ]
    assert any("'helper' appears more than once" in p for p in plan.problems)
    nb = feedback.autograded_notebook(source, plan, GradingResult(problems=[]))
    shown = [c.source.split("  #")[0] for c in nb.cells]
    # the same order; markdown the student wrote is shown too, a cell naming an unknown grade id is not
    assert shown == [
        "import math",
        "# Intro",
        "def f(x):\n    raise NotImplementedError",
        "f = lambda x: 2 * x",
        "my notes",
        "assert f(1) == 2",
        "y = 1",
        "HELPER = 3",
        "HELPER = 4",
        "w = 0",
        "def g(x):\n    raise NotImplementedError",
        "z = g",
    ]


# ---------------------------------------------------------------- issue 31: whole answers


def test_a_split_answer_cell_keeps_both_halves_in_order():
    """Ctrl+Shift+- in JupyterLab copies the metadata into both halves: the second is the student's
    cell below the first (it runs), not a duplicate; a duplicated test cell still is one."""
    source, student = _written_source(), _split_student()
    answers = frozenset({"answer_f", "answer_g", "why"})
    placement = place(student.cells, {grade_id(c) for c in source.cells}, answers)
    assert placement.duplicates == [] and _sources(placement.added["answer_f"]) == [
        "def f(x):\n    return _twice(x)"
    ]
    assert placement.parts["answer_f"] == placement.added["answer_f"]
    assert _sources(placement.parts["why"]) == ["Second half, with $x^2$."]
    plan = driver.make_plan(source, nbformat.writes(student))
    ran = [(cid, text.split("\n")[0]) for cid, text, _ in plan.cells]
    assert ran == [
        ("answer_f", "def _twice(x):"),
        ("answer_f+1", "def f(x):"),
        ("helper", "HELPER = 3"),
        ("answer_g", "def g(x):"),
    ]
    assert not plan.problems, plan.problems
    student.cells.insert(3, _cell("code", "assert f(1) == 2", "test_f", grade=True, points=1))
    plan = driver.make_plan(source, nbformat.writes(student))
    assert any("'test_f' appears more than once" in p for p in plan.problems)


def test_the_classic_notebooks_split_runs_both_halves_in_order():
    """The classic Notebook's split gives the first half a new cell without metadata, above."""
    source = _source()
    first = _cell("code", "def _twice(x):\n    return 2 * x")
    second = _cell("code", "def f(x):\n    return _twice(x)", "answer_f", solution=True)
    student = v4.new_notebook(cells=[source.cells[0], first, second, *source.cells[2:]])
    plan = driver.make_plan(source, nbformat.writes(student))
    ran = [text.split("\n")[0] for _, text, _ in plan.cells]
    assert ran[:2] == ["def _twice(x):", "def f(x):"] and not plan.problems


def test_a_further_copy_of_an_answer_runs_and_shows_where_it_stands():
    """A pasted copy of an answer away from it is the student's cell there (not a split half)."""
    source = _source()
    c = source.cells
    again = _cell("code", "def f(x):\n    return 2 * x", "answer_f", solution=True)
    student = v4.new_notebook(cells=[c[0], c[1], c[2], c[3], again, c[4]])
    order, placement = merged(source.cells, student.cells)
    assert not placement.parts and not placement.duplicates
    assert [a for k, a, _ in order if k == "added"] == ["helper"]
    plan = driver.make_plan(source, nbformat.writes(student))
    assert [cid for cid, _, _ in plan.cells] == ["answer_f", "helper", "helper+1", "answer_g"]
    nb = feedback.autograded_notebook(source, plan, GradingResult(problems=[]))
    shown = [c.source for c in nb.cells]
    assert shown[shown.index("HELPER = 3") + 1] == "def f(x):\n    return 2 * x"
    assert all("nbgrader" not in c.metadata for c in nb.cells[shown.index("HELPER = 3") + 1 :][:1])


def test_the_grader_reads_a_split_written_answer_whole_in_its_graded_cell():
    source = _written_source()
    plan = driver.make_plan(source, nbformat.writes(_split_student()))
    nb = feedback.autograded_notebook(source, plan, GradingResult(problems=[]))
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "why"]
    assert len(graded) == 1
    assert graded[0].source == "First half of my answer.\n\nSecond half, with $x^2$."
    assert nb.cells[-1] is not graded[0] or nb.cells[-1].source == graded[0].source
    assert sum("Second half" in c.source for c in nb.cells) == 1  # shown once, in the graded cell
    # the split code answer: both halves shown, in order, the second without a grade id
    shown = [c.source.split("\n")[0] for c in nb.cells]
    i = shown.index("def _twice(x):")
    assert shown[i + 1] == "def f(x):" and "nbgrader" not in nb.cells[i + 1].metadata


def test_each_test_knows_where_it_stands_in_the_plan():
    plan = driver.make_plan(_source(), nbformat.writes(_student()))
    ran = [cid for cid, _, _ in plan.cells]
    (test,) = plan.tests
    assert test.grade_id == "test_f" and ran[: test.at] == ["top+1", "answer_f", "answer_f+1"]
