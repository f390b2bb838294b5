"""Every input the trusted side reads is bounded before it is parsed, and every grade ends at its wall clock.

A submission past a bound on what is graded (file size, cells, cell sources, JSON values and nesting)
is refused with one "too large: ..." line within a second or two, recorded as that student's grade,
in all three entry points: ``mlbook grade``, ``mlbook grade-class`` and ``nbgrader autograde``
(formgrader's Autograde button). What a notebook stores beside its code (outputs, attachments,
metadata) past a bound is left out with a note, and the code graded. A grade never runs past its
wall-clock backstop (wall_factor x the budget, counted from reading the file) + 5 s, in the same three.
(The scan itself on crafted bytes: tests/test_submission_bounds.py.)
"""

import contextlib
import io
import json
import os
import pathlib
import queue
import shutil
import sys
import time

import nbformat
import pytest
from mlbook_tools import classgrade_worker, cli, driver, grading, meter, plugins
from mlbook_tools.classentry import Outcome
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores, run_nbgrader
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from ppo_checks import CORE_MAX
from traitlets.config import Configurable

pytestmark = pytest.mark.sandbox  # conftest skips these where bubblewrap cannot start

ROOT = layout().root
NB = "rlhf_ppo"
SOLVED = ROOT / "solutions" / "notebooks" / f"{NB}.ipynb"
BUDGET = 4.0  # charged seconds for the backstop tests: their backstop is BUDGET * wall_factor


def _huge(path: pathlib.Path, cells: int = 400_000) -> pathlib.Path:
    """The solved notebook plus ``cells`` small added cells: ~50 MB."""
    nb = json.loads(SOLVED.read_text())
    cell = '{"cell_type": "code", "execution_count": null, "id": "added-cell", "metadata": {}, "outputs": [], "source": ["x = 1  # added\\n"]}'
    head = json.dumps({k: v for k, v in nb.items() if k != "cells"})[:-1]
    body = ",\n".join([json.dumps(c) for c in nb["cells"]] + [cell] * cells)
    path.write_text(head + ', "cells": [\n' + body + "\n]}")
    return path


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    path = _huge(tmp_path_factory.mktemp("bounds") / "huge.ipynb")
    assert path.stat().st_size >= 48 * 1024**2
    return path


def _sleeper() -> str:
    """A release whose student added a cell that sleeps for ten minutes."""
    nb = nbformat.read(ROOT / "autograde" / "source" / NB / f"{NB}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import time\ntime.sleep(600)\n"))
    return nbformat.writes(nb)


def _course(
    root: pathlib.Path, students: dict[str, str], budget: float | None = None
) -> pathlib.Path:
    root.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "autograde" / "source", root / "source")
    if budget is not None:
        with open(root / "nbgrader_config.py", "a") as fh:
            fh.write(f"\nc.SandboxedExecute.budget = {budget}\n")
    run_nbgrader(["generate_assignment", NB, "--force"], root)
    for student, text in students.items():
        target = root / "submitted" / student / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        if isinstance(text, pathlib.Path):
            shutil.copy(text, target)
        else:
            target.write_text(text)
    return root


# ------------------------------------------------------------------------------ the bounds themselves


def test_a_huge_file_is_refused_without_being_parsed(huge):
    t0 = time.process_time()  # CPU seconds: what parsing would cost, whatever the machine's load
    with pytest.raises(driver.TooLarge, match=r"^too large: \d+\+? cells \(limit 2000\)"):
        driver.read_submission(huge)
    assert time.process_time() - t0 < 1


@pytest.mark.parametrize(
    "what, notebook, line",
    [
        (
            "cells",
            {"cells": [{"cell_type": "code", "source": ""}] * 2001},
            "2001 cells (limit 2000)",
        ),
        # the key written with an escape hides it from the raw count: the exact count after parsing holds
        (
            "escaped cells",
            '{"cells": [' + ",".join(['{"cell\\u005ftype": "code"}'] * 2001) + "]}",
            "2001 cells",
        ),
        (
            "values",
            {"cells": [{"cell_type": "code", "source": [""] * 200_001}]},
            "JSON values outside stored outputs and metadata (limit 200000)",
        ),
        (
            "sources",
            {"cells": [{"cell_type": "code", "source": "x" * (5 * 1024**2)}]},
            "cell sources",
        ),
        (
            "nesting",
            {"cells": [{"cell_type": "code", "source": json.loads("[" * 80 + "]" * 80)}]},
            "nested more than 64",
        ),
        (
            "deep nesting",
            '{"cells": [], "extra": ' + "[" * 200_000 + "]" * 200_000 + "}",
            "nested more than",
        ),
    ],
)
def test_each_bound_is_one_clear_line(what, notebook, line):
    text = notebook if isinstance(notebook, str) else json.dumps(notebook)
    t0 = time.process_time()  # CPU seconds: a bound checked before parsing costs little
    with pytest.raises(driver.TooLarge, match="^too large: ") as err:
        driver.check_bounds(text)
    assert line in str(err.value), what
    assert time.process_time() - t0 < 1


@pytest.mark.parametrize(
    "what, notebook, expected",
    [
        (
            "outputs",
            {"cells": [{"cell_type": "code", "outputs": [{"text": "x" * (17 * 1024**2)}]}]},
            {"cells": [{"cell_type": "code", "outputs": []}]},
        ),
        (
            "nesting",
            {"cells": [], "metadata": json.loads("[" * 80 + "]" * 80)},
            {"cells": [], "metadata": {}},
        ),
        (
            "deep nesting",
            '{"cells": [], "metadata": ' + "[" * 200_000 + "]" * 200_000 + "}",
            {"cells": [], "metadata": {}},
        ),
    ],
)
def test_what_is_stored_beside_the_code_is_left_out_not_refused(what, notebook, expected):
    text = notebook if isinstance(notebook, str) else json.dumps(notebook)
    t0 = time.process_time()  # CPU seconds, as above
    kept = json.loads(driver.check_bounds(text))
    assert time.process_time() - t0 < 2, what
    assert kept == expected, what


# ------------------------------------------------------------------------------ the three entry points


def test_mlbook_grade_refuses_a_huge_submission_within_two_seconds(huge):
    grading.load_course(layout().course, NB)  # imports warm: what is timed is this file's grading
    out = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = cli.main(["grade", str(huge)])
    assert time.monotonic() - t0 <= 2
    assert code == 1
    first = out.getvalue().splitlines()[0]
    assert first.startswith("cannot grade this file: too large: ") and "cells (limit 2000)" in first
    assert "note: too large" not in out.getvalue()  # said once, not repeated as a note
    assert "core total: 0 /" in out.getvalue()


def test_grade_class_records_the_refusal_for_that_student_only(tmp_path, huge):
    release = (ROOT / "autograde" / "source" / NB / f"{NB}.ipynb").read_text()
    course = _course(tmp_path / "course", {"big": huge, "bob": release})
    out = io.StringIO()
    results = grade_class(course, NB, workers=2, progress=False, out=out)
    big = results["big"]
    assert big.outcome is Outcome.GRADED and big.seconds <= 2, big
    assert any(p.startswith("too large: ") and "cells (limit 2000)" in p for p in big.why)
    assert "too large: " in next(
        line for line in out.getvalue().splitlines() if line.startswith("big")
    )
    assert (
        read_scores(course / "gradebook.db", NB, "big")["score"] == 0
    )  # recorded: a grade, not an error
    assert results["bob"].outcome is Outcome.GRADED
    assert not any("too large" in p for p in results["bob"].why)
    autograded = nbformat.read(course / "autograded" / "big" / NB / f"{NB}.ipynb", as_version=4)
    assert "too large: " in autograded.cells[0].source
    assert len(autograded.cells) < 200


class _Converter(Configurable):
    """The attributes of nbgrader's Autograde converter the exporter reads."""

    def __init__(self, root, **kw):
        super().__init__(**kw)
        self.coursedir = type("CourseDir", (), {"root": str(root)})()
        self._sanitizing = True


def test_the_autograde_button_refuses_a_huge_submission(tmp_path, huge):
    course = _course(tmp_path / "course", {"big": huge})
    exporter = plugins.BoundedNotebookExporter(parent=_Converter(course))
    resources = {"nbgrader": {"assignment": NB, "notebook": NB, "student": "big"}}
    t0 = time.monotonic()
    text, resources = exporter.from_filename(str(huge), resources=resources)
    nb = nbformat.reads(text, as_version=4)
    resources["metadata"]["path"] = str(
        course / "autograded" / "big" / NB
    )  # nbgrader's second pass
    nb, _ = plugins.SandboxedExecute().preprocess(nb, resources)
    assert time.monotonic() - t0 <= 2
    assert (
        nb.cells[0].source.count("too large: ") == 1 and "cells (limit 2000)" in nb.cells[0].source
    )
    # the real command: the refusal is that student's grade in the gradebook
    run_nbgrader(["autograde", NB, "--force"], course)
    scores = read_scores(course / "gradebook.db", NB, "big")
    assert scores["score"] == 0 and scores["max_score"] == CORE_MAX
    autograded = nbformat.read(course / "autograded" / "big" / NB / f"{NB}.ipynb", as_version=4)
    assert "too large: " in autograded.cells[0].source


# ------------------------------------------------------------------------------ stored beside the code


def _plots_and_deep_metadata() -> str:
    """The solved notebook as a plotting-heavy, Colab-saved one: ~18 MB of stored images (past the
    16 MB kept), its gae answer's metadata 100 levels deep beside its nbgrader entry."""
    nb = nbformat.read(SOLVED, as_version=4)
    image = "iVBORw0KGgo" + "A" * (2_000_000 - 11)  # base64 text: what a figure stores
    answers = [
        c
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    ]
    for cell in answers[:6]:
        cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": image})]
    for cell in answers:
        if cell.metadata["nbgrader"]["grade_id"] == "gae":
            cell.metadata["colab"] = json.loads("[" * 100 + "]" * 100)
    nb.cells.append(nbformat.v4.new_code_cell("figure = 1\n"))
    nb.cells[-1].outputs = [nbformat.v4.new_output("display_data", data={"image/png": image})] * 3
    return nbformat.writes(nb)


def test_a_correct_notebook_with_20_mb_of_plots_and_deep_metadata_earns_its_points(tmp_path):
    path = tmp_path / "plots.ipynb"
    path.write_text(_plots_and_deep_metadata())
    assert 16 * 1024**2 < path.stat().st_size < DEFAULT_LIMITS.max_notebook_bytes
    result = grading.grade_notebook(path, NB)
    assert result.error is None and result.core.score == result.core.max_score == CORE_MAX, (
        result.problems
    )
    notes = [p for p in result.problems if "left out" in p]
    assert any("stored metadata" in p and "levels deep" in p for p in notes), notes
    assert any("stored outputs" in p for p in notes), notes


def _bomb() -> str:
    """The issue's bomb: the solved notebook with 18 MB of empty dicts in an added cell's metadata."""
    nb = json.loads(SOLVED.read_text())
    nb["cells"].insert(3, nbformat.v4.new_code_cell("y = 1\n", metadata={"x": "PLACE"}))
    return json.dumps(nb).replace('"PLACE"', "[" + "{}," * (6 * 1024**2 - 1) + "{}]")


def test_the_empty_dict_bomb_is_graded_within_its_backstop_in_a_class_run(tmp_path):
    """Was ~150 s of parsing and copying in a grade-class worker against a 65 s backstop (budget 20)."""
    course = _course(tmp_path / "course", {"bomb": _bomb()})
    budget = 20.0
    t0 = time.monotonic()
    results = grade_class(course, NB, workers=1, progress=False, out=io.StringIO(), budget=budget)
    took = time.monotonic() - t0
    bomb = results["bomb"]
    assert bomb.outcome is Outcome.GRADED, bomb
    assert bomb.seconds <= budget * DEFAULT_LIMITS.wall_factor + 5, bomb.seconds
    assert bomb.result.core.score == bomb.result.core.max_score == CORE_MAX, bomb
    assert any("stored metadata (18.0 MB" in p for p in bomb.why), bomb.why
    autograded = course / "autograded" / "bomb" / NB / f"{NB}.ipynb"
    assert autograded.stat().st_size < 2 * 1024**2
    print(f"bomb graded in {bomb.seconds} s (class run {took:.1f} s)")


# ------------------------------------------------------------------------------ the wall-clock backstop


def test_mlbook_grade_stops_at_its_wall_backstop_even_if_nothing_is_charged(tmp_path, monkeypatch):
    """Worst case for the backstop: a sandbox whose charged time never moves (it only waits)."""
    monkeypatch.setattr(meter.Meter, "charged", staticmethod(lambda s0, s1: 0.0))
    path = tmp_path / "sleeper.ipynb"
    path.write_text(_sleeper())
    t0 = time.monotonic()
    result = grading.grade_notebook(path, NB, budget=BUDGET)
    assert time.monotonic() - t0 <= BUDGET * DEFAULT_LIMITS.wall_factor + 5
    assert result.core.score == 0 and result.problems


@pytest.mark.full  # a class run and the Autograde button at their backstops: make test-full (CI)
def test_grade_class_and_the_autograde_button_end_within_the_backstop(tmp_path, huge):
    course = _course(tmp_path / "course", {"sleeper": _sleeper(), "big": huge}, budget=BUDGET)
    results = grade_class(
        course, NB, workers=1, progress=False, out=open(os.devnull, "w"), budget=BUDGET
    )
    sleeper = results["sleeper"]
    assert sleeper.seconds <= BUDGET * DEFAULT_LIMITS.wall_factor + 5, sleeper
    assert sleeper.outcome is Outcome.GRADED
    # nbgrader autograde: the refused one costs only nbgrader's own start and writing (the baseline)
    t0 = time.monotonic()
    run_nbgrader(["autograde", NB, "--force", "--student=big"], course)
    baseline = time.monotonic() - t0
    t0 = time.monotonic()
    run_nbgrader(["autograde", NB, "--force", "--student=sleeper"], course)
    assert time.monotonic() - t0 - baseline <= BUDGET * DEFAULT_LIMITS.wall_factor + 5
    assert read_scores(course / "gradebook.db", NB, "sleeper")["score"] == 0


# ------------------------------------------------------------------------------ the class worker's backstop

HANGS = "import sys, time\nsys.stdin.readline()\nsys.stdin.readline()\nprint({started!r}, flush=True)\ntime.sleep(600)\n"


@pytest.mark.classrun  # starts a (fake) class worker subprocess
def test_a_worker_past_its_backstop_is_stopped_at_once_and_not_retried(monkeypatch):
    """Whatever the trusted side does with a submission, its worker answers by backstop + grace."""
    monkeypatch.setattr(
        classgrade_worker,
        "WORKER",
        [sys.executable, "-c", HANGS.format(started=classgrade_worker.STARTED)],
    )
    jobs, done = queue.Queue(), queue.Queue()
    jobs.put(("mallory", "/nonexistent.ipynb", "fp", 0))
    t0 = time.monotonic()
    classgrade_worker.drive({"init": True}, jobs, done, start=30, backstop=3, attempts=2)
    took = time.monotonic() - t0
    got, notebook = done.get_nowait()
    assert got.student == "mallory" and got.outcome is Outcome.UNGRADED and notebook is None, got
    assert 3 <= took < 3 + 5, took  # one attempt: a retry would double it
    assert got.problems == (
        "UNGRADED after 1 attempt: its grading did not end by its wall-clock backstop + grace (3 s) and was stopped",
    )
    assert done.empty() and jobs.empty()
