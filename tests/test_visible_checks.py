"""The check cells students see catch the common mistakes, not only the hidden tests.

Every wrong answer of ``grading_catalog.py`` is pasted into a namespace like the notebook's and the
visible check cells of §3 (the plain code cells between an answer cell and its graded cell) run on
it. A wrong answer is *caught* when a check cell fails with an ``AssertionError`` whose message says
what is wrong. Every catalogued mistake must be caught (a mistake deliberately left to the hidden
tests would need its own list, with the reason). Every correct variant must pass the visible checks
too, or a student with a right answer would be told it is wrong. Which graded tests have visible
checks is read from the notebook and the registry (``ANSWERED_TESTS``), never listed here.
"""

import grading_catalog as cat
import pytest
from visible_support import ALL_WRONG, ANSWERED_TESTS, CHECK_CELLS, SECTION, caught, run_visible

pytestmark = pytest.mark.unit


def test_every_graded_function_has_visible_checks():
    # the core tests whose checks call an answer cell's symbol (not the training loop, read-only)
    assert ANSWERED_TESTS == cat.ANSWERED and cat.TRAIN not in ANSWERED_TESTS
    for test in ANSWERED_TESTS:
        assert CHECK_CELLS.get(test), f"no visible check cell before {test}"


def test_catalog_through_visible_checks():
    names = sorted(ALL_WRONG)
    assert names
    missed = sorted(name for name in names if not caught(name))
    print(f"visible checks catch {len(names) - len(missed)} / {len(names)} wrong answers")
    assert not missed, f"the visible checks let these wrong answers through: {missed}"


@pytest.mark.parametrize("name", sorted(cat.CORRECT))
def test_correct_variant_passes_visible_checks(name):
    symbol, source = cat.CORRECT[name]
    run_visible(source, SECTION[symbol])


def test_reference_passes_visible_checks():
    for test in sorted(set(SECTION.values())):
        run_visible("", test)


def test_visible_gae_check_gives_the_hidden_tests_hint():
    """Every GAE mistake the visible check catches says what to look at (padding must not leak in;
    gamma * lambda carries the advantage), as the hidden test does, never only "expected ... got"."""
    messages = {}
    for name, (_, symbol, source) in ALL_WRONG.items():
        if symbol != "gae":
            continue
        try:
            run_visible(source, "test_gae_matches_brute_force_and_mc_return")
        except AssertionError as err:
            messages[name] = str(err)
    assert {"gae_leaks_past_response_end", "gae_gamma_ignored_in_carry"} <= set(messages), messages
    for name, message in messages.items():
        if "expected" in message and "got" in message:
            assert "leak" in message and "gamma * lambda" in message, (name, message)
    assert "padding values" in messages["gae_leaks_past_response_end"]
