"""Where the repository and the course are: read from ``[tool.mlbook]`` in ``pyproject.toml``.

The repo tooling never locates files relative to its own installed location. The root is, in order:
``$MLBOOK_ROOT``; else the nearest folder at or above the working directory whose ``pyproject.toml``
has a ``[tool.mlbook]`` table; else the nearest such folder above the running interpreter's
environment (``sys.prefix``: ``make env`` puts ``.venv`` inside the checkout), so ``.venv/bin/mlbook``
works from any folder, e.g. a course folder or a student's work folder outside the checkout.
Every path in that table is relative to the root.

Each graded notebook is an ``Assignment``, one table ``[tool.mlbook.assignments.<name>]`` (its
checks and its reference module); the first one listed is every command's default. The course id
is the course folder's own (``c.CourseDirectory.course_id`` in its ``nbgrader_config.py``).
"""

from __future__ import annotations

import ast
import os
import pathlib
import sys
import tomllib
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    root: pathlib.Path
    chapters_src: pathlib.Path  # fragment folders, one per notebook (solutions/chapter)
    course: pathlib.Path  # the nbgrader course folder (autograde)
    release: pathlib.Path  # what students open (chapters)
    solved: pathlib.Path  # solved notebooks (solutions/notebooks)
    student_dist: pathlib.Path  # output folder of `mlbook student-dist`


def _table(pyproject: pathlib.Path) -> dict | None:
    try:
        return tomllib.loads(pyproject.read_text()).get("tool", {}).get("mlbook")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def find_root(start: str | os.PathLike | None = None) -> pathlib.Path:
    """The repository root (see the module docstring); a clear error if there is none."""
    env = os.environ.get("MLBOOK_ROOT")
    if env:
        root = pathlib.Path(env).resolve()
        if _table(root / "pyproject.toml") is None:
            raise FileNotFoundError(
                f"MLBOOK_ROOT={env} has no pyproject.toml with a [tool.mlbook] table"
            )
        return root
    here = pathlib.Path(start or os.getcwd()).resolve()
    prefix = pathlib.Path(sys.prefix).resolve()
    for folder in (here, *here.parents, *prefix.parents):
        if _table(folder / "pyproject.toml") is not None:
            return folder
    raise FileNotFoundError(
        f"no checkout of the chapter found (a pyproject.toml with [tool.mlbook]) at or above {here} "
        f"or above {prefix}: run the checkout's .venv/bin/mlbook, or set MLBOOK_ROOT to the checkout"
    )


def layout(start: str | os.PathLike | None = None) -> Layout:
    root = find_root(start)
    table = _table(root / "pyproject.toml") or {}
    defaults = dict(
        chapters_src="solutions/chapter",
        course="autograde",
        release="chapters",
        solved="solutions/notebooks",
        student_dist="build/student-dist",
    )
    paths = {key: root / table.get(key.replace("_", "-"), value) for key, value in defaults.items()}
    return Layout(root=root, **paths)


# ---------------------------------------------------------------------------------- assignments

STATE = ".mlbook_grading"  # grade-class's state in a course folder, one folder per assignment


def source_in(course: pathlib.Path, name: str) -> pathlib.Path:
    """Assignment ``name``'s nbgrader source notebook in ``course`` (what ``mlbook build`` writes)."""
    return pathlib.Path(course) / "source" / name / f"{name}.ipynb"


def state_in(course: pathlib.Path, name: str) -> pathlib.Path:
    """grade-class's state folder of assignment ``name`` in ``course`` (never released)."""
    return pathlib.Path(course) / STATE / name


@dataclass(frozen=True)
class Assignment:
    """One graded notebook of the book: an nbgrader assignment, from ``[tool.mlbook.assignments.<name>]``."""

    name: str
    """The assignment and its notebook, ``<name>.ipynb``: fragments in ``<chapters-src>/<name>/``,
    submissions at ``submitted/<student>/<name>/<name>.ipynb``."""
    course_id: str
    """nbgrader's course id: ``c.CourseDirectory.course_id`` in the course folder's
    ``nbgrader_config.py`` (the hub's exchange and the instructor's course folder are named by it)."""
    checks: pathlib.Path
    """The graded checks: a module whose ``CHECKS`` maps each test's grade id to its ``@graded``
    check; the build writes the hidden tests from it and the grader calls it (table key ``checks``)."""
    reference: str
    """The reference module, imported by name: a check's parameter that no answer cell defines is
    taken from it, its functions calling the student's (table key ``reference``)."""
    release: pathlib.Path
    """What students open: ``<release>/<name>.ipynb`` (the self-paced copy ``mlbook build`` writes)."""

    def source(self, course: pathlib.Path) -> pathlib.Path:
        """The nbgrader source notebook in ``course`` (the checkout's course folder or a copy)."""
        return source_in(course, self.name)

    def state(self, course: pathlib.Path) -> pathlib.Path:
        """grade-class's state folder in ``course`` (``<course>/.mlbook_grading/<name>/``)."""
        return state_in(course, self.name)


def course_id(course: pathlib.Path) -> str:
    """``c.CourseDirectory.course_id`` of ``course/nbgrader_config.py``, read without running the
    file (it imports nbgrader's plugins): a top-level assignment of a string literal."""
    path = pathlib.Path(course) / "nbgrader_config.py"
    tree = ast.parse(path.read_text())
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and ast.unparse(stmt.targets[0]) == "c.CourseDirectory.course_id"
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            return stmt.value.value
    raise ValueError(f'{path} sets no c.CourseDirectory.course_id = "..." (a string literal)')


def assignments(start: str | os.PathLike | None = None) -> dict[str, Assignment]:
    """Every assignment of ``[tool.mlbook.assignments]``, by name, in the file's order."""
    L = layout(start)
    tables = (_table(L.root / "pyproject.toml") or {}).get("assignments", {})
    out = {}
    for name, table in tables.items():
        unknown = sorted(set(table) - {"checks", "reference"})
        missing = sorted({"checks", "reference"} - set(table))
        if unknown or missing:
            raise ValueError(
                f"[tool.mlbook.assignments.{name}] in {L.root / 'pyproject.toml'}: "
                + "; ".join(
                    [f"unknown key(s) {', '.join(unknown)}"] * bool(unknown)
                    + [f"missing {', '.join(missing)}"] * bool(missing)
                )
                + " (keys: checks, reference)"
            )
        out[name] = Assignment(
            name=name,
            course_id=course_id(L.course),
            checks=L.root / table["checks"],
            reference=table["reference"],
            release=L.release / f"{name}.ipynb",
        )
    return out


def assignment(name: str | None = None, start: str | os.PathLike | None = None) -> Assignment:
    """Assignment ``name``; without a name the default, the first configured."""
    found = assignments(start)
    if not found:
        raise ValueError(
            f"no [tool.mlbook.assignments.<name>] table in {find_root(start) / 'pyproject.toml'}"
        )
    if name is None:
        return next(iter(found.values()))
    if name not in found:
        raise ValueError(
            f"no assignment {name!r} in [tool.mlbook.assignments] (configured: {', '.join(found)})"
        )
    return found[name]
