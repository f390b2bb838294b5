"""The check cells students see catch the common mistakes, not only the hidden tests.

Every wrong answer of ``grading_catalog.py`` is pasted into a namespace like the notebook's and the
visible check cells of §3 (the plain code cells between an answer cell and its graded cell) run on
it. A wrong answer is *caught* when a check cell fails with an ``AssertionError`` whose message says
what is wrong. The catalog marks the few mistakes that only the hidden tests catch, with the reason
(``HIDDEN_ONLY``); the share caught and that list are pinned here. Every correct variant must pass
the visible checks too, or a student with a right answer would be told it is wrong.
"""

import grading_catalog as cat
import pytest
from visible_support import ALL_WRONG, CHECK_CELLS, SECTION, caught, run_visible

pytestmark = pytest.mark.unit


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
    unexplained = [n for n in missed if len(cat.HIDDEN_ONLY[n]) <= 30]
    assert not unexplained, f"say why {unexplained} are left to the hidden tests"
    assert n_caught / len(names) >= 0.9
    assert (n_caught, len(names)) == (37, 37)  # the figure quoted in the note


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
