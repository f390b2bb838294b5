"""grade-class's outcomes as types (classentry.py): a worker's reply is read by ``WorkerReply.from_json``
alone, which names what is wrong with a line that is not a reply; each ``ClassEntry`` outcome has the
fields it needs and no other, survives its state file, and reads right on the instructor's line."""

import dataclasses
import json

import pytest
from mlbook_tools.classentry import BadReply, ClassEntry, Outcome, WorkerReply
from mlbook_tools.classreport import entry_line
from mlbook_tools.result import CellGrade, GradingResult

pytestmark = pytest.mark.unit

NB = "rlhf_ppo"


def _result(error=None, problems=()) -> GradingResult:
    grades = {
        "test_gae": CellGrade("test_gae", 2.0, 2.0, "passed"),
        "test_clip": CellGrade("test_clip", 0.0, 3.0, "wrong sign"),
        "ex_kl": CellGrade("ex_kl", 1.0, 1.0, "passed"),
    }
    return GradingResult(
        grades,
        {"ex1_essay": 2.0},
        problems=[*problems, *([error] if error else [])],
        output="",
        seconds=4.25,
        cell_errors={},
        error=error,
    )


GRADED = WorkerReply.graded(_result(), '{"cells": []}').to_json()


# ------------------------------------------------------------------------------ the worker's reply
def test_each_reply_a_worker_may_give_reads_back_as_it_was_sent():
    graded = WorkerReply.from_json(GRADED)
    assert graded.status == "graded" and graded.notebook == '{"cells": []}'
    assert graded.result.to_dict() == _result().to_dict()
    internal = WorkerReply.internal("RuntimeError: broke", "Traceback ...")
    assert WorkerReply.from_json(internal.to_json()) == internal
    bare = WorkerReply.internal("the engine broke")  # no trace
    assert WorkerReply.from_json(bare.to_json()) == bare


@pytest.mark.parametrize(
    "line, said",
    [
        ("not json {", "not JSON"),
        ("[1, 2]", "not a JSON object but list"),
        ('{"status": "backstop", "why": "x"}', "status 'backstop' is none of graded, internal"),
        ('{"status": "started"}', "status 'started' is none of"),
        ('{"why": "x"}', "status None is none of"),
        ('{"status": "internal"}', "an internal reply's why is text, not NoneType"),
        ('{"status": "internal", "why": 3}', "an internal reply's why is text, not int"),
        ('{"status": "internal", "why": "x", "trace": []}', "trace is text, not list"),
        (
            '{"status": "internal", "why": "x", "result": {}}',
            "an internal reply has no field 'result'",
        ),
        ('{"status": "graded", "notebook": "{}"}', "a graded reply has no result"),
        (
            '{"status": "graded", "result": {"grades": {}}, "notebook": 7}',
            "notebook is text, not int",
        ),
        (
            '{"status": "graded", "result": [], "notebook": null}',
            "its result: not a grading result",
        ),
        (
            '{"status": "graded", "result": {"grades": {"t": {"score": "2", "max_score": 2}}}}',
            "its result: not a grading result: t: a number",
        ),
    ],
)
def test_a_line_that_is_not_a_reply_is_refused_saying_what_is_wrong(line, said):
    with pytest.raises(BadReply) as err:
        WorkerReply.from_json(line)
    assert said in str(err.value), str(err.value)


def test_a_graded_reply_whose_totals_lie_is_refused():
    data = json.loads(GRADED)
    data["result"]["score"] = 5.0  # the cells sum to 2
    with pytest.raises(BadReply, match="the core score is not the sum of its cells"):
        WorkerReply.from_json(json.dumps(data))


# ------------------------------------------------------------------------------ one entry per student
ENTRIES = {
    Outcome.GRADED: ClassEntry("ann", Outcome.GRADED, _result(), fingerprint="fp1"),
    Outcome.UNCHANGED: ClassEntry("ben", Outcome.UNCHANGED, _result(), fingerprint="fp2"),
    Outcome.UNGRADED: ClassEntry(
        "cat", Outcome.UNGRADED, problems=("UNGRADED after 2 attempts: the worker died",)
    ),
    Outcome.MISNAMED: ClassEntry(
        "dan",
        Outcome.MISNAMED,
        problems=(f"no {NB}.ipynb in submitted/dan/{NB}: found {NB}-Copy1.ipynb",),
        found=(f"{NB}-Copy1.ipynb",),
    ),
    Outcome.REFUSED: ClassEntry(
        "-rf", Outcome.REFUSED, problems=("student id '-rf' is not allowed; rename the folder",)
    ),
}

LINES = {
    Outcome.GRADED: "ann                  core    2/5  extra 1/3     4.2 s  failed: test_clip  awaiting manual grading: 1",
    Outcome.UNCHANGED: "ben                  core    2/5  extra 1/3     4.2 s  failed: test_clip  awaiting manual grading: 1  (unchanged, kept)",
    Outcome.UNGRADED: "cat                  UNGRADED after 2 attempts: the worker died",
    Outcome.MISNAMED: f"dan                  NOT GRADED: no {NB}.ipynb in submitted/dan/{NB}: found {NB}-Copy1.ipynb",
    Outcome.REFUSED: "NOT GRADED: student id '-rf' is not allowed; rename the folder",
}


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_each_outcome_reads_right_on_the_instructorsentry_line(outcome):
    entry = ENTRIES[outcome]
    assert entry.outcome is outcome and entry.recorded == (
        outcome in (Outcome.GRADED, Outcome.UNCHANGED)
    )
    assert entry_line(entry, NB) == LINES[outcome]


def test_the_line_says_the_gradebook_s_scores_once_a_person_graded():
    """After a manual grade in formgrader, the line's totals and what awaits a person are the
    gradebook's (those of the exports and the feedback page); the failing checks stay named."""
    entry = ENTRIES[Outcome.UNCHANGED]
    result = entry.result
    booked = {  # ex1_essay graded by hand: 2 points of extra credit; a core cell overridden to 3
        **result.to_dict(),
        "score": 5.0,
        "awaiting_manual": [],
        "extra_credit": {"score": 3.0, "max_score": 3.0, "awaiting_manual": []},
    }
    line = entry_line(entry, NB, booked)
    assert line.startswith("ben                  core    5/5  extra 3/3 "), line
    assert "failed: test_clip" in line and "awaiting" not in line, line
    assert entry_line(entry, NB, {**booked, "extra_credit": result.extra.to_dict()}).count(
        "awaiting manual grading: 1"
    )  # still waiting in the gradebook: still said


def test_a_refused_or_unreadable_file_is_graded_and_flagged_on_itsentry_line():
    refused = ClassEntry("eve", Outcome.GRADED, _result("too large: 30.0 MB (limit 20.0 MB)"))
    line = entry_line(refused, NB)
    assert "REFUSED: too large: 30.0 MB" in line and "awaiting" not in line and "failed" not in line
    unreadable = ClassEntry("fay", Outcome.UNGRADED, problems=("x\x1b[2J",))
    assert "\x1b" not in entry_line(unreadable, NB)  # student text never moves the terminal


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda: ClassEntry("a", Outcome.GRADED), "a graded entry needs its GradingResult"),
        (
            lambda: ClassEntry("a", Outcome.UNGRADED, _result(), problems=("x",)),
            "has no GradingResult",
        ),
        (lambda: ClassEntry("a", Outcome.MISNAMED), "a misnamed entry says why"),
        (
            lambda: ClassEntry("a", Outcome.REFUSED, problems=("x",), found=("f",)),
            "only a misnamed",
        ),
        (lambda: ClassEntry("a", "graded", _result()), "outcome is an Outcome"),
    ],
)
def test_an_entry_holds_what_its_outcome_needs_and_nothing_else(make, said):
    with pytest.raises((ValueError, TypeError), match=said):
        make()


def test_entries_and_results_are_frozen():
    entry = ENTRIES[Outcome.GRADED]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.outcome = Outcome.UNGRADED
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.result.seconds = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.result.grades["test_gae"].score = 0.0


def test_the_state_file_round_trips_a_grading_and_a_misnamed_folder():
    graded = ENTRIES[Outcome.GRADED]
    state = json.loads(json.dumps(graded.to_state()))
    assert "output" not in state and state["fingerprint"] == "fp1"
    back = ClassEntry.from_state("ann", state)
    assert back.outcome is Outcome.GRADED and back.fingerprint == "fp1"
    assert back.result.to_dict() == graded.result.to_dict()
    misnamed = ENTRIES[Outcome.MISNAMED]
    assert ClassEntry.from_state("dan", json.loads(json.dumps(misnamed.to_state()))) == misnamed
    for never_saved in (Outcome.UNGRADED, Outcome.REFUSED):
        with pytest.raises(ValueError, match="is never saved"):
            ENTRIES[never_saved].to_state()


def test_the_class_summary_counts_each_outcome(capsys):
    from mlbook_tools.classreport import class_summary

    results = {e.student: e for e in ENTRIES.values()}
    assert class_summary(results) == 1  # someone was not graded
    out, err = capsys.readouterr()
    assert out.startswith("1 submission graded now, 1 unchanged since their last grading"), out
    assert f"NOT GRADED, misnamed (rename, then rerun): dan: {NB}-Copy1.ipynb" in err
    assert "NOT GRADED, student id not allowed (its line above says why): 1 folder\n" in err
    assert "UNGRADED (rerun grade-class to retry): cat" in err and "UNREADABLE" not in err
    graded = {"ann": ENTRIES[Outcome.GRADED], "ben": ENTRIES[Outcome.UNCHANGED]}
    assert class_summary(graded) == 0 and not capsys.readouterr().err
