"""GradingResult: per-cell grades, the core/extra-credit totals computed once, plain JSON both ways
(validated on the way in: a class worker's reply is data, never trusted blindly)."""

from __future__ import annotations

import json

import pytest
from mlbook_tools.result import BadResult, CellGrade, GradingResult, is_extra

pytestmark = pytest.mark.unit


def _result() -> GradingResult:
    grades = {
        gid: CellGrade(gid, score, top, msg)
        for gid, score, top, msg in [
            ("test_gae", 2.0, 2.0, "passed"),
            ("test_clip", 0.0, 3.0, "the ratio is not clipped"),
            ("ex1_kl", 1.5, 1.5, "passed"),
        ]
    }
    return GradingResult(
        grades,
        {"ex_essay": 4.0, "essay": 1.0},
        problems=["note"],
        output="hi",
        seconds=1.25,
        cell_errors={"gae": "NameError: x"},
    )


def test_totals_split_core_and_extra_credit_by_grade_id():
    r = _result()
    assert is_extra("ex1_kl") and not is_extra("test_ex")
    assert (r.core.score, r.core.max_score, r.core.awaiting_manual) == (2.0, 6.0, ["essay"])
    assert (r.extra.score, r.extra.max_score, r.extra.awaiting_manual) == (1.5, 5.5, ["ex_essay"])
    assert [g.kind for g in r.grades.values()] == ["core", "core", "extra"]


def test_the_json_form_is_what_mlbook_grade_prints_and_round_trips():
    r = _result()
    data = json.loads(r.to_json())
    assert (data["score"], data["max_score"], data["extra_credit"]["max_score"]) == (2.0, 6.0, 5.5)
    assert data["grades"]["test_clip"] == {
        "score": 0.0,
        "max_score": 3.0,
        "message": "the ratio is not clipped",
    }
    assert data["manual"] == ["ex_essay", "essay"] and data["problems"] == ["note"]
    assert GradingResult.from_json(r.to_json()) == r


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.update(score=10.0),  # a total that is not the sum of its cells
        lambda d: d["extra_credit"].update(max_score=0.0),
        lambda d: d["grades"]["test_gae"].update(score=float("nan")),
        lambda d: d["grades"]["test_gae"].update(score="2"),
        lambda d: d["grades"]["test_gae"].update(message=["x"]),
        lambda d: d.update(grades=[]),
        lambda d: d.update(problems="note"),
        lambda d: d["manual_points"].update(essay=None),
    ],
)
def test_a_damaged_result_is_refused(damage):
    data = _result().to_dict()
    damage(data)
    with pytest.raises(BadResult):
        GradingResult.from_dict(data)
    with pytest.raises(BadResult):
        GradingResult.from_json("not json")


def test_blank_written_answers_are_not_awaiting_a_person():
    """Found by following the README: grade-class printed "awaiting manual grading: 5" for a student
    whose written answers were left blank, while the gradebook and both exports said "graded"."""
    from mlbook_tools.result import CellGrade, GradingResult

    result = GradingResult(
        {"test_gae": CellGrade("test_gae", 2.0, 2.0, "")},
        {"ex1_larger_beta": 1.0, "ex2_telescoping": 1.0},
        problems=[],
        blank=["ex1_larger_beta"],
    )
    summary = result.to_dict()
    assert summary["extra_credit"] == {
        "score": 0,
        "max_score": 2.0,
        "awaiting_manual": ["ex2_telescoping"],
    }
    assert summary["awaiting_manual"] == [] and summary["max_score"] == 2.0
    assert result.manual == ["ex2_telescoping"] and summary["blank"] == ["ex1_larger_beta"]
    again = GradingResult.from_json(result.to_json())  # what a class worker sends back
    assert again.manual == result.manual and again.extra == result.extra
