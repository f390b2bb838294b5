"""Differential fairness: correct work in ordinary styles scores the same under the sandboxed engine as
under plain ``nbgrader autograde`` (a real IPython kernel, the reference for the expected score).

Every style of ``fairness_styles.STYLES`` is one student of two copies of the course: the engine grades
one copy in a single ``mlbook grade-class`` run, plain nbgrader grades the other in a single
``nbgrader autograde`` run (kernel execution, its course config switched back with
``grading.use_kernel_autograde``). Core scores come from each gradebook; for plain nbgrader the
extra-credit tests (0-point cells in nbgrader) are read from the executed notebook's test cells.
"""

import os
import shutil

import nbformat
import pytest
from fairness_styles import STYLES, style_notebook
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores, run_nbgrader, use_kernel_autograde
from nbgrader.utils import determine_grade
from ppo_checks import CHECKS

ROOT = layout().root
NB = "rlhf_ppo"
pytestmark = pytest.mark.slow  # ~25 notebooks executed in a kernel: a few minutes on 2 cores


def _student(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _course(root, kernel: bool):
    root.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "autograde" / "source", root / "source")
    if kernel:
        use_kernel_autograde(root)
    run_nbgrader(["generate_assignment", NB, "--force"], root)
    base = nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)
    for name, style in STYLES.items():
        target = root / "submitted" / _student(name) / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(style_notebook(base, style), target)
    return root


def _kernel_extra(course, student):
    """Extra credit under plain nbgrader: each ex* test cell that ran without an error, at its points."""
    nb = nbformat.read(course / "autograded" / student / NB / f"{NB}.ipynb", as_version=4)
    total = 0.0
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in CHECKS and CHECKS[gid].extra:
            cell.metadata.nbgrader["points"] = CHECKS[gid].points
            total += determine_grade(cell)[0] or 0.0
    return total


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fairness")
    engine, kernel = _course(tmp / "engine", False), _course(tmp / "kernel", True)
    grade_class(engine, NB, workers=2, progress=False, out=open(os.devnull, "w"))
    run_nbgrader(["autograde", NB, "--force"], kernel)
    rows = {}
    for name in STYLES:
        s = _student(name)
        mine, theirs = (
            read_scores(engine / "gradebook.db", NB, s),
            read_scores(kernel / "gradebook.db", NB, s),
        )
        rows[name] = dict(engine=(mine["score"], mine["extra_credit"]["score"]),
                          kernel=(theirs["score"], _kernel_extra(kernel, s)),
                          lost=sorted(g for g, v in mine["grades"].items() if v["score"] < v["max_score"]
                                      and not g.startswith("ex")))  # fmt: skip
    print("\nstyle: engine (core, extra) / nbgrader (core, extra)")
    for name, row in rows.items():
        print(f"  {name:40s} {row['engine']} / {row['kernel']}")
    return rows


def test_at_least_twenty_styles():
    assert len(STYLES) >= 20


@pytest.mark.parametrize("name", list(STYLES))
def test_style_scores_as_under_nbgrader(graded, name):
    row, lost = graded[name], STYLES[name].get("lost", [])
    core = sum(c.points for g, c in CHECKS.items() if not c.extra and g not in lost)
    extra = sum(c.points for c in CHECKS.values() if c.extra)
    assert row["kernel"] == (core, extra), f"the reference itself: {row}"
    assert row["engine"] == row["kernel"], f"{name}: engine lost {row['lost']}"
