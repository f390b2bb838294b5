"""§3.7-3.8: the gold preference, the pairwise loss and its graded check, the reward model, and the
cached over-optimisation runs (fingerprint, float64 replay, and every claim the prose makes)."""

import math
import statistics

import nbformat
import ppo_checks
import pytest
import torch
import torch.nn.functional as F
from mlbook_solutions import reward_model as rm
from mlbook_tools.config import layout

from mlbook.posttrain.toy_lm import END_ID, GOOD_ID, PAD_ID, build_models, encode

pytestmark = [pytest.mark.unit, pytest.mark.portable]

# ------------------------------------------------------------------------------ gold and pairs


def _row(words: str, prompt: str = "<|bos|> the"):
    ids = encode(prompt) + encode(words)
    mask = [0.0] * len(encode(prompt)) + [1.0] * len(encode(words))
    return torch.tensor([ids]), torch.tensor([mask])


@pytest.mark.parametrize(
    "n_good, want", [(0, 0.0), (1, 1.0), (2, 2.0), (3, 1.5), (4, 1.0), (6, 0.0)]
)
def test_gold_rises_to_two_good_tokens_then_falls(n_good, want):
    tokens, mask = _row(" ".join(["good"] * n_good + ["cat", "<|end|>"]))
    assert float(rm.gold_reward(tokens, mask)) == want


def test_gold_counts_only_the_response():
    tokens, mask = _row("cat <|end|>", prompt="<|bos|> good")  # a `good` in the prompt
    assert float(rm.gold_reward(tokens, mask)) == 0.0
    with pytest.raises(ValueError, match="differ"):
        rm.gold_reward(tokens, mask[:, 1:])


def test_preference_pairs_follow_the_gold_order_without_noise():
    policy = build_models(0).policy
    pairs = rm.preference_pairs(policy, 256, 8, torch.Generator().manual_seed(1), noise=False)
    assert pairs.chosen.shape == pairs.rejected.shape == (256, 10)
    assert pairs.chosen_mask.shape == pairs.chosen.shape
    gold_c = rm.gold_reward(pairs.chosen, pairs.chosen_mask)
    gold_r = rm.gold_reward(pairs.rejected, pairs.rejected_mask)
    assert torch.all(gold_c >= gold_r) and torch.equal(gold_c - gold_r, pairs.gold_margin)
    assert torch.all(pairs.chosen[pairs.chosen_mask == 0][2:] >= 0)


def test_noisy_rater_is_bradley_terry():
    policy = build_models(0).policy
    pairs = rm.preference_pairs(policy, 4096, 8, torch.Generator().manual_seed(2))
    decided = pairs.gold_margin.abs() == 1  # pairs one gold point apart
    right = float((pairs.gold_margin[decided] > 0).float().mean())
    n = int(decided.sum())
    assert n > 500
    assert abs(right - 1 / (1 + math.exp(-1))) < 4 * math.sqrt(0.2 / n)  # sigmoid(1) = 0.731


def test_reward_model_reads_the_last_response_token_and_ignores_padding():
    torch.manual_seed(0)
    model = rm.TinyRewardModel.from_lm(build_models(0).ref)
    tokens, mask = _row("good cat <|end|>")
    padded = torch.cat([tokens, torch.full((1, 3), PAD_ID)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(1, 3)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(tokens, mask), model(padded, padded_mask), atol=1e-6)
    assert int(tokens[0, -1]) == END_ID and GOOD_ID in tokens[0].tolist()
    with pytest.raises(ValueError, match="same"):
        model(tokens, mask[:, 1:])


# ------------------------------------------------------------------------------ pairwise loss


def test_pairwise_loss_value_gradient_and_errors():
    r_c = torch.tensor([1.0, -2.0, 0.0], requires_grad=True)
    r_r = torch.zeros(3, requires_grad=True)
    loss = rm.pairwise_loss(r_c, r_r)
    want = sum(math.log1p(math.exp(-d)) for d in (1.0, -2.0, 0.0)) / 3
    assert float(loss.detach()) == pytest.approx(want, rel=1e-6)
    loss.backward()
    assert torch.allclose(r_c.grad, -torch.sigmoid(-r_c.detach()) / 3)
    assert torch.allclose(r_r.grad, -r_c.grad)
    assert float(rm.pairwise_loss(torch.tensor([0.0]), torch.tensor([500.0]))) == 500.0
    for bad, match in (
        ((torch.zeros(3), torch.zeros(4)), "one reward per pair"),
        ((torch.zeros(3, 1), torch.zeros(3, 1)), "1-D"),
        ((torch.zeros(3, dtype=torch.long), torch.zeros(3)), "floating"),
        ((torch.tensor([0.0, math.nan]), torch.zeros(2)), "NaN"),
    ):
        with pytest.raises(ValueError, match=match):
            rm.pairwise_loss(*bad)


CORRECT = {
    "reference": rm.pairwise_loss,
    "softplus": lambda c, r: F.softplus(r - c).mean(),
    "bce with logits": lambda c, r: F.binary_cross_entropy_with_logits(c - r, torch.ones_like(c)),
}
WRONG = {
    "summed": lambda c, r: -F.logsigmoid(c - r).sum(),
    "margin reversed": lambda c, r: -F.logsigmoid(r - c).mean(),
    "unstable log(sigmoid)": lambda c, r: -torch.log(torch.sigmoid(c - r)).mean(),
    "no log": lambda c, r: (1 - torch.sigmoid(c - r)).mean(),
    "detached": lambda c, r: -F.logsigmoid(c - r).mean().detach(),
    "hinge": lambda c, r: torch.relu(1 - (c - r)).mean(),
    "only chosen": lambda c, r: -F.logsigmoid(c).mean(),
    "in place": lambda c, r: (r.data.add_(1e-3), -F.logsigmoid(c - r + 1e-3).mean())[1],
}


@pytest.mark.parametrize("name", CORRECT)
def test_check_accepts_correct_forms(name):
    ppo_checks.check_ex_pairwise_loss(CORRECT[name])


@pytest.mark.parametrize("name", WRONG)
def test_check_rejects_wrong_answers(name):
    with pytest.raises(AssertionError):
        ppo_checks.check_ex_pairwise_loss(WRONG[name])


def _cells(folder, name="rlhf_ppo.ipynb"):
    return nbformat.read(folder / name, as_version=4).cells


def _by_grade_id(cells, grade_id):
    found = [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(found) == 1, (grade_id, len(found))
    return found[0]


def test_notebook_cells(capfd):
    solved, release = _cells(layout().solved), _cells(layout().release)
    stub = _by_grade_id(release, "ex_pairwise_loss")
    assert "NotImplementedError" in stub and "validate_pair_rewards(r_chosen, r_rejected)" in stub
    assert "logsigmoid" not in stub
    assert "def check_ex_pairwise_loss" not in _by_grade_id(release, "ex_pairwise_loss_test")
    test_cell = _by_grade_id(solved, "ex_pairwise_loss_test")
    assert "def check_ex_pairwise_loss" in test_cell
    exec(compile(test_cell, "test cell", "exec"), dict(torch=torch, pairwise_loss=rm.pairwise_loss))
    assert capfd.readouterr().err == ""
    for name, fn in WRONG.items():
        with pytest.raises(AssertionError):
            exec(compile(test_cell, "test cell", "exec"), dict(torch=torch, pairwise_loss=fn))
            pytest.fail(f"the graded cell accepted {name}")


# ------------------------------------------------------------------------------ the cache


@pytest.fixture(scope="module")
def results():
    return rm.load_results()


def test_cache_fingerprint_and_config(results):
    assert results["fingerprint"] == rm.fingerprint(), (
        "the code behind the reward-model runs changed: run "
        "`python -m mlbook_solutions.reward_model --refresh` and check the prose"
    )
    assert results["replay_config"] == rm.REPLAY
    cfg = rm.RM_RUN
    assert results["config"]["betas"] == list(cfg.betas) and results["config"]["seeds"] == list(
        cfg.seeds
    )
    assert sorted(results["rms"]) == [str(s) for s in cfg.seeds]
    for runs in results["runs"].values():
        assert [r["seed"] for r in runs] == list(cfg.seeds)
        assert all(len(r["gold"]) == len(r["proxy"]) == len(r["kl"]) == cfg.ppo_steps for r in runs)


def test_cache_replays_in_float64(results):
    """The shortened pipeline (RM fit, normalisation, PPO) reruns to 1e-8 on any CPU (see test_exercises)."""
    if results["torch"] != torch.__version__:
        pytest.skip(f"cache made with torch {results['torch']}")
    fresh, stored = rm.replay64(), results["replay64"]
    for part in ("rm", "run"):
        for key, value in fresh[part].items():
            assert value == pytest.approx(stored[part][key], rel=1e-8, abs=1e-12), (part, key)


def test_claims_of_the_prose(results):
    s = rm.summarise(results)
    low, high = str(min(rm.RM_RUN.betas)), str(max(rm.RM_RUN.betas))
    for r in results["rms"].values():  # a good reward model on its own distribution
        assert r["gold_accuracy"] > 0.9 and 0.55 < r["heldout_accuracy"] < 0.65
        assert abs(r["heldout_loss"] - math.log(2)) < 0.05 and r["loss"][-1] < r["loss"][0]
    for beta in results["runs"]:  # every run: gold rises first, length grows to the max
        assert s[beta]["gold_peak"] > s[beta]["gold_start"] + 0.5
        assert s[beta]["length_final"] > 7.9
        assert 2 < s[beta]["kl_at_peak"] < 6  # "peaking at a few nats"
    # smallest beta: gold ends below where it started while the proxy keeps rising
    assert s[low]["gold_final"] < s[low]["gold_start"] < s[low]["gold_peak"]
    for r in results["runs"][low]:
        peak = max(range(len(r["gold"])), key=r["gold"].__getitem__)
        assert r["gold"][-1] < r["gold"][0] and r["proxy"][-1] > r["proxy"][peak] + 1
    # the KL fee holds the largest beta near the peak: at a small KL, most of the gold gain kept
    gain = s[high]["gold_final"] - s[high]["gold_start"]
    assert gain > 0.5 * (s[high]["gold_peak"] - s[high]["gold_start"])
    assert s[high]["kl_final"] < 0.5 * s[low]["kl_final"]
    assert (
        s[high]["gold_final"]
        > s[str(sorted(rm.RM_RUN.betas)[1])]["gold_final"]
        > s[low]["gold_final"]
    )


def test_prose_quotes_the_config():
    text = "\n".join(c.source for c in _cells(layout().solved) if c.cell_type == "markdown")
    cfg = rm.RM_RUN
    assert f"{cfg.train_pairs:,} training pairs and {cfg.heldout_pairs:,} held-out pairs" in text
    assert f"{cfg.norm_samples:,} fresh samples" in text
    assert "three seeds" in text and len(cfg.seeds) == 3 and len(cfg.betas) == 3
    assert rm.GOLD_PEAK == 2 and rm.GOLD_SLOPE_PAST_PEAK == 0.5  # "up to two", "half a point"


def test_gold_in_the_proxys_unit_and_at_equal_kl(results):
    """§3.8: gold normalised like the proxy starts near 0; at equal sqrt(KL) the betas agree (the
    KL fee changes where a run stops, not the gold it gets for a given KL: Gao et al.)."""
    s = rm.summarise(results)
    for beta in results["runs"]:
        assert abs(s[beta]["gold_start_z"]) < 0.5 and abs(s[beta]["proxy_start"]) < 0.5
    for r in results["rms"].values():
        assert r["gold_std"] > 0
    equal = rm.gold_at_equal_kl(results)
    common = [
        d for d in next(iter(equal.values())) if all(row[d] is not None for row in equal.values())
    ]
    assert len(common) >= 4  # "where all three betas get there"
    spread = max(
        max(row[d] for row in equal.values()) - min(row[d] for row in equal.values())
        for d in common
    )
    low, high = str(min(rm.RM_RUN.betas)), str(max(rm.RM_RUN.betas))
    travel = s[low]["kl_final"] / s[high]["kl_final"]
    assert spread < 0.5 and travel > 2  # "a fraction of a standard deviation"; KL fee = budget
    assert s[high]["gold_final_z"] - s[low]["gold_final_z"] > max(2.0, 5 * spread)  # "by several"


def test_monotone_gold_control(results):
    """The control: same PPO, same smallest beta, a reward model fitted on monotone-gold labels:
    gold climbs with the proxy the whole way, the policy travels as far in KL."""
    assert results["config"]["control_beta"] == rm.RM_RUN.control_beta == min(rm.RM_RUN.betas)
    s = rm.summarise(results)
    c, low = s["control"], s[str(min(rm.RM_RUN.betas))]
    assert c["gold_final_z"] > c["gold_start_z"] + 1.0 and c["proxy_final"] > c["proxy_start"] + 1.0
    assert low["gold_final_z"] < low["gold_start_z"]  # the peaked gold falls below its start
    assert c["kl_final"] > 0.5 * low["kl_final"]  # "just as far in KL"
    for r in results["control"]:
        z = rm.gold_z(results, r, control=True)
        assert float(torch.corrcoef(torch.tensor([z, r["proxy"]]))[0, 1]) > 0.9
        assert statistics.fmean(z[-5:]) >= max(z) - 0.5  # no peak-and-fall
    assert torch.equal(rm.monotone_gold(*_row("good good good cat <|end|>")), torch.tensor([3.0]))
