"""Where the repository and the course are: read from ``[tool.mlbook]`` in ``pyproject.toml``.

The repo tooling never locates files relative to its own installed location. The root is, in order:
``$MLBOOK_ROOT``; else the nearest folder at or above the working directory whose ``pyproject.toml``
has a ``[tool.mlbook]`` table; else the nearest such folder above the running interpreter's
environment (``sys.prefix``: ``make env`` puts ``.venv`` inside the checkout), so ``.venv/bin/mlbook``
works from any folder, e.g. a course folder or a student's work folder outside the checkout.
Every path in that table is relative to the root.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tomllib
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    root: pathlib.Path
    chapters_src: pathlib.Path  # fragment folders, one per notebook (solutions/chapter)
    checks: pathlib.Path  # the graded checks (tests/ppo_checks.py)
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
        checks="tests/ppo_checks.py",
        course="autograde",
        release="chapters",
        solved="solutions/notebooks",
        student_dist="build/student-dist",
    )
    paths = {key: root / table.get(key.replace("_", "-"), value) for key, value in defaults.items()}
    return Layout(root=root, **paths)
