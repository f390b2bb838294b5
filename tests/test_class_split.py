"""docs/scale.md's plan for several grading machines, followed as written.

One course is graded in one run. A second, identical course is split in two: each copy (the same
``source/``, config and grading secret, half of ``submitted/``) is graded on its own, as a second
machine would; each copy's ``autograded/<student>/`` and ``.mlbook_grading/<assignment>/<student>.json``
are copied back, and ``grade-class`` runs once on the main course. That pass grades nothing again,
and the gradebook it leaves equals the one-run gradebook, cell by cell.
"""

import json
import shutil

import graded_class as gc
import grading_catalog as cat
import pytest
from mlbook_tools.classentry import Outcome
from mlbook_tools.classgrade import grade_class
from mlbook_tools.grading import read_scores
from ppo_checks import CORE_MAX

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.full]

NB = gc.NB
STATE = f".mlbook_grading/{NB}"


def _class(course) -> dict[str, str]:
    """Four students: correct, untouched, two different sets of mistakes."""
    wrong = list(cat.WRONG)
    return {
        "alice": gc.SOLVED.read_text(),
        "bob": (course / "release" / NB / f"{NB}.ipynb").read_text(),
        "frank": gc.solved_with({cat.WRONG[n][1]: cat.WRONG[n][2] for n in gc.MISTAKES}),
        "gina": gc.solved_with({cat.WRONG[wrong[-1]][1]: cat.WRONG[wrong[-1]][2]}),
    }


def _grade(course) -> dict:
    return grade_class(
        course,
        NB,
        workers=gc.WORKERS,
        progress=False,
        out=open("/dev/null", "w"),  # noqa: SIM115
        limits=gc.LIMITS,
        budget=gc.BUDGET,
    )


def _gradebook(course, students) -> dict:
    return {s: read_scores(course / "gradebook.db", NB, s) for s in students}


def test_two_copies_graded_apart_merge_into_the_one_run_gradebook(tmp_path):
    whole = gc.new_course(tmp_path / "whole")
    subs = _class(whole)
    for student, text in subs.items():
        gc.submit(whole, student, text)
    main = tmp_path / "main"
    shutil.copytree(whole, main)  # released, secret, submitted/: before any grading
    _grade(whole)

    halves = [["alice", "frank"], ["bob", "gina"]]
    for k, half in enumerate(halves):  # machine k: the course with its students only
        copy = shutil.copytree(main, tmp_path / f"machine{k}")
        for student in set(subs) - set(half):
            shutil.rmtree(copy / "submitted" / student)
        graded = _grade(copy)
        assert set(graded) == set(half)
        for student in half:  # what the doc says to copy back
            shutil.copytree(copy / "autograded" / student, main / "autograded" / student)
            (main / STATE).mkdir(parents=True, exist_ok=True)
            shutil.copy(copy / STATE / f"{student}.json", main / STATE / f"{student}.json")

    merged = _grade(main)
    assert all(e.outcome is Outcome.UNCHANGED for e in merged.values()), {
        s: e.outcome for s, e in merged.items()
    }  # nothing graded twice
    want, got = _gradebook(whole, subs), _gradebook(main, subs)
    assert got == want, json.dumps({"one run": want, "merged": got}, indent=1, default=str)
    assert want["alice"]["score"] > want["frank"]["score"] > want["bob"]["score"]  # not all equal


def test_a_copied_back_grading_for_other_source_is_graded_again(tmp_path):
    """The merge trusts a copied-back grading only when it was made from this course's submission
    and checks: one whose notebook carries another fingerprint is graded here."""
    main = gc.new_course(tmp_path / "main")
    gc.submit(main, "alice", gc.SOLVED.read_text())
    other = shutil.copytree(main, tmp_path / "other")
    (other / "submitted" / "alice" / NB / f"{NB}.ipynb").write_text(
        gc.solved_with({cat.WRONG[gc.MISTAKES[0]][1]: cat.WRONG[gc.MISTAKES[0]][2]})
    )
    _grade(other)
    shutil.copytree(other / "autograded", main / "autograded")
    shutil.copytree(other / ".mlbook_grading", main / ".mlbook_grading")
    merged = _grade(main)
    assert merged["alice"].outcome is Outcome.GRADED
    assert merged["alice"].result.core.score == CORE_MAX
