"""The notebook-order rule in the sandboxed engine: the small notebooks of test_notebook_order.py
(tests/notebook_support.py) graded with one check, f(1) == 2 at test_f."""

import types

import nbformat
import pytest
from mlbook_tools import driver
from notebook_support import cell as _cell
from notebook_support import source as _source
from notebook_support import split_student as _split_student
from notebook_support import written_source as _written_source

pytestmark = pytest.mark.sandbox  # conftest skips these where bubblewrap cannot start

v4 = nbformat.v4


def _grade(source, student) -> dict:
    """``student`` graded by the sandboxed engine with one check: f(1) == 2 at test_f."""

    def check_f(f, seed):
        assert f(1) == 2, f"f(1) is {f(1)}"

    checks = types.SimpleNamespace(
        CHECKS={"test_f": types.SimpleNamespace(fn=check_f, names=["f"], extra=False)}
    )
    plan = driver.make_plan(source, nbformat.writes(student))
    out = driver.grade_plan(plan, checks, b"secret", "student", limits=driver.DEFAULT_LIMITS)
    return {v.grade_id: (v.score, v.message) for v in out.verdicts}


def test_a_split_answer_keeps_its_points_in_the_sandbox():
    assert _grade(_written_source(), _split_student()) == {"test_f": (1.0, "passed")}


def test_a_test_sees_the_answer_as_it_stood_there_not_a_later_rebinding():
    """nbgrader runs a hidden test where it stands: an experiment below that rebinds f changes nothing;
    a name defined only below the test is still found (its final binding)."""
    source = _source()
    c = source.cells
    right = _cell("code", "def f(x):\n    return 2 * x", "answer_f", solution=True)
    later = _cell("code", "def f(x):  # an experiment\n    return 0")
    student = v4.new_notebook(cells=[c[0], right, c[2], later, *c[3:]])
    assert _grade(source, student) == {"test_f": (1.0, "passed")}
    wrong = _cell("code", "def f(x):\n    return 0", "answer_f", solution=True)
    fixed_below = _cell("code", "def f(x):\n    return 2 * x")
    student = v4.new_notebook(cells=[c[0], wrong, c[2], fixed_below, *c[3:]])
    score, message = _grade(source, student)["test_f"]
    assert score == 0.0 and message.startswith("f(1) is 0"), message  # as nbgrader: wrong there
