"""The check cells students see catch the common mistakes, not only the hidden tests.

Every wrong answer of ``grading_catalog.py`` is pasted into a namespace like the notebook's and the
visible check cells of §3 (the plain code cells between an answer cell and its graded cell) run on
it. A wrong answer is *caught* when a check cell fails with an ``AssertionError`` whose message says
what is wrong. The catalog marks the few mistakes that only the hidden tests catch, with the reason
(``HIDDEN_ONLY``); the share caught and that list are pinned here. Every correct variant must pass
the visible checks too, or a student with a right answer would be told it is wrong.
"""

import math

import grading_catalog as cat
import nbformat
import pytest
import torch
from mlbook_solutions import ppo_lm
from mlbook_tools.config import layout

SOLVED = layout().solved / "rlhf_ppo.ipynb"  # what `mlbook build` generated from the fragments


def visible_checks() -> dict[str, list[str]]:
    """Graded test id -> sources of the plain code cells between the answer cells and that graded cell."""
    checks, pending = {}, []
    for cell in nbformat.read(SOLVED, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        if meta.get("solution"):  # an answer cell: its checks are the plain cells after it
            pending = []
        elif meta.get("grade"):
            checks[meta["grade_id"]] = pending
            pending = []
        elif not cell.source.lstrip().startswith(("def ", "class ", "@", "import ", "from ")):
            pending.append(cell.source)  # a check cell (read-only code that defines nothing)
    return checks


CHECK_CELLS = visible_checks()
ALL_WRONG = {**cat.WRONG, **cat.WRONG_IN_TRAINING}


def run_visible(source: str, test: str) -> None:
    """Execute an answer cell, then the visible checks that follow the answer cells for ``test``."""
    ns = dict(vars(ppo_lm)) | {"torch": torch, "math": math}
    exec(compile(source, "<answer cell>", "exec"), ns)
    for check in CHECK_CELLS[test]:
        exec(compile(check, "<check cell>", "exec"), ns)


SECTION = {
    symbol: tests[0] for symbol, tests in cat.USES.items()
}  # answer -> the graded test that calls it


def _visible_test_for(name: str) -> str:
    _, symbol, _ = ALL_WRONG[name]
    return SECTION[symbol]


def caught(name: str) -> bool:
    _, _, source = ALL_WRONG[name]
    try:
        run_visible(source, _visible_test_for(name))
    except AssertionError as err:
        return len(str(err)) > 20  # a message a student can act on
    return False


def test_every_graded_function_has_visible_checks():
    for test in (cat.SHAPED, cat.GAE, cat.CLIP, cat.VALUE, cat.KL):
        assert CHECK_CELLS.get(test), f"no visible check cell before {test}"


def test_catalog_through_visible_checks():
    names = sorted(ALL_WRONG)
    missed = sorted(name for name in names if not caught(name))
    n_caught = len(names) - len(missed)
    print(f"visible checks catch {n_caught} / {len(names)} wrong answers; hidden-only: {missed}")
    assert missed == sorted(cat.HIDDEN_ONLY), (
        "a wrong answer the visible checks miss must be marked HIDDEN_ONLY, with a reason"
    )
    assert n_caught / len(names) >= 0.9
    assert (n_caught, len(names)) == (37, 37)  # the figure quoted in the note


def test_hidden_only_entries_are_explained():
    for name, reason in cat.HIDDEN_ONLY.items():
        assert name in ALL_WRONG, (
            f"HIDDEN_ONLY names {name!r}, which is not a wrong answer of the catalog"
        )
        assert len(reason) > 30, f"say why {name!r} is left to the hidden tests"


@pytest.mark.parametrize("name", sorted(cat.CORRECT))
def test_correct_variant_passes_visible_checks(name):
    symbol, source = cat.CORRECT[name]
    run_visible(source, SECTION[symbol])


def test_reference_passes_visible_checks():
    for test in sorted(set(SECTION.values())):
        run_visible("", test)
