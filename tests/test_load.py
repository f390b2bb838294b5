"""A grade does not depend on how busy the machine is.

Budgets count what a submission itself consumes (``driver``: seconds charged to its sandbox, its own CPU
time or the time it ran or slept, never time spent waiting for a CPU someone else held), with a
wall-clock backstop wall_factor times larger. Here a small class (a correct notebook, a slow one, a
CPU hog and a memory hog from tests/adversarial_catalog.py) is graded twice with the adversarial
suite's short limits: once as the machine is, once with as many busy processes as cores competing
for the CPUs; every test of every student must get the same score both times.
"""

import dataclasses
import os
import shutil

import adversarial_catalog as adv
import nbformat
import pytest
from mlbook_tools.classentry import Outcome
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import run_nbgrader
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS

ROOT = layout().root
NB = "rlhf_ppo"
LIMITS = dataclasses.replace(
    DEFAULT_LIMITS, cell_seconds=8.0, call_seconds=5.0, memory_bytes=1536 * 1024**2
)
BUDGET = 45.0  # as in tests/test_adversarial.py
ENTRIES = ["slow_every_call", "cpu_loop_ignoring_sigint", "memory_hog_in_gae"]

pytestmark = [  # minutes: make test-full (CI runs it right after make test)
    pytest.mark.sandbox,  # conftest skips these where bubblewrap cannot start
    pytest.mark.full,
]


def _submission(entry: dict) -> nbformat.NotebookNode:
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in entry.get("cells", {}):
            cell.source = entry["cells"][gid]
    return nb


def _course(root):
    root.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "autograde" / "source", root / "source")
    run_nbgrader(["generate_assignment", NB, "--force"], root)
    students = {"correct": {}, **{name: adv.ENTRIES[name] for name in ENTRIES}}
    for student, entry in students.items():
        assert entry.get("base", "solved") == "solved" and not entry.get("add")
        target = root / "submitted" / student / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(_submission(entry), target)
    return root


def _scores(course) -> dict:
    results = grade_class(
        course,
        NB,
        workers=2,
        force=True,
        progress=False,
        out=open(os.devnull, "w"),
        limits=LIMITS,
        budget=BUDGET,
    )
    assert all(e.outcome is Outcome.GRADED for e in results.values()), results
    return {s: {g: v.score for g, v in e.result.grades.items()} for s, e in results.items()}


def test_the_same_grades_with_every_core_busy(tmp_path):
    course = _course(tmp_path / "course")
    as_is = _scores(course)
    with adv.busy_cores():
        loaded = _scores(course)
    print("\nscores (as is == under load):", as_is)
    # Every grade the same, slow_every_call's included: its cells and calls of gae are cut at their
    # limits (interrupted, charged exactly the limit), nothing restarts, and neither the sandbox's
    # start-up nor the driver's own wait for a CPU is charged (driver.Session, sandbox.Runner.request).
    assert loaded == as_is
    # and they are what each entry earned: the correct notebook everything, the others lose their core
    # tests named in the catalog
    full = as_is["correct"]
    assert all(s > 0 for s in full.values())
    for name in ENTRIES:
        lost = {g for g, s in as_is[name].items() if s < full[g] and not g.startswith("ex")}
        assert lost == set(adv.ENTRIES[name]["lost"]), (name, lost)
