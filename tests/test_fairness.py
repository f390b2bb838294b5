"""Differential fairness: correct work in ordinary styles scores the same under the sandboxed engine as
under plain ``nbgrader autograde`` (a real IPython kernel, the reference for the expected score).

Every style of ``fairness_styles.STYLES`` is a student of the shared graded class (tests/graded_class.py,
one ``grade_class`` run). The plain-nbgrader reference is stored in tests/data/fairness_reference.json
with a fingerprint of what it depends on (``fairness_reference``); a style whose entry is stale or
missing is graded under plain nbgrader here, in the test (slow; the log names the command that stores it).
"""

import fairness_reference as ref
import pytest
from fairness_styles import STYLES
from graded_class import FULL_STYLES, tier_param
from ppo_checks import CHECKS


@pytest.fixture(scope="module")
def reference():
    return ref.references()


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


def test_at_least_twenty_styles():
    assert len(STYLES) >= 20


def test_the_stored_reference_is_fresh_or_recomputed(reference):
    """Every style has a reference, and one computed from what the style is now (fresh or just recomputed)."""
    assert set(reference) == set(STYLES)
    for name, grades in reference.items():
        assert set(grades) == set(CHECKS), name


def test_a_changed_style_makes_only_its_own_reference_stale():
    base = ref.base_notebook()
    prints = ref.fingerprints(base)
    name = next(iter(STYLES))
    stored = {"styles": {n: {"fingerprint": fp} for n, fp in prints.items()}}
    assert ref.stale(stored, prints) == []
    original = STYLES[name]
    STYLES[name] = {**original, "added": [*original.get("added", []), ("gae", "x_extra = 1")]}
    try:
        assert ref.stale(stored, ref.fingerprints(base)) == [name]
    finally:
        STYLES[name] = original
    base.cells[0].source += "\n"  # a markdown cell: never runs, never makes a reference stale
    assert base.cells[0].cell_type == "markdown" and ref.stale(stored, ref.fingerprints(base)) == []


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
