"""Every realistic wrong answer loses points on the right graded test; every correct variant keeps them all.

Answers come from ``grading_catalog.py`` and run in a namespace like the notebook's (the reference
module's globals, so ``torch``, ``masked_mean`` and ``validate_*`` are there). The graded checks are
the very functions the nbgrader hidden tests contain.
"""

import grading_catalog as cat
import ppo_checks
import pytest
from mlbook_solutions import ppo_lm

pytestmark = [pytest.mark.unit, pytest.mark.portable]


def run_check(test: str, ns: dict) -> None:
    """The registry's check of ``test`` on the names it needs, taken from ``ns`` (a notebook namespace)."""
    check = ppo_checks.CHECKS[test]
    check.fn(*(ns[name] for name in check.names))


def namespace_with(source: str) -> dict:
    """A copy of the reference module's namespace with one answer cell executed in it."""
    ns = dict(vars(ppo_lm))
    exec(compile(source, "<answer cell>", "exec"), ns)
    return ns


@pytest.mark.parametrize("name", sorted(cat.WRONG))
def test_wrong_answer_fails_its_test(name):
    test, _, source = cat.WRONG[name]
    with pytest.raises(AssertionError) as err:
        run_check(test, namespace_with(source))
    assert len(str(err.value)) > 20  # a message the student can act on, not a bare assert


@pytest.mark.parametrize("name", sorted(cat.CORRECT))
def test_correct_variant_passes(name):
    symbol, source = cat.CORRECT[name]
    ns = namespace_with(source)
    for test in cat.USES[symbol]:
        run_check(test, ns)


def test_wrong_answer_messages_speak_the_chapter():
    _, _, source = cat.WRONG["score_on_first_response_token"]
    with pytest.raises(AssertionError, match="last response token"):
        run_check(cat.SHAPED, namespace_with(source))
    with pytest.raises(AssertionError, match="clip"):
        run_check(cat.KL, namespace_with(cat.WRONG["controller_without_clip"][2]))


@pytest.mark.parametrize("name", sorted(cat.WRONG_IN_TRAINING))
def test_wrong_answer_fails_end_to_end(name, monkeypatch):
    _, symbol, source = cat.WRONG_IN_TRAINING[name]
    monkeypatch.setattr(
        ppo_lm, symbol, namespace_with(source)[symbol]
    )  # train_ppo now calls the wrong function
    with pytest.raises(AssertionError):
        ppo_checks.check_train_ppo(ppo_lm.train_ppo, ppo_lm.PPOConfig)


def test_correct_variants_train_end_to_end(monkeypatch):
    for name in (
        "gae_vectorised",
        "clip_max_of_negatives_trl_clipfrac",
        "shaped_rewards_one_hot",
        "value_where_form",
    ):
        symbol, source = cat.CORRECT[name]
        monkeypatch.setattr(ppo_lm, symbol, namespace_with(source)[symbol])
    ppo_checks.check_train_ppo(ppo_lm.train_ppo, ppo_lm.PPOConfig)


class AlwaysEqual:
    """nbgrader #1379: an object equal to everything must not pass a test."""

    def __eq__(self, other):
        return True

    def __float__(self):
        raise TypeError("not a number")


def test_always_equal_object_does_not_pass():
    fake = "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n    return AlwaysEqual(), AlwaysEqual()\n"
    ns = namespace_with(fake)
    ns["AlwaysEqual"] = AlwaysEqual
    with pytest.raises(AssertionError):
        ppo_checks.check_gae(ns["gae"])
    ns = namespace_with("def last_response_index(response_mask):\n    return AlwaysEqual()\n")
    ns["AlwaysEqual"] = AlwaysEqual
    with pytest.raises(AssertionError):
        run_check(cat.SHAPED, ns)


def test_ex5_check_enforces_one_off_the_response():
    """An importance_ratios that forgets the mask fails the graded check (it got 1/1 before)."""
    import ppo_checks
    import torch
    from mlbook_solutions.exercises import importance_ratios

    from mlbook.posttrain.toy_lm import token_log_probs

    def unmasked(policy, sampler, tokens, response_mask):
        with torch.no_grad():
            return torch.exp(
                token_log_probs(policy(tokens), tokens) - token_log_probs(sampler(tokens), tokens)
            )

    ppo_checks.check_ex5_importance_ratios(importance_ratios)
    with pytest.raises(AssertionError, match="1 off the response"):
        ppo_checks.check_ex5_importance_ratios(unmasked)
