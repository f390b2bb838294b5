"""``mlbook student-dist``: exactly what the students of a graded course receive, in one folder.

    <out>/mlbook-<version>-py3-none-any.whl   the student library (src/mlbook only)
    <out>/rlhf_ppo.ipynb (+ .py)               the released notebooks, as nbgrader generated them
    <out>/requirements.txt                     the pinned third-party environment (requirements/lock.txt)

Students install it with ``pip install -r requirements.txt && pip install --no-deps mlbook-*.whl``.
Nothing else ships: no reference implementation (mlbook_solutions), no source notebook, no hidden
test, no grading tool. ``tests/test_student_dist.py`` proves it, and runs the released notebook with
only this folder installed.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from mlbook_tools.config import layout
from mlbook_tools.workcopy import refuse_if_answered


def build_wheel(out: pathlib.Path) -> pathlib.Path:
    """Build the library's wheel (the root project, src/mlbook) into ``out``; returns its path."""
    root = layout().root
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(root),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"building the mlbook wheel failed:\n{run.stderr[-3000:]}")
    wheels = sorted(out.glob("mlbook-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one mlbook wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def student_dist(out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Write the student distribution to ``out`` (default: [tool.mlbook] student-dist); returns it."""
    L = layout()
    out = pathlib.Path(out) if out else L.student_dist
    refuse_if_answered(sorted(out.glob("*.ipynb")) + sorted(out.glob("*.py")))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    build_wheel(out)
    notebooks = sorted(L.release.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no released notebook in {L.release}: run `mlbook build` first")
    for nb in notebooks:
        shutil.copy(nb, out / nb.name)
        paired = nb.with_suffix(".py")
        if paired.exists():
            shutil.copy(paired, out / paired.name)
    shutil.copy(L.root / "requirements" / "lock.txt", out / "requirements.txt")
    return out
