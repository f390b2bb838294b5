"""The cell vocabulary: what a notebook cell is to the course, read from its nbgrader metadata.

Every reader takes a cell as nbformat or as plain JSON (a submission's, possibly damaged): metadata
that is missing or not a mapping reads as a plain cell, never an error.
"""

from __future__ import annotations


def nbgrader(cell) -> dict:
    """The cell's ``metadata.nbgrader`` mapping ({} when it has none, or it is damaged)."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    entry = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
    return entry if isinstance(entry, dict) else {}


def grade_id(cell) -> str | None:
    """A cell's nbgrader grade id, or None (no metadata, or damaged metadata)."""
    gid = nbgrader(cell).get("grade_id")
    return gid if isinstance(gid, str) else None


def is_solution(cell) -> bool:
    """A course cell the student writes in (nbgrader ``solution``: code or a written answer)."""
    return bool(nbgrader(cell).get("solution"))


def is_graded(cell) -> bool:
    """A cell worth points (nbgrader ``grade``): a test cell or a written answer."""
    return bool(nbgrader(cell).get("grade"))


def is_test(cell) -> bool:
    """A code cell whose checks are graded (nbgrader ``grade`` and not ``solution``)."""
    return cell.get("cell_type") == "code" and is_graded(cell) and not is_solution(cell)


def is_written_answer(cell) -> bool:
    """An answer a person grades (nbgrader ``grade`` and ``solution``)."""
    return is_graded(cell) and is_solution(cell)


def points(cell) -> float:
    """The points a graded cell is worth: its nbgrader points, or for extra credit (nbgrader points 0,
    scored as ``Grade.extra_credit``) the points ``mlbook build`` states in ``metadata.mlbook``."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    mlbook = meta.get("mlbook", {}) if isinstance(meta, dict) else {}
    if isinstance(mlbook, dict) and "extra_credit" in mlbook:
        return float(mlbook["extra_credit"])
    return float(nbgrader(cell).get("points", 0))


def text(cell) -> str:
    """A cell's source as one string (nbformat stores a list of lines or a string)."""
    src = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(src) if isinstance(src, list) else str(src)


def is_blank(cell) -> bool:
    """A cell with nothing but white space in it."""
    return not text(cell).strip()
