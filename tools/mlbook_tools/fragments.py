"""The rules of a chapter fragment's cells (``solutions/chapter/README.md``), checked by ``mlbook build``.

The header keys a cell may carry (``check_header``: a typo fails the build), the ``# Graded:`` line
of a test cell filled with the points of its ``@graded`` declaration (``points_line``), and the
parameters of every check bound to names the notebook defines (``check_parameters``).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

# A test cell's visible comment on what it grades: the fragment writes `# Graded: ...` and the build
# states the points declared with @graded there, `# Graded (2 points): ...` (never typed by hand).
GRADED_LINE = "# Graded:"
_HAND_TYPED = re.compile(r"^# Graded \(", re.MULTILINE)


def points_phrase(check) -> str:
    """``2 points``, ``1 point, extra credit``: what a test cell is worth, from its ``@graded``."""
    n = f"{check.points:g}"
    return f"{n} point{'' if n == '1' else 's'}" + (", extra credit" if check.extra else "")


def points_line(src: str, check, frag: pathlib.Path) -> str:
    """The test cell's visible lines with ``# Graded:`` filled in from ``check`` (and right-stripped)."""
    if _HAND_TYPED.search(src):
        raise ValueError(
            f"{frag}: test {check.grade_id!r} states its points by hand ('# Graded (...)'); write "
            f"'{GRADED_LINE} ...' and the build fills in the points of its @graded declaration"
        )
    lines = src.rstrip().split("\n")
    for i, line in enumerate(lines):
        if line.startswith(GRADED_LINE):
            lines[i] = f"# Graded ({points_phrase(check)}):{line[len(GRADED_LINE) :]}"
    return "\n".join(lines)


def check_parameters(registry: dict, cells: list, references: tuple[str, ...]) -> None:
    """Every parameter of a check used by a test cell of ``cells`` must be an answer cell's symbol
    (a function or class an answer cell defines) or an attribute of a reference module (the course's
    read-only code), else the grader could never call the check and every submission would be
    UNGRADED: a build error naming the check and the parameter instead."""
    answers = set()
    for cell in cells:
        meta = cell.metadata["nbgrader"]
        if cell.cell_type == "code" and meta.get("solution") and not meta.get("grade"):
            tree = ast.parse(cell.source)  # the markers are comments
            answers |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    modules = [importlib.import_module(m) for m in references]
    for cell in cells:
        meta = cell.metadata["nbgrader"]
        check = registry.get(meta["grade_id"]) if meta.get("grade") else None
        if check is None or meta.get("solution"):
            continue
        for name in check.names:
            if name not in answers and not any(hasattr(m, name) for m in modules):
                raise ValueError(
                    f"check {check.fn.__name__} (test {check.grade_id!r}) takes parameter {name!r}, "
                    f"which is neither a function or class an answer cell defines nor an attribute of "
                    f"the reference ({', '.join(references)}): the grader could not call it, and every "
                    "submission would be UNGRADED. Rename the parameter to a notebook name."
                )


# The keys a fragment's cell header may carry, by cell kind; anything else (a typo such as
# `stub_method=`) fails the build instead of silently releasing a different cell.
CODE_KEYS = {
    "stub",
    "stub_methods",
    "grade_id",
    "solution",
    "test",
    "include",
    "needs_answers",
    "demo",
    "tags",
}
MARKDOWN_KEYS = {"manual", "points", "tags"}
JUPYTEXT_KEYS = {
    "lines_to_next_cell",
    "lines_to_end_of_cell_marker",
    "cell_marker",
    "title",
}  # jupytext's own


def check_header(frag: pathlib.Path, index: int, cell) -> None:
    allowed = MARKDOWN_KEYS if cell.cell_type == "markdown" else CODE_KEYS
    unknown = sorted(set(cell.metadata) - allowed - JUPYTEXT_KEYS)
    if unknown:
        hint = {
            "points": "a test's points come from its @graded(...) in the assignment's checks",
            "check": "a test's check is the one declared with @graded(<grade id>, ...) in the assignment's checks",
        }
        why = "; ".join(hint.get(k, "") for k in unknown if k in hint)
        raise ValueError(
            f"{frag}: cell {index} ({cell.cell_type}) has unknown header key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}" + (f" ({why})" if why else "")
        )
