"""Small nbgrader-style notebooks built with nbformat, shared by the notebook-order tests
(test_notebook_order.py, unit; test_notebook_order_sandbox.py, the same notebooks in the sandbox)."""

import nbformat
from mlbook_tools.notebook_order import grade_id

v4 = nbformat.v4


def cell(kind: str, text: str, gid: str | None = None, **flags):
    """A code or markdown cell; with ``gid``, nbgrader's metadata (``flags`` override its defaults)."""
    new = v4.new_code_cell(text) if kind == "code" else v4.new_markdown_cell(text)
    if gid is not None:
        new.metadata["nbgrader"] = {
            "grade_id": gid,
            "schema_version": 3,
            "locked": not flags.get("solution"),
            "grade": False,
            "solution": False,
            "task": False,
            **flags,
        }
    return new


def source():
    """intro (read-only), an answer cell, its test, a read-only helper, a second answer."""
    return v4.new_notebook(
        cells=[
            cell("markdown", "# Intro", "intro"),
            cell("code", "def f(x):\n    raise NotImplementedError", "answer_f", solution=True),
            cell("code", "assert f(1) == 2", "test_f", grade=True, points=1),
            cell("code", "HELPER = 3", "helper"),
            cell("code", "def g(x):\n    raise NotImplementedError", "answer_g", solution=True),
        ]
    )


def written_source():
    """source() plus a written (markdown, manually graded) answer below answer_g."""
    src = source()
    src.cells.append(cell("markdown", "YOUR ANSWER HERE", "why", solution=True, grade=True))
    return src


def split(original, first: str, second: str):
    """JupyterLab's Ctrl+Shift+-: two cells, each with a copy of the cell's metadata, new ids."""
    a, b = nbformat.from_dict(dict(original)), nbformat.from_dict(dict(original))
    a.metadata = nbformat.from_dict(dict(original.metadata))
    b.metadata = nbformat.from_dict(dict(original.metadata))
    a.source, b.source = first, second
    a["id"], b["id"] = f"{grade_id(original)}-1", f"{grade_id(original)}-2"
    return [a, b]


def split_student():
    """written_source() with answer_f and the written answer each split in two by the student."""
    src = written_source()
    c = src.cells
    cells = [
        c[0],
        *split(c[1], "def _twice(x):\n    return 2 * x", "def f(x):\n    return _twice(x)"),
        c[2],
        c[3],
        c[4],
        *split(c[5], "First half of my answer.", "Second half, with $x^2$."),
    ]
    return v4.new_notebook(cells=cells)
