"""An instructor's mistakes get a clear message and lose nothing (issue 28, part 3).

A course made by ``mlbook new-course`` (which prints what comes next) gets three submissions: one
misnamed (``rlhf_ppo-Copy1.ipynb``), one corrupt, one the untouched release (blank written answers).
``mlbook grade-class`` run inside the course with no ``--course``: the misnamed one is a problem of
that student naming the file, the corrupt one is recorded as unreadable (formgrader flags it, the
exports say so), a rerun says it graded nothing new, and both exports keep nbgrader's standard
columns plus a status. formgrader's Autograde button (``nbgrader autograde``) on a copy of the blank
release records the same status as grade-class. Outside a course folder, and without ``--course``
in the checkout, grade-class refuses with "not a course folder" and leaves no gradebook.db behind.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
from browser_support import chrome, have_chromium
from mlbook_tools import build
from mlbook_tools.config import layout
from mlbook_tools.grading import run_nbgrader
from mlbook_tools.plugins import STANDARD_COLUMNS

pytestmark = [pytest.mark.nbgrader, pytest.mark.sandbox, pytest.mark.browser]

ROOT = layout().root
NB = "rlhf_ppo"
MLBOOK = [sys.executable, "-m", "mlbook_tools.cli"]


def _run(cmd, cwd, timeout=900):
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _written_answers(course, student):
    """{grade id: (auto_score, needs_manual_grade)} of the written answers, as formgrader reads them."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission(NB, student)
        out = {
            g.name: (g.auto_score, bool(g.needs_manual_grade))
            for nb in sub.notebooks
            for g in nb.grades
            if g.cell.cell_type == "markdown"
        }
        return out, bool(sub.needs_manual_grade)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths") / "course"
    made = _run([*MLBOOK, "new-course", str(root)], cwd=root.parent)
    assert made.returncode == 0, made.stderr
    release = build.course_release(NB)  # what a course student receives (nbgrader over the source)
    for student, name, text in [
        ("alice", f"{NB}-Copy1.ipynb", release),
        ("bob", f"{NB}.ipynb", '{"cells": [ this is not json'),
        ("carol", f"{NB}.ipynb", release),
    ]:
        target = root / "submitted" / student / NB / name
        target.parent.mkdir(parents=True)
        target.write_text(text)
    first = _run([*MLBOOK, "grade-class", "--workers", "1"], cwd=root)
    again = _run([*MLBOOK, "grade-class", "--workers", "1"], cwd=root)
    return root, made, first, again


def test_new_course_prints_the_next_commands(course):
    root, made, _, _ = course
    out = made.stdout
    assert f"cd {root}" in out and "grade-class" in out, out
    # in the order they are needed; a regrade must reach the feedback pages (--force)
    assert out.index("generate_assignment rlhf_ppo --force") < out.index("grade-class"), out
    assert "generate_feedback rlhf_ppo --force" in out, out
    assert "Formgrader" in out and "submitted/<student>/rlhf_ppo/rlhf_ppo.ipynb" in out, out
    # every command of the README's instructor block, in the same words (paths filled in)
    readme = (layout().root / "README.md").read_text()
    block = readme.split(".venv/bin/mlbook new-course", 1)[1].split("```", 1)[0]
    commands = [ln.split("#")[0].split() for ln in block.splitlines()]
    commands = [c for c in commands if c and c[0] in ("nbgrader", "mlbook", "jupyter")]
    assert len(commands) >= 6, block
    for words in commands:
        assert " ".join(words[1:]) in out, (words, out)


def test_grade_class_names_the_misnamed_and_the_unreadable(course):
    root, _, first, _ = course
    out = first.stdout + first.stderr
    assert first.returncode == 1, out  # something needs the instructor
    assert "Traceback" not in out, out
    assert "alice" in out and "rlhf_ppo-Copy1.ipynb" in out and "rename" in out, out
    assert "NOT GRADED, misnamed (rename, then rerun): alice: rlhf_ppo-Copy1.ipynb" in first.stderr
    assert "UNREADABLE" in first.stderr and "bob" in first.stderr, first.stderr
    assert "2 submissions graded now" in first.stdout, first.stdout


def test_a_rerun_that_skipped_everything_says_so(course):
    _, _, _, again = course
    assert "0 submissions graded now, 2 unchanged since their last grading" in again.stdout, (
        again.stdout
    )
    assert "--force" in again.stdout


def test_exports_keep_nbgrader_columns_and_say_unreadable_and_misnamed(course):
    root, _, _, _ = course
    run_nbgrader(["export", "--to", "grades.csv"], root)
    with open(root / "grades.csv") as fh:
        reader = csv.DictReader(fh)
        rows = {r["student_id"]: r for r in reader}
        header = reader.fieldnames
    assert header[: len(STANDARD_COLUMNS)] == STANDARD_COLUMNS, header
    for col in ("timestamp", "late_submission_penalty", "raw_score", "status"):
        assert col in header
    assert rows["alice"]["status"] == "misnamed: rlhf_ppo-Copy1.ipynb (expected rlhf_ppo.ipynb)"
    assert rows["bob"]["status"].startswith("unreadable: ") and "JSON" in rows["bob"]["status"]
    assert rows["bob"]["needs_manual_grade"] == "True"  # formgrader lists it for a person
    assert rows["carol"]["status"] == "graded" and float(rows["carol"]["raw_score"]) == 0
    run_nbgrader(
        ["export", "--exporter", "mlbook_tools.export.WideCsvExport", "--to", "wide.csv"], root
    )
    wide = {r["student_id"]: r for r in csv.DictReader(open(root / "wide.csv"))}
    assert wide["alice"][f"{NB}:status"].startswith("misnamed: rlhf_ppo-Copy1.ipynb")
    assert wide["bob"][f"{NB}:status"].startswith("unreadable: ")
    autograded = (root / "autograded" / "bob" / NB / f"{NB}.ipynb").read_text()
    assert "not a readable notebook" in "".join(
        json.loads(autograded)["cells"][0]["source"]
    )  # formgrader's view


def test_autograde_button_and_grade_class_agree_on_blank_written_answers(course):
    root, _, first, _ = course
    carol = next(line for line in first.stdout.splitlines() if line.startswith("carol "))
    assert "awaiting manual grading" not in carol, carol  # as the gradebook: blank is 0, graded
    target = root / "submitted" / "dan" / NB / f"{NB}.ipynb"
    target.parent.mkdir(parents=True)
    shutil.copy(root / "submitted" / "carol" / NB / f"{NB}.ipynb", target)
    run_nbgrader(["autograde", NB, "--force", "--student=dan"], root)  # what the button runs
    by_class, sub_class = _written_answers(root, "carol")
    by_button, sub_button = _written_answers(root, "dan")
    assert by_class and by_class == by_button, (by_class, by_button)
    assert sub_class == sub_button


def test_grade_class_outside_a_course_folder_writes_nothing(tmp_path):
    had_root_db = (ROOT / "gradebook.db").exists()
    for cmd, cwd in [
        ([*MLBOOK, "grade-class", "--course", str(tmp_path)], ROOT),
        ([*MLBOOK, "grade-class"], tmp_path),
        ([*MLBOOK, "grade-class"], ROOT),
    ]:
        run = _run(cmd, cwd=cwd, timeout=120)
        out = run.stdout + run.stderr
        assert run.returncode == 1 and "not a course folder" in out and "Traceback" not in out, out
        assert "submissions graded" not in out, out
        assert "new-course" in out and "--course" in out, out
    assert list(tmp_path.iterdir()) == []
    assert (ROOT / "gradebook.db").exists() == had_root_db


def test_feedback_page_typesets_its_math_when_copied_alone(course, tmp_path):
    """A student gets the page alone: no script, no network, every formula drawn as MathML."""
    import re

    root, _, _, _ = course
    run_nbgrader(["generate_feedback", NB, "--force", "--student=carol"], root)
    alone = tmp_path / "Downloads" / "feedback.html"
    alone.parent.mkdir()
    shutil.copy(root / "feedback" / "carol" / NB / f"{NB}.html", alone)
    page = alone.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page), "the page loads a script"
    prose = re.sub(r"<(pre|code|script|style)\b.*?</\1>|<[^>]+>", "", page, flags=re.S)
    assert "$" not in prose, prose[prose.find("$") - 80 : prose.find("$") + 80]
    assert page.count("<math") > 300
    if not have_chromium():
        pytest.skip("no chromium here: the page's text was checked, not its drawing")
    driver = chrome(tmp_path / "profile")
    try:
        driver.get(alone.as_uri())
        # A file:// page of almost 1 MB can still be parsing when get() returns: wait for the whole document.
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return document.readyState") == "complete"
        )
        drawn = driver.execute_script(
            "const m = [...document.querySelectorAll('math')];"
            "return [m.length, m.filter(e => e.getBoundingClientRect().width > 0).length,"
            " m.filter(e => e.querySelector('merror')).length];"
        )
    finally:
        driver.quit()
    total, visible, errors = drawn
    assert total > 300 and visible == total and errors == 0, drawn


def test_a_rerun_prints_every_score_and_names_the_failing_checks(course):
    """Issue 32: the rerun printed no score, and no line named a failing check."""
    _, _, first, again = course
    carol = [ln for ln in again.stdout.splitlines() if ln.startswith("carol ")]
    assert len(carol) == 1 and "core" in carol[0] and "(unchanged, kept)" in carol[0], again.stdout
    assert "failed: test_" in carol[0], carol  # the release's stubs fail checks, named
    bob = [ln for ln in first.stdout.splitlines() if ln.startswith("bob ")]
    assert bob and "UNREADABLE: " in bob[0] and "awaiting manual grading" not in bob[0], bob
    assert "grade-class" in bob[0]  # what to do


def test_a_manual_grade_reaches_the_grade_class_line(course):
    """The README walk: after a person graded a written answer in formgrader, grade-class's line still
    said the autograder's extra credit while the gradebook, the exports and the feedback said more."""
    import re

    from nbgrader.api import Gradebook

    root, _, _, again = course

    def extra(run):
        carol = [ln for ln in run.stdout.splitlines() if ln.startswith("carol ")]
        assert len(carol) == 1, run.stdout + run.stderr
        return float(re.search(r"extra ([\d.]+)/", carol[0]).group(1))

    url = f"sqlite:///{root / 'gradebook.db'}"
    with Gradebook(url) as gb:  # as formgrader's extra-credit box saves it
        written = [
            g
            for nb in gb.find_submission(NB, "carol").notebooks
            for g in nb.grades
            if g.cell.cell_type == "markdown"
        ]
        grade = written[0]
        name, grade.manual_score, grade.extra_credit = grade.name, 0.0, 2.0
        gb.db.commit()
    try:
        rerun = _run([*MLBOOK, "grade-class", "--workers", "1"], cwd=root)
        assert extra(rerun) == extra(again) + 2.0, (name, rerun.stdout)
    finally:
        with Gradebook(url) as gb:
            grade = gb.find_grade(name, NB, NB, "carol")
            grade.manual_score, grade.extra_credit = None, None
            gb.db.commit()
