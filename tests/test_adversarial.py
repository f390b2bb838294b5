"""The adversarial catalog through the class grader (``mlbook grade-class``'s engine), in the shared class.

Every entry of ``adversarial_catalog.ENTRIES`` is a student of the one graded class
(tests/graded_class.py: one ``grade_class`` run, two workers, short deadlines), beside the honest
students of test_autograde and the fairness styles; every assertion below reads that run:
no cheat gains a point, correct work loses nothing to output, warnings or a crash elsewhere,
nobody else's data (gradebook, config, secret, submissions, hidden tests) is touched or leaked,
no process of a submission outlives its grading, and the run completes for everyone.
"""

import copy
import json
import os
import pathlib
import shutil

import adversarial_catalog as adv
import nbformat
import pytest
from graded_class import (
    BOUND,
    BUDGET,
    CORE,
    FULL_ENTRIES,
    LIMITS,
    NB,
    TOKEN,
    WORKERS,
    submit,
    tier_param,
)
from mlbook_tools import driver, grading
from mlbook_tools.classentry import Outcome
from mlbook_tools.classgrade import grade_class
from mlbook_tools.result import GradingResult
from ppo_checks import CORE_MAX

pytestmark = [pytest.mark.classrun, pytest.mark.sandbox]


def test_catalog_is_big_enough_and_covers_every_class():
    kinds = {}
    for entry in adv.ENTRIES.values():
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    assert len(adv.ENTRIES) >= 50 and set(kinds) == set(adv.KINDS), kinds


def test_the_class_run_completes_for_everyone(graded_class):
    students = set(graded_class.subs)
    assert set(graded_class.results) == students
    lines = {line.split()[0] for line in graded_class.lines.splitlines() if line.strip()}
    for student in students:
        assert (graded_class.course / "autograded" / student / NB / f"{NB}.ipynb").exists(), student
        assert graded_class.scores(student)["max_score"] == CORE_MAX, (
            student
        )  # every one has a gradebook entry
        assert student in lines, student


def test_student_text_reaches_no_terminal_and_breaks_no_file(graded_class):
    """Escape sequences in an error message are replaced before anything prints or stores them; a lone
    surrogate or odd metadata in a notebook still gives a readable autograded notebook and a grade."""
    assert "\x1b" not in graded_class.lines
    for name in ("terminal_escapes", "lone_surrogate", "nbgrader_metadata_list"):
        path = graded_class.course / "autograded" / name / NB / f"{NB}.ipynb"
        nb = nbformat.read(path, as_version=4)
        assert "\x1b" not in json.dumps(nb, ensure_ascii=False), name
        got = graded_class.results[name]
        assert got.outcome is Outcome.GRADED, (name, got.why)


@pytest.mark.parametrize("name", [tier_param(n, FULL_ENTRIES) for n in sorted(adv.ENTRIES)])
def test_entry_gets_exactly_what_it_earned(graded_class, name):
    entry, result = adv.ENTRIES[name], graded_class.results[name]
    scores = graded_class.scores(name)
    if entry.get("base") != "solved":
        assert scores["score"] == 0, (name, {k: g["score"] for k, g in scores["grades"].items()})
        return
    assert result.seconds <= BOUND, name  # the per-submission bound holds for everyone
    lost = entry.get("lost", [])
    if lost is None:  # slow entries: whatever they score, they finished within the bound (above)
        return
    for test, points in CORE.items():
        want = 0 if test in lost else points
        got = scores["grades"][test]["score"]
        assert got == want, (name, test, result.result.grades[test].message)


def test_nobody_elses_data_is_touched(graded_class):
    course = graded_class.course
    changed = [
        str(p) for p, digest in graded_class.before.items() if graded_class.after[p] != digest
    ]
    assert not changed, changed
    allowed = ("autograded", ".mlbook_grading", "gradebook.db")
    strays = [
        p for p in graded_class.created if not p.relative_to(course).parts[0].startswith(allowed)
    ]
    assert not strays, strays
    assert not list(course.glob("pwned*"))
    cache = (
        pathlib.Path.home() / ".cache" / "mlbook"
    )  # the old grader's course cache, if any: untouched
    for path in (p for p in cache.rglob("*.py") if p.is_file()):
        assert "Execute.enabled = False" not in path.read_text(errors="replace"), path


def test_no_process_of_a_submission_outlives_the_grading(graded_class):
    alive = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if TOKEN.encode() in (proc / "cmdline").read_bytes():
                    alive.append(proc.name)
            except OSError:
                pass
    assert not alive


def test_nothing_hidden_leaks_into_what_students_see(graded_class):
    course = graded_class.course
    secret = (course / driver.SECRET_FILE).read_text().strip()
    for nb_path in course.glob(f"autograded/*/{NB}/{NB}.ipynb"):
        text = nb_path.read_text()
        assert len(text) < 1_500_000, nb_path  # a 50 MB print is capped
        for leak in (secret, "_brute_gae", "BEGIN HIDDEN TESTS", "check_gae(", "_last_index_loop"):
            assert leak not in text, (nb_path, leak[:20])
    html = graded_class.feedback("read_hidden_tests_and_secret")
    for leak in (secret, "_brute_gae", "BEGIN HIDDEN TESTS", "check_gae("):
        assert leak not in html
    assert f"Core: 0 / {CORE_MAX:g}" in html and "Extra credit" in html


def test_problems_are_noted_for_that_student_only(graded_class):
    problems = {name: " ".join(e.why) for name, e in graded_class.results.items()}
    assert "more than once" in problems["duplicated_graded_cell"]
    assert (
        "missing" in problems["deleted_answer_cell"]
        and "missing" in problems["renamed_answer_cell"]
    )
    assert "not a readable notebook" in problems["malformed_json"]
    assert "was edited" in problems["edited_locked_train_loop"]
    assert "did not finish" in problems["top_level_endless_loop"]
    assert "stopped the Python process" in problems["kernel_dies_in_gae_cell"]
    assert not problems["alice"] and not problems["bob"]


def test_regrading_is_resumable_and_gives_the_same_scores(graded_class):
    again = grade_class(
        graded_class.course,
        NB,
        workers=WORKERS,
        progress=False,
        out=open(os.devnull, "w"),
        limits=LIMITS,
        budget=BUDGET,
    )
    timed = {
        n for n, e in adv.ENTRIES.items() if e.get("lost", []) is None
    }  # slow entries: load decides
    assert {k: e.result.core.score for k, e in again.items() if k not in timed} == {
        k: e.result.core.score for k, e in graded_class.results.items() if k not in timed
    }
    assert all(e.recorded and e.fingerprint for e in again.values())


def test_nothing_but_the_runner_pipes_reaches_a_sandbox_started_by_a_class_worker(graded_class):
    """The escape probe ran inside a sandbox that a grade-class worker started: it saw only the
    runner's two pipes and stdin/stdout/stderr, and neither the repository nor the course is mounted."""
    output = graded_class.results["escape_fd_and_mount_probe"].result.output
    line = next(part for part in output.splitlines() if part.startswith(adv.FDPROBE))
    seen = json.loads(line[len(adv.FDPROBE) :])
    assert seen["fds"] == sorted([0, 1, 2, *seen["runner"]]), seen
    assert not seen["repo_mounted"] and not seen["course_mounted"]


def test_no_submission_is_left_ungraded_and_no_internal_error_is_a_grade(graded_class):
    for name, entry in graded_class.results.items():
        assert entry.outcome is Outcome.GRADED, (name, entry.why)
        assert "internal" not in " ".join(entry.why), name


def _verdicts(result: GradingResult) -> dict:
    return {k: (g.score, g.message) for k, g in result.grades.items()}


def test_an_honest_grade_does_not_depend_on_who_else_is_in_the_class(graded_class):
    """Issue 16 section 5: alice (correct), bob (untouched release) and a correct notebook that warns,
    graded again each on its own, give the verdicts they got beside every attack class in the shared
    run (so a grading repeats, too)."""
    kinds = {adv.ENTRIES[n]["kind"] for n in graded_class.results if n in adv.ENTRIES}
    assert {"escape", "write-back forge", "memory", "processes", "slow", "malformed frame"} <= kinds
    source_nb, checks, secret = grading.load_course(graded_class.course, NB)
    for student in ("alice", "bob", "correct_but_warns"):
        # one after the other: CPython 3.11's ast.parse is not safe across threads
        by_itself, _ = grading.grade_submission(
            graded_class.subs[student], source_nb, checks, secret, student
        )
        assert _verdicts(by_itself) == _verdicts(graded_class.results[student].result), student
    assert (
        graded_class.results["alice"].result.core.score == CORE_MAX
        and graded_class.results["bob"].result.core.score == 0
    )


def test_an_honest_grade_does_not_depend_on_how_busy_the_machine_is(graded_class):
    """The fast form of tests/test_load.py (make test-full: a small class graded twice): alice graded
    again with every core kept busy by other processes gets the verdicts of the class run."""

    source_nb, checks, secret = grading.load_course(graded_class.course, NB)
    with adv.busy_cores():
        loaded, _ = grading.grade_submission(
            graded_class.subs["alice"], source_nb, checks, secret, "alice"
        )
    assert _verdicts(loaded) == _verdicts(graded_class.results["alice"].result)


def test_workers_grade_side_by_side(graded_class):
    """The class took about (sum of its gradings) / workers, not their sum: the slow entries (a whole
    budget each) and the honest work run two at a time. The tail: one worker alone for a last grading."""
    busy = sum(e.seconds for e in graded_class.results.values())
    tail = 2 * max(e.seconds for e in graded_class.results.values())  # the last, longest gradings
    assert graded_class.seconds <= busy / WORKERS + tail, (graded_class.seconds, busy, tail)
    assert busy / WORKERS + tail < busy  # the bound is tighter than one worker at a time would take


def _broken(limits):
    """``limits`` with a deadline that is not a number: ``GradingLimits`` refuses to build one (its
    ``__post_init__``), so it is forced here, as a damaged worker message would carry it."""
    broken = copy.copy(limits)
    object.__setattr__(broken, "cell_seconds", "not a number")
    return broken


def test_an_internal_error_is_retried_then_left_ungraded_and_never_cached(graded_class, tmp_path):
    """A grading that fails inside the engine (here: a deadline that is not a number) is no grade: the
    worker is replaced, the submission tried again, then reported UNGRADED, not recorded, not cached."""
    from nbgrader.api import Gradebook, MissingEntry

    course = tmp_path / "broken"  # a class of its own: the shared one's release, one new student
    course.mkdir()
    for part in ("nbgrader_config.py", "source", "release", "gradebook.db", driver.SECRET_FILE):
        src = graded_class.course / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, course / part)
    submit(course, "zoe", graded_class.subs["alice"])
    out = []
    results = grade_class(
        course,
        NB,
        workers=1,
        progress=False,
        out=type("O", (), {"write": lambda s, t: out.append(t), "flush": lambda s: None})(),
        limits=_broken(LIMITS),
    )
    assert (
        set(results) == {"zoe"}
        and results["zoe"].outcome is Outcome.UNGRADED
        and "UNGRADED after 2 attempts" in "".join(out)
    )
    assert not (course / ".mlbook_grading" / NB / "zoe.json").exists()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        with pytest.raises(MissingEntry):
            gb.find_submission(NB, "zoe")


CLASS_WIDE = (  # what holds for every student of the class, whoever is in it
    test_the_class_run_completes_for_everyone,
    test_nobody_elses_data_is_touched,
    test_no_process_of_a_submission_outlives_the_grading,
    test_no_submission_is_left_ungraded_and_no_internal_error_is_a_grade,
    test_workers_grade_side_by_side,
)


@pytest.mark.full
def test_the_class_wide_properties_hold_for_the_full_tier_too(graded_class):
    """make test-full grades its own class (the costly entries, the other styles): the same checks."""
    assert FULL_ENTRIES <= set(graded_class.subs)
    for check in CLASS_WIDE:
        check(graded_class)
