"""A student's work is never an output: ``mlbook start`` and the guard every notebook writer calls.

``mlbook start [DIR]`` copies the released notebooks into the student's own folder (default
``~/rlhf-ppo-work``), outside the checkout, so that no build, test, make target, ``git checkout``
or fresh clone ever writes there; a notebook already in DIR is never overwritten.

:func:`refuse_if_answered` is called by ``mlbook build`` (every mode) and ``mlbook student-dist``
before they write anything: a released notebook (``chapters/<nb>.ipynb`` or its ``.py`` pair) in
which an answer cell no longer holds nbgrader's stub, or which has cells the release does not
have, holds a student's answers, and the command stops with a message saying where to work.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jupytext

from mlbook_tools.config import layout

DEFAULT_DIR = pathlib.Path("~/rlhf-ppo-work")
STUBS = ("raise NotImplementedError", "YOUR ANSWER HERE")  # what nbgrader leaves in an answer cell


class HoldsAnswers(RuntimeError):
    """A file a command would overwrite holds a student's answers."""


def _cells(path: pathlib.Path) -> list[dict]:
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        return [dict(c) for c in jupytext.reads(text, fmt="py:percent").cells]
    try:
        return list(json.loads(text).get("cells", []))
    except (ValueError, AttributeError):
        return [{"cell_type": "raw", "source": "unreadable notebook", "metadata": {}}]


def answered_cells(path: str | pathlib.Path) -> list[str]:
    """Names of the cells of a released notebook that hold a student's work (empty: none)."""
    found = []
    for i, cell in enumerate(_cells(pathlib.Path(path))):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        meta = (cell.get("metadata") or {}).get("nbgrader")
        if not isinstance(meta, dict):
            if source.strip():
                found.append(f"cell {i + 1} (a cell the release does not have)")
        elif meta.get("solution") and not any(stub in source for stub in STUBS):
            found.append(str(meta.get("grade_id", f"cell {i + 1}")))
    return found


def refuse_if_answered(paths) -> None:
    """Raise :class:`HoldsAnswers` if any existing file in ``paths`` holds a student's answers."""
    for path in map(pathlib.Path, paths):
        if not path.is_file() or path.suffix not in (".ipynb", ".py"):
            continue
        cells = answered_cells(path)
        if cells:
            shown = ", ".join(cells[:4]) + (f" and {len(cells) - 4} more" if len(cells) > 4 else "")
            raise HoldsAnswers(
                f"{path} holds answers ({shown}); nothing was written. Work in your own copy: "
                f"`mlbook start` copies the release to {DEFAULT_DIR}; move this file there "
                f"(e.g. `mv {path} {DEFAULT_DIR}/`), then `git checkout -- {path}` restores the release."
            )


def release_paths() -> list[pathlib.Path]:
    """The released notebooks (and their .py pairs) that ``mlbook build`` writes."""
    release = layout().release
    return sorted(release.glob("*.ipynb")) + sorted(release.glob("*.py"))


def start(folder: str | pathlib.Path | None = None) -> tuple[pathlib.Path, list[str], list[str]]:
    """Copy the released notebooks into ``folder``; returns (folder, copied names, kept names)."""
    out = pathlib.Path(folder or DEFAULT_DIR).expanduser().resolve()
    notebooks = sorted(layout().release.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no released notebook in {layout().release}: run `mlbook build`")
    if layout().root in (out, *out.parents):
        raise HoldsAnswers(
            f"{out} is inside the checkout, where commands write: pick a folder outside it"
        )
    out.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for nb in notebooks:
        target = out / nb.name
        if target.exists():
            kept.append(nb.name)
            continue
        shutil.copyfile(nb, target)
        copied.append(nb.name)
    return out, copied, kept
