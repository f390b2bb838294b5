"""The course workflow end to end: real nbgrader release, the sandboxed class grader, nbgrader feedback and export.

One class is graded once (module fixture) by ``grade_class`` (what ``mlbook grade-class`` runs):
the solved notebook (full marks), the untouched release (0 on every hidden test), answers written
differently but correctly (full marks), three classic mistakes (points lost on exactly those
tests), a submission whose process dies half-way, and a file that is not a notebook at all. The
broken ones cost only their own points; the run goes on. nbgrader's own ``generate_feedback`` and
``export`` then work on the gradebook and ``autograded/`` notebooks the grader wrote. Plain
``nbgrader autograde`` stays usable for trusted files: a correct notebook that warns keeps its points.
"""

import csv
import json
import shutil
import subprocess
import sys

import grading_catalog as cat
import nbformat
import pytest
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores, run_nbgrader
from ppo_checks import CHECKS

ROOT = layout().root
NB = "rlhf_ppo"
SIX = [gid for gid, check in CHECKS.items() if not check.extra]  # the six named tests
# Extra credit a correct submission earns before manual grading: the graded exercises' checks.
EXTRA_AUTO = sum(check.points for check in CHECKS.values() if check.extra)


def extra_max() -> float:
    """All the extra credit on offer: the graded exercises plus the written answers (source notebook)."""
    from mlbook_tools.driver import EXTRA_PREFIX, cell_points

    source = nbformat.read(ROOT / "autograde" / "source" / NB / f"{NB}.ipynb", as_version=4)
    return sum(cell_points(c) for c in source.cells
               if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(EXTRA_PREFIX)
               and (c.metadata["nbgrader"].get("grade") or c.metadata["nbgrader"].get("task")))  # fmt: skip


def _solved_with(answers: dict[str, str]) -> str:
    """The solved notebook with some answer cells (by grade_id) replaced."""
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nbformat.writes(nb)


CORRECT_VARIANTS = ["shaped_rewards_one_hot", "last_index_flip_argmax", "gae_vectorised",
                    "clip_max_of_negatives_trl_clipfrac", "value_where_form", "controller_numpy_clip"]  # fmt: skip
MISTAKES = ["gae_lambda_ignored", "value_clip_around_returns", "controller_without_clip"]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "autograde" / "source", root / "source")
    run_nbgrader(["generate_assignment", NB, "--force"], root)
    submissions = {
        "alice": (ROOT / "solutions" / "notebooks" / f"{NB}.ipynb").read_text(),
        "bob": (root / "release" / NB / f"{NB}.ipynb").read_text(),
        "carol": _solved_with({"gae": "import os\nos._exit(1)"}),  # the kernel dies in the gae cell
        "erin": _solved_with(dict(cat.CORRECT[name] for name in CORRECT_VARIANTS)),
        "frank": _solved_with({cat.WRONG[name][1]: cat.WRONG[name][2] for name in MISTAKES}),
        "dave": "this is not a notebook {",
    }
    for student, text in submissions.items():
        target = root / "submitted" / student / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        target.write_text(text)
    with open(
        root / "grade_class.txt", "w"
    ) as out:  # its summary lines, as the instructor reads them
        results = grade_class(root, NB, workers=2, progress=False, out=out)
    assert set(results) == set(submissions)
    return root


def test_release_has_no_solutions_or_hidden_tests(course):
    release = course / "release" / NB
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


def test_release_matches_the_committed_student_notebook(course):
    def cells(path):
        return [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]

    assert cells(course / "release" / NB / f"{NB}.ipynb") == cells(
        ROOT / "chapters" / f"{NB}.ipynb"
    )


def test_solved_notebook_gets_full_points(course):
    scores = read_scores(course / "gradebook.db", NB, "alice")
    for name in SIX:
        assert scores["grades"][name]["score"] == scores["grades"][name]["max_score"] > 0, (
            name,
            scores["grades"][name],
        )
    assert scores["score"] == scores["max_score"]


def test_release_gets_zero_on_every_hidden_test(course):
    scores = read_scores(course / "gradebook.db", NB, "bob")
    for name in SIX:
        assert scores["grades"][name]["score"] == 0, (name, scores["grades"][name])


def test_correct_variants_get_full_points(course):
    scores = read_scores(course / "gradebook.db", NB, "erin")
    assert {n: scores["grades"][n]["score"] for n in SIX} == {
        n: scores["grades"][n]["max_score"] for n in SIX
    }


def test_mistakes_lose_points_on_their_tests_only(course):
    grades = read_scores(course / "gradebook.db", NB, "frank")["grades"]
    for name in MISTAKES:
        assert grades[cat.WRONG[name][0]]["score"] == 0, name
    for test in (cat.SHAPED, cat.CLIP):
        assert grades[test]["score"] == grades[test]["max_score"], test


def test_dead_process_costs_only_the_tests_that_need_it(course):
    scores = read_scores(
        course / "gradebook.db", NB, "carol"
    )  # nbgrader #427: a dead kernel used to pass everything after
    for name in SIX:
        lost = name in (
            cat.GAE,
            cat.TRAIN,
        )  # the gae cell killed the process: gae and the training loop need it
        want = 0 if lost else scores["grades"][name]["max_score"]
        assert scores["grades"][name]["score"] == want, (name, scores["grades"][name])


def test_broken_file_does_not_stop_the_class(course):
    graded = {p.parent.parent.name for p in (course / "autograded").glob(f"*/{NB}/{NB}.ipynb")}
    assert {
        "alice",
        "bob",
        "carol",
        "dave",
        "erin",
        "frank",
    } <= graded  # dave's notebook explains why it got 0


def test_feedback_and_grades_csv(course):
    run_nbgrader(["generate_feedback", NB, "--force"], course)
    html = (course / "feedback" / "bob" / NB / f"{NB}.html").read_text()
    assert "NotImplementedError" in html  # the student sees why they lost the points ...
    assert "Core: 0 / 10" in html and "Extra credit: 0 /" in html  # core and extra credit apart
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
    run_nbgrader(["export", "--to", str(course / "grades.csv")], course)
    rows = {r["student_id"]: r for r in csv.DictReader((course / "grades.csv").open())}
    alice = read_scores(course / "gradebook.db", NB, "alice")
    assert (
        float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == alice["max_score"]
    )  # core only
    assert float(rows["alice"]["extra_credit"]) == alice["extra_credit"]["score"]
    assert float(rows["bob"]["score"]) == 0 and float(rows["dave"]["score"]) == 0


def test_mlbook_grade_reports_a_file_that_is_not_a_notebook(tmp_path, capsys):
    from mlbook_tools.cli import main

    bad = tmp_path / "submission.ipynb"
    bad.write_text("this is not a notebook {")
    assert main(["grade", str(bad), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["score"] == 0 and result["max_score"] >= 10 and "JSON" in result["error"]
    assert set(SIX) <= set(result["grades"])
    assert main(["grade", str(bad)]) == 1 and "cannot grade this file" in capsys.readouterr().out


def test_mlbook_grade_prints_every_message_and_the_manual_cells():
    run = subprocess.run([sys.executable, "-m", "mlbook_tools.cli", "grade", str(ROOT / "chapters" / f"{NB}.ipynb")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name in SIX:
        assert f"FAIL {name}" in run.stdout
    assert "gae raised NotImplementedError" in run.stdout
    assert "awaiting manual grading" in run.stdout and "core total: 0 / 10" in run.stdout


def test_nbgrader_autograde_grades_through_the_sandbox_and_grade_class_notices(course):
    """formgrader's Autograde button runs `nbgrader autograde` with the course config: the sandboxed engine
    grades (no hidden test left in the autograded notebook), and grade-class regrades what it did not write."""
    root = course
    # a stderr line in a helper: plain nbgrader zeroed such a test cell; the engine never looks at stderr
    warn = (
        "import sys\n_gae = gae\n\n\ndef gae(*a, **k):\n"
        "    print('Warning: a harmless note', file=sys.stderr)\n    return _gae(*a, **k)\n"
    )
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "AdaptiveKLController":
            cell.source += "\n\n\n" + warn
    target = root / "submitted" / "wendy" / NB / f"{NB}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, target)
    run_nbgrader(["autograde", NB, "--force", "--student=wendy"], root)
    scores = read_scores(root / "gradebook.db", NB, "wendy")
    assert (
        scores["score"] == scores["max_score"] == 10
        and scores["extra_credit"]["score"] == EXTRA_AUTO
    )
    autograded = (root / "autograded" / "wendy" / NB / f"{NB}.ipynb").read_text()
    assert "BEGIN HIDDEN TESTS" not in autograded and "_brute_gae" not in autograded
    assert "sandboxed engine" in autograded
    # the same button over a grade-class result: the next grade-class run regrades that student
    run_nbgrader(["autograde", NB, "--force", "--student=alice"], root)
    with open(root / "regrade.txt", "w") as out:
        grade_class(root, NB, workers=1, progress=False, out=out)
    lines = (root / "regrade.txt").read_text()
    assert lines.startswith("alice") and "wendy" in lines and "bob" not in lines, lines


def test_one_score_everywhere(course):
    """One correct submission: grade-class's line, the gradebook (formgrader's data), feedback, export, mlbook grade."""
    from mlbook_tools.grading import grade_notebook
    from nbgrader.api import Gradebook

    core, core_max = 10, 10  # the six named tests
    extra, extra_max_ = EXTRA_AUTO, extra_max()  # the graded exercises; they + the written answers
    line = next(
        l for l in (course / "grade_class.txt").read_text().splitlines() if l.startswith("alice")
    )
    assert f"core {core:4g}/{core_max}  extra {extra:g}/{extra_max_:g}" in line, line
    assert "awaiting manual grading: 5" in line
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:  # what formgrader shows
        sub = gb.find_submission(NB, "alice")
        assert sub.max_score == core_max  # extra-credit cells are worth 0 points in nbgrader ...
        assert sub.score == core + extra  # ... and their points are nbgrader's extra_credit
        grades = {g.name: g for nb in sub.notebooks for g in nb.grades}
        assert sum(g.extra_credit or 0 for g in grades.values()) == extra
        waiting = [n for n, g in grades.items() if g.needs_manual_grade]
        assert len(waiting) == 5 and all(n.startswith("ex") for n in waiting)
    scores = read_scores(course / "gradebook.db", NB, "alice")
    assert (scores["score"], scores["max_score"]) == (core, core_max)
    assert (scores["extra_credit"]["score"], scores["extra_credit"]["max_score"]) == (
        extra,
        extra_max_,
    )
    run_nbgrader(["generate_feedback", NB, "--force", "--student=alice"], course)
    html = (course / "feedback" / "alice" / NB / f"{NB}.html").read_text()
    assert (
        f"Core: {core} / {core_max} points." in html
        and f"Extra credit: {extra:g} / {extra_max_:g}" in html
    )
    assert "Awaiting manual grading" in html and "Score: 0.0 / 1.0" not in html
    run_nbgrader(["export", "--to", str(course / "one.csv")], course)
    row = next(r for r in csv.DictReader((course / "one.csv").open()) if r["student_id"] == "alice")
    assert [float(row[k]) for k in ("score", "max_score", "extra_credit", "extra_credit_max")] == [
        core, core_max, extra, extra_max_]  # fmt: skip
    run_nbgrader(
        [
            "export",
            "--exporter",
            "mlbook_tools.export.WideCsvExport",
            "--to",
            str(course / "wide.csv"),
        ],
        course,
    )
    row = next(
        r for r in csv.DictReader((course / "wide.csv").open()) if r["student_id"] == "alice"
    )
    assert [float(row[f"{NB}:{k}"]) for k in ("score", "max_score", "extra_credit", "extra_credit_max")] == [
        core, core_max, extra, extra_max_]  # fmt: skip
    mine = grade_notebook(course / "submitted" / "alice" / NB / f"{NB}.ipynb", course=course)
    assert (mine["score"], mine["max_score"]) == (core, core_max)
    assert (mine["extra_credit"]["score"], mine["extra_credit"]["max_score"]) == (extra, extra_max_)
