"""Where a student's cells belong among the course's: the one rule the plan (what runs, ``driver``)
and the autograded notebook (what people read, ``feedback``) both follow.

The course's SOURCE notebook fixes the order. A student's cell whose grade id the course knows is
that cell's copy (the first copy counts; a later one is a duplicate). Every other cell (one the
student added, or one whose metadata no longer names a course cell) belongs right after the course
cell whose copy is the nearest above it in the student's notebook, keeping the student's order;
cells above every course cell come first. An anchor the course does not have (never the case with
this rule; kept for safety) puts its cells last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TOP = ""  # the anchor of cells above every course cell


def grade_id(cell) -> str | None:
    """A cell's nbgrader grade id, or None (no metadata, or damaged metadata)."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    nbgrader = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
    gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return gid if isinstance(gid, str) else None


@dataclass
class Placement:
    copies: dict[str, dict] = field(default_factory=dict)  # grade id -> the student's (first) copy
    added: dict[str, list] = field(
        default_factory=dict
    )  # anchor grade id -> cells below it, in order
    duplicates: list[str] = field(default_factory=list)  # grade ids the student has more than once


def place(student_cells, known: set[str]) -> Placement:
    """Sort the student's cells into copies of course cells (``known`` grade ids) and added cells."""
    out, anchor = Placement(), TOP
    for cell in student_cells:
        gid = grade_id(cell)
        if gid is None or gid not in known:
            out.added.setdefault(anchor, []).append(cell)
            continue
        anchor = gid
        if gid in out.copies:
            out.duplicates.append(gid)
        else:
            out.copies[gid] = cell
    return out


def merged(source_cells, student_cells) -> tuple[list[tuple], Placement]:
    """The notebook in order: ``("course", source cell, the student's copy or None)`` for each course
    cell, ``("added", anchor, student cell)`` for each other cell, placed by the rule above."""
    placement = place(student_cells, {g for c in source_cells if (g := grade_id(c)) is not None})
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
