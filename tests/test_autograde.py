"""The course workflow end to end: real nbgrader release, the sandboxed class grader, nbgrader feedback and export.

Reads the shared graded class (tests/graded_class.py, one ``grade_class`` run, what ``mlbook
grade-class`` runs): the solved notebook (alice, full marks), the untouched release (bob, 0 on every
hidden test) and three classic mistakes (frank, points lost on exactly those tests). A process that
dies half-way and a file that is not a notebook are adversarial catalog entries of the same class
(test_adversarial); answers written differently are the fairness styles (test_fairness). nbgrader's
own ``generate_feedback`` and ``export`` then work on the gradebook and ``autograded/`` notebooks the
grader wrote, and formgrader's Autograde button (``nbgrader autograde``) grades through the same engine.
"""

import os
import re
import subprocess
import sys

import grading_catalog as cat
import nbformat
import pytest
from graded_class import CORE, EXTRA_AUTO, MISTAKES, NB, ROOT, submit, written_answers
from mlbook_tools import build
from mlbook_tools.classgrade import grade_class
from mlbook_tools.grading import read_scores, run_nbgrader
from ppo_checks import CORE_MAX

pytestmark = [pytest.mark.classrun, pytest.mark.nbgrader, pytest.mark.sandbox]

SIX = list(CORE)  # the six named tests


def test_the_release_is_the_committed_student_notebook_without_solutions(graded_class):
    release = graded_class.course / "release" / NB
    assert sorted(p.name for p in release.iterdir()) == [
        f"{NB}.ipynb"
    ]  # nothing but the notebook ships
    text = (release / f"{NB}.ipynb").read_text()
    for leak in (
        "BEGIN SOLUTION",
        "BEGIN HIDDEN TESTS",
        "_brute_gae",
        "check_gae(",
        "torch.where(response_mask.bool()",
    ):
        assert leak not in text

    def cells(path, audience):
        """Every cell but the instructions of one audience (build.AUDIENCES), and those apart."""
        shared, own = [], []
        for c in nbformat.read(path, as_version=4).cells:
            tags = set(c.metadata.get("tags", [])) & set(build.AUDIENCES)
            (own if tags else shared).append((c.cell_type, c.source))
            assert tags <= {audience}, (path, tags)
        return shared, own

    course, course_own = cells(graded_class.course / "release" / NB / f"{NB}.ipynb", build.COURSE)
    solo, solo_own = cells(ROOT / "chapters" / f"{NB}.ipynb", build.SELF_PACED)
    assert course == solo  # one source: the two renderings differ in their instructions only
    assert course_own and solo_own and course_own != solo_own


def test_mistakes_lose_points_on_their_tests_only(graded_class):
    grades = graded_class.scores("frank")["grades"]
    lost = {cat.WRONG[name][0] for name in MISTAKES}
    for name in SIX:
        assert grades[name]["score"] == (0 if name in lost else CORE[name]), name


def test_the_release_scores_zero_and_its_feedback_and_export_say_so(graded_class):
    scores = graded_class.scores("bob")
    for name in SIX:
        assert scores["grades"][name]["score"] == 0, (name, scores["grades"][name])
    assert scores["max_score"] == CORE_MAX
    html = graded_class.feedback("bob")
    assert "NotImplementedError" in html  # the student sees why they lost the points ...
    assert (
        f"Core: 0 / {CORE_MAX:g}" in html and "Extra credit: 0 /" in html
    )  # core and extra credit apart
    # ... but neither the hidden tests' source nor a traceback quoting them (a hidden test's traceback would
    # name check_* / _call_quiet / _expect; tracebacks of the student's own visible cells may stay)
    for leak in (
        "_brute_gae",
        "check_gae",
        "check_shaped_rewards",
        "_call_quiet",
        "_expect(",
        "BEGIN HIDDEN TESTS",
        "_last_index_loop",
    ):
        assert leak not in html, leak
    rows = graded_class.export()
    alice = read_scores(graded_class.course / "gradebook.db", NB, "alice")
    assert (
        float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == alice["max_score"]
    )  # core only
    assert float(rows["alice"]["extra_credit"]) == alice["extra_credit"]["score"]
    assert float(rows["bob"]["score"]) == 0 and float(rows["malformed_json"]["score"]) == 0


def test_mlbook_grade_prints_every_message_and_the_manual_cells():
    # as from a notebook's `!` cell (JPY_PARENT_PID): a progress line on stderr as it starts and ends
    env = {k: v for k, v in os.environ.items() if k != "MLBOOK_PROGRESS"}
    run = subprocess.run(
        [sys.executable, "-m", "mlbook_tools.cli", "grade", str(ROOT / "chapters" / f"{NB}.ipynb")],
        capture_output=True,
        text=True,
        env={**env, "JPY_PARENT_PID": "1"},
    )
    assert run.returncode == 0, run.stderr
    stages = re.findall(r"^\[\s*\d+s\] (.+)$", run.stderr, re.M)
    assert (
        len(stages) == 2 and stages[0].startswith("grading ") and stages[1].startswith("graded in")
    )
    for name in SIX:
        assert f"FAIL {name}" in run.stdout
    assert "gae raised NotImplementedError" in run.stdout
    assert f"core total: 0 / {CORE_MAX:g}" in run.stdout
    # written answers left as released: 0 and nothing to grade by hand, as the gradebook records them
    # (the line once said "awaiting manual grading" while the gradebook and exports said "graded")
    assert "left blank: 0" in run.stdout and "awaiting manual grading" not in run.stdout


def test_nbgrader_autograde_grades_through_the_sandbox_and_grade_class_notices(
    graded_class, tmp_path
):
    """formgrader's Autograde button runs `nbgrader autograde` with the course config: the sandboxed engine
    grades (no hidden test left in the autograded notebook), and grade-class regrades what it did not write.
    On a copy of the class: the other tests read the class as grade-class left it."""
    root = graded_class.copy(tmp_path / "course")
    # a stderr line in a helper: plain nbgrader zeroed such a test cell; the engine never looks at stderr
    warn = (
        "import sys\n_gae = gae\n\n\ndef gae(*a, **k):\n"
        "    print('Warning: a harmless note', file=sys.stderr)\n    return _gae(*a, **k)\n"
    )
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "AdaptiveKLController":
            cell.source += "\n\n\n" + warn
    submit(root, "wendy", nbformat.writes(nb))
    run_nbgrader(["autograde", NB, "--force", "--student=wendy"], root)
    scores = read_scores(root / "gradebook.db", NB, "wendy")
    assert (
        scores["score"] == scores["max_score"] == CORE_MAX
        and scores["extra_credit"]["score"] == EXTRA_AUTO
    )
    autograded = (root / "autograded" / "wendy" / NB / f"{NB}.ipynb").read_text()
    assert "BEGIN HIDDEN TESTS" not in autograded and "_brute_gae" not in autograded
    assert "sandboxed engine" in autograded
    # the same button over a grade-class result: the next grade-class run regrades that student
    run_nbgrader(["autograde", NB, "--force", "--student=alice"], root)
    with open(root / "regrade.txt", "w") as out:
        grade_class(root, NB, workers=1, progress=False, out=out)
    lines = (root / "regrade.txt").read_text().splitlines()
    graded = [ln for ln in lines if ln.strip() and not ln.endswith("(unchanged, kept)")]
    assert sorted(line.split()[0] for line in graded) == ["alice", "wendy"], lines
    kept = [ln.split()[0] for ln in lines if ln.endswith("(unchanged, kept)")]
    assert "alice" not in kept and "bob" in kept, lines  # the rest say their kept scores


def test_one_score_everywhere(graded_class):
    """One correct submission: grade-class's line, the gradebook (formgrader's data), feedback, export, mlbook grade."""
    from mlbook_tools.grading import grade_notebook
    from nbgrader.api import Gradebook

    course, core, extra = graded_class.course, CORE_MAX, EXTRA_AUTO
    manual = written_answers()
    extra_max = EXTRA_AUTO + sum(manual.values())  # the graded exercises and the written answers
    line = next(line for line in graded_class.lines.splitlines() if line.split()[:1] == ["alice"])
    assert f"core {core:4g}/{core:g}  extra {extra:g}/{extra_max:g}" in line, line
    assert f"awaiting manual grading: {len(manual)}" in line
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:  # what formgrader shows
        sub = gb.find_submission(NB, "alice")
        assert sub.max_score == core  # extra-credit cells are worth 0 points in nbgrader ...
        assert sub.score == core + extra  # ... and their points are nbgrader's extra_credit
        grades = {g.name: g for nb in sub.notebooks for g in nb.grades}
        assert sum(g.extra_credit or 0 for g in grades.values()) == extra
        assert {n for n, g in grades.items() if g.needs_manual_grade} == set(manual)
    scores = graded_class.scores("alice")
    assert (scores["score"], scores["max_score"]) == (core, core)
    for name in SIX:  # full points on each of the six named tests
        assert scores["grades"][name]["score"] == scores["grades"][name]["max_score"] == CORE[name]
    assert (scores["extra_credit"]["score"], scores["extra_credit"]["max_score"]) == (
        extra,
        extra_max,
    )
    html = graded_class.feedback("alice")
    assert (
        f"Core: {core:g} / {core:g} points." in html
        and f"Extra credit: {extra:g} / {extra_max:g}" in html
    )
    assert "Awaiting manual grading" in html and "Score: 0.0 / 1.0" not in html
    for exporter, prefix in ((None, ""), ("mlbook_tools.export.WideCsvExport", f"{NB}:")):
        row = graded_class.export(exporter)["alice"]
        assert [
            float(row[prefix + k])
            for k in ("score", "max_score", "extra_credit", "extra_credit_max")
        ] == [core, core, extra, extra_max], exporter
    wide = graded_class.export("mlbook_tools.export.WideCsvExport")["alice"]
    assert [wide[f"{NB}:{gid}"] for gid in manual] == [""] * len(manual)  # awaiting: not a 0
    assert all(float(wide[f"{NB}:{name}"]) == CORE[name] for name in SIX)
    mine = grade_notebook(course / "submitted" / "alice" / NB / f"{NB}.ipynb", course=course)
    assert (mine.core.score, mine.core.max_score) == (core, core)
    assert (mine.extra.score, mine.extra.max_score) == (extra, extra_max)
