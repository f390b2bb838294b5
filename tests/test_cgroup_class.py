"""A class of four graded by ``grade_class`` with two workers, on whichever cgroup back end this machine
mounts (v1 here in ``make test-full``, v2 in ``make test-cgroup2``'s guest): the reference answer and the
three correct styles that start processes (``!mkdir`` + ``%%writefile`` package, a ``%%bash`` helper, a
``multiprocessing.Pool``) each score what plain nbgrader scores (the stored fairness reference, full
marks), and the run leaves no sandbox group and no process behind.

``MLBOOK_TIME_SCALE`` (default 1) multiplies every time limit: the guest runs under software emulation
(TCG), some thirty to fifty times slower than this machine, and a limit there is not what this test proves.
"""

import dataclasses
import io
import os
import pathlib

import fairness_reference as ref
import graded_class
import nbformat
import pytest
from fairness_styles import STYLES, style_notebook
from mlbook_tools import cgroups
from mlbook_tools.classgrade import grade_class
from mlbook_tools.grading import read_scores
from ppo_checks import CHECKS

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.cgroup,
    pytest.mark.full,
    pytest.mark.skipif(
        cgroups.cgroups_available() is not None,
        reason=f"no usable cgroup here: {cgroups.cgroups_available()}",
    ),
]
PROCESS_STYLES = [
    "reference",
    "!mkdir package, %%writefile, import",
    "%%bash writes a helper module",
    "multiprocessing.Pool in an answer",
]
SCALE = float(os.environ.get("MLBOOK_TIME_SCALE", "1"))


def scaled(limits, factor: float):
    """``limits`` with every time limit (``*_seconds``) ``factor`` times longer; the rest unchanged."""
    times = {
        f.name: type(getattr(limits, f.name))(getattr(limits, f.name) * factor)
        for f in dataclasses.fields(limits)
        if f.name.endswith("_seconds")
    }
    return dataclasses.replace(limits, **times)


def _children() -> list[int]:
    """This process's children that are still running (a zombie has finished)."""
    me, found = os.getpid(), []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def _orphan_groups() -> list[pathlib.Path]:
    """Sandbox groups whose maker is gone (a live maker's may belong to a test running beside this one)."""
    return [
        g
        for parent in cgroups.sandbox_parents()
        for g in parent.glob("mlbook-sandbox-*")
        if not pathlib.Path(f"/proc/{g.name.split('-')[2]}").exists()
    ]


def test_process_styles_grade_as_under_nbgrader_and_the_class_leaves_nothing(tmp_path):
    course = graded_class.new_course(tmp_path / "course")
    base = nbformat.read(graded_class.SOLVED, as_version=4)
    for name in PROCESS_STYLES:
        graded_class.submit(
            course, ref.student(name), nbformat.writes(style_notebook(base, STYLES[name]))
        )
    limits = scaled(graded_class.LIMITS, SCALE)
    out = io.StringIO()
    grade_class(
        course,
        graded_class.NB,
        workers=2,
        progress=False,
        out=out,
        limits=limits,
        budget=limits.budget_seconds,
    )
    reference = ref.references()
    got, want = {}, {}
    for name in PROCESS_STYLES:
        mine = read_scores(course / "gradebook.db", graded_class.NB, ref.student(name))
        got[name] = (mine["score"], mine["extra_credit"]["score"])
        theirs = reference[name]
        want[name] = (
            sum(v for g, v in theirs.items() if not CHECKS[g].extra),
            sum(v for g, v in theirs.items() if CHECKS[g].extra),
        )
    assert got == want, (got, want, out.getvalue()[-3000:])
    full = sum(c.points for c in CHECKS.values() if not c.extra)
    assert all(core == full for core, _ in got.values()), got
    assert _children() == [], "a worker or sandbox outlived grade_class"
    assert _orphan_groups() == []
