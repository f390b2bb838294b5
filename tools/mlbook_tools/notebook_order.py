"""Where a student's cells belong among the course's: the one rule the plan (what runs, ``driver``)
and the autograded notebook (what people read, ``feedback``) both follow.

The course's SOURCE notebook fixes the order. A student's cell whose grade id the course knows is
that cell's copy (the first copy counts). A later copy of an answer cell is the student's own cell
(an answer split in two with Ctrl+Shift+-: JupyterLab copies the cell's metadata into both halves;
or the answer pasted twice): it is placed like an added cell, so every student cell between two
course cells runs, in order. A later copy of any other course cell (a test, a read-only cell) is a
duplicate. Every other cell (one the
student added, or one whose metadata no longer names a course cell) belongs right after the course
cell whose copy is the nearest above it in the student's notebook, keeping the student's order;
cells above every course cell come first. (The classic Notebook's split gives the first half no
metadata: it is an added cell right above the answer's copy, in order too.) An anchor the course does not have (never the case with
this rule; kept for safety) puts its cells last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlbook_tools.cells import grade_id, is_solution  # noqa: F401 - grade_id: imported from here too

TOP = ""  # the anchor of cells above every course cell


@dataclass
class Placement:
    copies: dict[str, dict] = field(default_factory=dict)  # grade id -> the student's (first) copy
    added: dict[str, list] = field(
        default_factory=dict
    )  # anchor grade id -> cells below it, in order
    duplicates: list[str] = field(default_factory=list)  # grade ids the student has more than once
    # answer grade id -> the further copies right below its copy (the halves of a split answer),
    # in order; each is also one of ``added[grade id]``
    parts: dict[str, list] = field(default_factory=dict)


def place(student_cells, known: set[str], answers: frozenset[str] = frozenset()) -> Placement:
    """Sort the student's cells into copies of course cells (``known`` grade ids) and added cells;
    a further copy of an answer cell (``answers``: grade ids of solution cells) is an added cell."""
    out, anchor = Placement(), TOP
    for cell in student_cells:
        gid = grade_id(cell)
        if gid in answers and gid in out.copies:  # a split or pasted answer: the student's cell
            below = out.added.setdefault(anchor, [])
            parts = out.parts.setdefault(gid, [])
            if anchor == gid and len(below) == len(parts):  # nothing else between: a split half
                parts.append(cell)
            below.append(cell)
            continue
        if gid is None or gid not in known:
            out.added.setdefault(anchor, []).append(cell)
            continue
        anchor = gid
        if gid in out.copies:
            out.duplicates.append(gid)
        else:
            out.copies[gid] = cell
    out.parts = {g: cells for g, cells in out.parts.items() if cells}
    return out


def merged(source_cells, student_cells) -> tuple[list[tuple], Placement]:
    """The notebook in order: ``("course", source cell, the student's copy or None)`` for each course
    cell, ``("added", anchor, student cell)`` for each other cell, placed by the rule above."""
    known = {g for c in source_cells if (g := grade_id(c)) is not None}
    answers = frozenset(
        g for c in source_cells if (g := grade_id(c)) is not None and is_solution(c)
    )
    placement = place(student_cells, known, answers)
    order: list[tuple] = [("added", TOP, c) for c in placement.added.get(TOP, [])]
    done = {TOP}
    for src in source_cells:
        gid = grade_id(src)
        order.append(("course", src, placement.copies.get(gid) if gid is not None else None))
        if gid is not None and gid not in done:
            done.add(gid)
            order += [("added", gid, c) for c in placement.added.get(gid, [])]
    for anchor, cells in placement.added.items():
        if anchor not in done:
            order += [("added", anchor, c) for c in cells]
    return order, placement
