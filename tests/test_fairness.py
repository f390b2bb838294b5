"""Differential fairness: correct work in ordinary styles scores the same under the sandboxed engine as
under plain ``nbgrader autograde`` (a real IPython kernel, the reference for the expected score).

Every style of ``fairness_styles.STYLES`` is a student of the shared graded class (tests/graded_class.py,
one ``grade_class`` run). The plain-nbgrader reference is stored in tests/data/fairness_reference.json
with a fingerprint of what it depends on (``fairness_reference``); a stale or missing entry fails
here and in ``make check`` (tests/test_fairness_reference.py) with the command that recomputes it.
"""

import fairness_reference as ref
import pytest
from fairness_styles import STYLES
from graded_class import FULL_STYLES, tier_param
from ppo_checks import CHECKS

pytestmark = pytest.mark.classrun


@pytest.fixture(scope="module")
def reference():
    return ref.references()  # stored; stale: fails with "run `make fairness-reference`"


@pytest.fixture(scope="module")
def rows(graded_class, reference):
    out = {}
    for name in (n for n in STYLES if ref.student(n) in graded_class.subs):  # this session's tiers
        mine = graded_class.scores(ref.student(name))
        theirs = reference[name]
        out[name] = dict(
            engine=(mine["score"], mine["extra_credit"]["score"]),
            kernel=(
                sum(v for g, v in theirs.items() if not CHECKS[g].extra),
                sum(v for g, v in theirs.items() if CHECKS[g].extra),
            ),
            lost=sorted(
                g
                for g, v in mine["grades"].items()
                if g in CHECKS and v["score"] < CHECKS[g].points
            ),
        )
    print("\nstyle: engine (core, extra) / nbgrader (core, extra)")
    for name, row in out.items():
        print(f"  {name:40s} {row['engine']} / {row['kernel']}")
    return out


def _points(lost) -> tuple[float, float]:
    """(core, extra credit) of a notebook that loses the graded tests ``lost``."""
    core = sum(c.points for g, c in CHECKS.items() if not c.extra and g not in lost)
    return core, sum(c.points for g, c in CHECKS.items() if c.extra and g not in lost)


@pytest.mark.parametrize("name", [tier_param(n, FULL_STYLES) for n in STYLES])
def test_style_scores_as_under_nbgrader(rows, name):
    """The engine scores what plain nbgrader scores, except where a style says nbgrader is wrong
    (``nbgrader_lost``: correct work that Jupyter runs, such as an answer split in two cells): there
    the engine must give the right score, and the reference must still show nbgrader's loss."""
    row, style = rows[name], STYLES[name]
    lost, kernel_lost = style.get("lost", []), style.get("nbgrader_lost", [])
    right = _points(lost)
    assert row["kernel"] == _points([*lost, *kernel_lost]), f"the reference itself: {row}"
    assert row["engine"] == right, f"{name}: engine lost {row['lost']} ({row})"
