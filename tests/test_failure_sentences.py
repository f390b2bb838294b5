"""What a student reads about a failure is its kind's own sentence (errors.py, ``student_message``),
and the cell vocabulary (cells.py) reads damaged metadata as a plain cell, never an error."""

import nbformat
import pytest
from mlbook_tools import cells, errors

pytestmark = pytest.mark.unit

KINDS = [
    errors.Crashed(),
    errors.MemoryLimit(),
    errors.CallTimeout(),
    errors.Interrupted(),
    errors.BudgetExceeded(),
    errors.ProtocolBroken("broke the protocol (bad frame)"),
    errors.RemoteError("ValueError: nope"),
]


def test_each_failure_kind_says_what_failed_and_how_in_its_own_words():
    said = [kind.student_message("calling gae") for kind in KINDS]
    assert all(s.startswith("calling gae ") for s in said), said
    assert len(set(said)) == len(said), said  # no two kinds read the same
    assert "memory limit" in said[1] and "time budget" in said[4]
    assert said[-1] == "calling gae raised ValueError: nope"
    assert errors.CannotGrade("too large: 3 MB").student_message() == "too large: 3 MB"


def test_a_timeout_says_its_seconds_where_the_session_knew_them():
    cut = errors.Interrupted()
    assert (
        cut.student_message("cell 'ex1'") == "cell 'ex1' did not finish in time and was interrupted"
    )
    cut.seconds = 9.6
    assert cut.student_message("cell 'ex1'").endswith("within 10 s and was interrupted")
    late = errors.CallTimeout()
    late.seconds = -1.0  # cut when nothing was left: never a negative number
    assert "within 0 s (an endless loop?)" in late.student_message()


def test_the_cell_vocabulary_on_course_and_damaged_cells():
    answer = nbformat.v4.new_markdown_cell(
        "YOUR ANSWER HERE",
        metadata={"nbgrader": {"grade_id": "w1", "grade": True, "solution": True, "points": 2}},
    )
    test = nbformat.v4.new_code_cell(
        "check()", metadata={"nbgrader": {"grade_id": "t1", "grade": True, "points": 1}}
    )
    extra = nbformat.v4.new_code_cell(
        "", metadata={"nbgrader": {"grade_id": "ex1", "grade": True}, "mlbook": {"extra_credit": 3}}
    )
    assert cells.grade_id(answer) == "w1" and cells.is_written_answer(answer)
    assert cells.is_solution(answer) and not cells.is_test(answer) and cells.points(answer) == 2.0
    assert cells.is_test(test) and not cells.is_solution(test) and cells.points(test) == 1.0
    assert cells.points(extra) == 3.0 and cells.is_blank(extra) and not cells.is_blank(test)
    for damaged in (
        {"cell_type": "code", "source": ["x = 1\n", "y"], "metadata": []},
        {"cell_type": "code", "source": "x", "metadata": {"nbgrader": "grade"}},
        {"cell_type": "code", "source": "x", "metadata": {"nbgrader": {"grade_id": 7}}},
        {"cell_type": "code"},
    ):
        assert cells.grade_id(damaged) is None and not cells.is_graded(damaged)
        assert not cells.is_solution(damaged) and cells.points(damaged) == 0.0
    assert cells.text({"source": ["x = 1\n", "y"]}) == "x = 1\ny"
