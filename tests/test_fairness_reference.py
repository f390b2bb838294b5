"""The stored plain-nbgrader reference of the fairness styles is fresh (``make check``, in a second).

tests/data/fairness_reference.json carries, per style, the fingerprint of what its score depends on
(tests/fairness_reference.py). A chapter code cell, a style or nbgrader changed since it was
computed: this fails at once with the command that recomputes it, instead of ``make test``
recomputing plain-nbgrader gradings for many minutes. test_fairness.py reads the stored scores.
"""

import fairness_reference as ref
import pytest
from fairness_styles import STYLES
from ppo_checks import CHECKS

pytestmark = pytest.mark.unit


def test_the_stored_fairness_reference_is_fresh():
    scores = ref.references()  # raises StaleReference: "... run `make fairness-reference`"
    assert set(scores) == set(STYLES)
    for name, grades in scores.items():
        assert set(grades) == set(CHECKS), f"{name}: run `{ref.REFRESH}`"


def test_a_stale_reference_fails_with_the_command_that_refreshes_it(monkeypatch):
    stored = ref.load()
    name = next(iter(STYLES))
    stored["styles"][name]["fingerprint"] = "0" * 64
    monkeypatch.setattr(ref, "load", lambda: stored)
    with pytest.raises(ref.StaleReference, match=r"1 style\(s\): .*run `make fairness-reference`"):
        ref.references()


def test_at_least_twenty_styles():
    assert len(STYLES) >= 20


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
