"""The plan: the cells ``nbgrader autograde`` would run for one submission, in notebook order, each
whole (locked cells from the SOURCE notebook, the student's answer cells and added cells; cells
flagged as demonstrations skipped), the graded tests where they stand, and every kind of damage noted.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import nbformat

from mlbook_tools.cells import (
    grade_id,
    is_graded,
    is_solution,
    is_written_answer,
    points,
    text,
)
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits
from mlbook_tools.notebook_order import merged
from mlbook_tools.result import is_extra
from mlbook_tools.submission import parse_submission

# Cells that only demonstrate (training runs, sweeps, figures) carry the cell tag DEMO_TAG, written
# by `mlbook build` from the fragment header `demo=true`: metadata, so the reader sees no grader
# plumbing. The grader skips such a cell by the course's copy (a submission's cell metadata is
# dropped but for its nbgrader entry, ``bounded``), an answer cell too: the student's demonstration
# never costs a grade. A first line DEMO_FLAG (what earlier releases wrote) still skips a cell,
# the student's own included.
DEMO_TAG = "demo"
DEMO_FLAG = "# Demonstration only: the autograder skips this cell."
_DEMO = re.compile(r"\A\s*#\s*Demonstration only: the autograder skips this cell", re.IGNORECASE)


def is_demo(source: str) -> bool:
    """The legacy flag: ``source`` starts with DEMO_FLAG."""
    return bool(_DEMO.match(source))


def is_demo_cell(cell) -> bool:
    """A cell tagged DEMO_TAG, or one whose source starts with the legacy DEMO_FLAG."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    tags = meta.get("tags", []) if isinstance(meta, dict) else []
    return (isinstance(tags, list) and DEMO_TAG in tags) or is_demo(text(cell))


@dataclass
class Test:
    grade_id: str
    points: float
    extra: bool
    at: int | None = None  # where it stands: the number of plan cells above it (None: below all)


@dataclass
class Plan:
    cells: list[tuple[str, str, bool]]  # (cell id, source, trusted), in notebook order, run whole
    tests: list[Test]
    manual: list[tuple[str, float]]  # (grade_id, points) of manually graded cells
    student_names: dict[str, str]  # symbol -> grade_id of the answer cell that defines it
    problems: list[str] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None  # the student's, parsed
    skipped: list[str] = field(default_factory=list)  # cells flagged as demonstrations


def _defined_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def make_plan(
    source_nb: nbformat.NotebookNode, submission_text: str, limits: GradingLimits = DEFAULT_LIMITS
) -> Plan:
    """The cells ``nbgrader autograde`` would run, in notebook order, each whole; every kind of damage noted.

    Read-only cells come from the course's SOURCE notebook (a student's edit is undone, as nbgrader
    restores locked cells), answer cells and the cells a student added are the student's. Test cells
    are not run here: the driver calls their checks. Demonstration cells (``is_demo_cell``) are skipped.
    """
    student, problems = parse_submission(submission_text, limits)  # bounded before it is parsed
    cells = student.cells
    order, placement = merged(source_nb.cells, cells)  # the one notebook-order rule
    for gid in placement.duplicates:
        problems.append(f"cell {gid!r} appears more than once: the first copy is graded")
    plan_cells, tests, manual, names, skipped = [], [], [], {}, []
    counts: dict[str, int] = {}  # code cells the student added below each anchor, so far

    def add(cell_id: str, source: str, trusted: bool, demo: bool = False) -> None:
        if demo or is_demo(source):
            skipped.append(cell_id)
        elif source.strip():
            plan_cells.append((cell_id, source, trusted))

    for kind, where, cell in order:
        if kind == "added":  # run as the student's code, where the student put it
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                counts[where] = counts.get(where, 0) + 1
                add(f"{where or 'top'}+{counts[where]}", text(cell), False)
            continue
        cell, mine = where, cell
        gid = grade_id(cell) or ""
        if is_written_answer(cell):
            manual.append((gid, points(cell)))
            if mine is None:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
            continue
        if cell.cell_type != "code":
            continue
        if is_graded(cell):
            tests.append(Test(gid, points(cell), is_extra(gid), at=len(plan_cells)))
            if mine is None:
                problems.append(f"test cell {gid!r} is missing: restored from the course's copy")
            continue
        if is_solution(cell):
            for name in _defined_names(cell.source):
                names[name] = gid
            if mine is None:
                problems.append(
                    f"answer cell {gid!r} is missing (deleted, or its metadata was changed)"
                )
                continue
            add(gid, text(mine), False, is_demo_cell(cell))  # the course's tag
            continue
        add(gid, cell.source, True, is_demo_cell(cell))
        if mine is not None and text(mine).strip() != cell.source.strip():
            problems.append(f"read-only cell {gid!r} was edited: the course's version was used")
    return Plan(plan_cells, tests, manual, names, problems, student, skipped)
