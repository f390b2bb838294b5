"""The notebook-order rule (notebook_order.py): where a student's added cell belongs among the
course's cells, on small fixture notebooks built with nbformat (nbgrader's style). The plan (what
runs) and the autograded notebook (what people read) both follow it: a unit test, no sandbox."""

from __future__ import annotations

import nbformat
from mlbook_tools import driver, feedback
from mlbook_tools.notebook_order import TOP, grade_id, merged, place
from mlbook_tools.result import GradingResult

v4 = nbformat.v4


def _cell(kind: str, source: str, gid: str | None = None, **flags):
    cell = v4.new_code_cell(source) if kind == "code" else v4.new_markdown_cell(source)
    if gid is not None:
        cell.metadata["nbgrader"] = {
            "grade_id": gid,
            "schema_version": 3,
            "locked": not flags.get("solution"),
            "grade": False,
            "solution": False,
            "task": False,
            **flags,
        }
    return cell


def _source():
    """intro (read-only), an answer cell, its test, a read-only helper, a second answer."""
    return v4.new_notebook(
        cells=[
            _cell("markdown", "# Intro", "intro"),
            _cell("code", "def f(x):\n    raise NotImplementedError", "answer_f", solution=True),
            _cell("code", "assert f(1) == 2", "test_f", grade=True, points=1),
            _cell("code", "HELPER = 3", "helper"),
            _cell("code", "def g(x):\n    raise NotImplementedError", "answer_g", solution=True),
        ]
    )


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
