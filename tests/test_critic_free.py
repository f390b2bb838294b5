"""§4.5: RLOO and GRPO advantages against loops, the critic's measured memory, and the cached
three-arm sweep (fingerprint, float64 replay, and the claims the prose makes)."""

import math
import statistics

import nbformat
import pytest
import torch
from mlbook_solutions import critic_free as cf
from mlbook_solutions import ppo_lm
from mlbook_tools.config import layout

from mlbook.posttrain.toy_lm import TinyCritic, ToyLMConfig, make_prompts

pytestmark = [pytest.mark.unit, pytest.mark.portable]


def _groups(seed=0, n_groups=5, k=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_groups * k, generator=g, dtype=torch.float64) * 3, k


def test_rloo_matches_a_loop_and_is_a_rescaled_mean_baseline():
    returns, k = _groups()
    got = cf.rloo_advantages(returns, k)
    for i in range(len(returns)):
        group = range(i - i % k, i - i % k + k)
        others = [float(returns[j]) for j in group if j != i]
        assert float(got[i]) == pytest.approx(float(returns[i]) - sum(others) / (k - 1))
    mean = returns.view(-1, k).mean(1, keepdim=True)
    assert torch.allclose(got.view(-1, k), k / (k - 1) * (returns.view(-1, k) - mean))
    assert torch.allclose(
        got.view(-1, k).sum(1), torch.zeros(len(returns) // k, dtype=torch.float64)
    )


def test_grpo_matches_a_loop_with_the_unbiased_std():
    returns, k = _groups(1)
    got = cf.grpo_advantages(returns, k)
    for i in range(len(returns)):
        group = [float(returns[j]) for j in range(i - i % k, i - i % k + k)]
        want = (float(returns[i]) - statistics.fmean(group)) / (statistics.stdev(group) + 1e-6)
        assert float(got[i]) == pytest.approx(want, rel=1e-9)
    # per-group scale and shift do not matter (up to eps); a group of equal returns gives zeros
    scaled = returns.view(-1, k) * torch.arange(1, 6, dtype=torch.float64).unsqueeze(1) + 7
    assert torch.allclose(cf.grpo_advantages(scaled.reshape(-1), k), got, atol=1e-5)
    assert torch.equal(cf.grpo_advantages(torch.ones(8), 4), torch.zeros(8))


@pytest.mark.parametrize("fn", [cf.rloo_advantages, cf.grpo_advantages])
def test_bad_groups_are_rejected(fn):
    for returns, k, match in (
        (torch.zeros(6), 4, "divisible"),
        (torch.zeros(6), 1, "k >= 2"),
        (torch.zeros(2, 4), 4, "1-D"),
        (torch.zeros(8, dtype=torch.long), 4, "1-D float"),
    ):
        with pytest.raises(ValueError, match=match):
            fn(returns, k)


def test_sequence_return_is_the_sum_of_the_shaped_rewards():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float64)
    roll = dict(
        mask=mask,
        logp_old=-torch.rand(mask.shape, generator=g, dtype=torch.float64) * mask,
        logp_ref=-torch.rand(mask.shape, generator=g, dtype=torch.float64) * mask,
    )
    scores = torch.tensor([1.5, -0.5], dtype=torch.float64)
    shaped = ppo_lm.shaped_rewards(scores, roll["logp_old"], roll["logp_ref"], mask, 0.3)
    assert torch.allclose(cf.sequence_returns(scores, roll, 0.3), shaped.sum(1))


def test_critic_memory_is_measured_from_adam():
    torch.manual_seed(0)
    critic = TinyCritic(ToyLMConfig())
    n = sum(p.numel() for p in critic.parameters())
    weights, training = cf.critic_memory(critic, make_prompts(4))
    assert weights == 4 * n  # float32
    n_tensors = len(list(critic.parameters()))
    assert training == 4 * n + 8 * n + 4 * n_tensors  # grads, two moments, one step count each
    assert all(p.grad is None for p in critic.parameters())  # measured on a copy


# ------------------------------------------------------------------------------ the cache


@pytest.fixture(scope="module")
def results():
    return cf.load_results()


def test_cache_fingerprint_and_config(results):
    assert results["fingerprint"] == cf.fingerprint(), (
        "the code behind the critic-free sweep changed: run "
        "`python -m mlbook_solutions.critic_free --refresh` and check the prose"
    )
    assert results["replay_config"] == cf.REPLAY
    assert (
        results["config"]["seeds"] == list(cf.SWEEP.seeds)
        and results["config"]["beta"] == cf.SWEEP.beta
    )
    for arm in cf.ARMS:
        runs = results["runs"][arm]
        assert [r["seed"] for r in runs] == list(cf.SWEEP.seeds)
        assert all(len(r["reward"]) == len(r["kl"]) == cf.SWEEP.steps for r in runs)


def test_cache_replays_in_float64(results):
    if results["torch"] != torch.__version__:
        pytest.skip(f"cache made with torch {results['torch']}")
    fresh = cf.replay64()
    for arm, run in fresh.items():
        for field, values in run.items():
            assert values == pytest.approx(results["replay64"][arm][field], rel=1e-8, abs=1e-12), (
                arm,
                field,
            )


def test_claims_of_the_prose(results):
    s = cf.summarise(results)
    ppo = ("gae", "rloo", "grpo")  # the arms that share PPO's update
    objectives = [s[a]["objective"] for a in ppo]
    assert max(objectives) - min(objectives) < 0.05  # a tie at the end ...
    spread = min(s[a]["objective_max"] - s[a]["objective_min"] for a in ppo)
    assert max(objectives) - min(objectives) < spread  # ... within the spread over seeds
    early = {a: [statistics.fmean(r["reward"][:10]) for r in results["runs"][a]] for a in ppo}
    for a in ppo:  # "none is ahead over the first ten steps on every seed"
        others = [b for b in ppo if b != a]
        assert not all(
            mine > max(early[b][i] for b in others) for i, mine in enumerate(early[a])
        ), a
    pub, dr, no_std = s["grpo_published"], s["dr_grpo"], s["grpo_published_no_std"]
    # the ablation: without the std division the arm ends at Dr. GRPO's KL and objective ...
    assert abs(no_std["kl"] - dr["kl"]) < 0.05 * dr["kl"]
    assert abs(no_std["objective"] - dr["objective"]) < 0.1  # "changes little more"
    assert abs(no_std["objective"] - statistics.fmean(objectives)) < 0.1  # "close to the PPO arms"
    assert 0.35 < pub["kl"] / no_std["kl"] < 0.65  # ... so the division halves the KL
    assert pub["reward"] < min(s[a]["reward"] for a in ppo) - 1  # "less reward"
    assert 0.35 < pub["kl"] / s["gae"]["kl"] < 0.65  # "at about half the KL"
    assert pub["objective"] < min(objectives) - 0.1  # "a lower value of the regularised objective"
    assert (
        abs(dr["objective"] - statistics.fmean(objectives)) < 0.1
    )  # "close to the PPO-update arms"
    for a in cf.ARMS:  # "every arm's responses grow towards the 8-token maximum"
        assert s[a]["length"] > s[a]["length_early"] and s[a]["length"] > 7.5
    assert pub["length"] <= max(s[a]["length"] for a in ppo)  # "does not lengthen them further"
    for seed in range(len(cf.SWEEP.seeds)):  # every seed: a critic-free run is faster
        gae = results["runs"]["gae"][seed]["seconds"]
        assert all(results["runs"][a][seed]["seconds"] < gae for a in ("rloo", "grpo"))
    assert s["gae"]["critic_bytes"] > 0
    assert all(s[a]["critic_bytes"] == 0 for a in cf.ARMS if a != "gae")
    mean_curve = [
        statistics.fmean(c)
        for c in zip(*(r["reward"] for r in results["runs"]["gae"]), strict=True)
    ]
    assert mean_curve[0] < 0.6 and 4.5 < mean_curve[14] < 5.5  # the figure's alt text
    pub_curve = [statistics.fmean(r["reward"][-10:]) for r in results["runs"]["grpo_published"]]
    assert 3.0 < statistics.fmean(pub_curve) < 3.6  # "rises more slowly to about 3.3"


def test_published_objectives_by_hand():
    """GRPO's per-response mean gives a long response's tokens less weight; Dr. GRPO's constant
    normaliser weights every token alike; k3 is zero at the reference and positive elsewhere."""
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # lengths 1 and 3
    logp = torch.zeros(2, 3, requires_grad=True)  # ratio 1, pi = pi_ref
    adv = torch.tensor([1.0, 1.0])
    loss = cf.published_grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, 0.3, 0.2)
    assert float(loss.detach()) == pytest.approx(
        -1.0
    )  # mean over responses of (mean over tokens of -A)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad * mask, torch.tensor([[-0.5, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]))
    dr = cf.published_grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, 0.3, 0.2, budget=8)
    (grad,) = torch.autograd.grad(dr, logp)
    assert float(dr.detach()) == pytest.approx(-4 / 8) and torch.allclose(grad, -mask / 8)
    ref = torch.full((2, 3), -0.5)  # pi_ref below pi: k3 = e^-0.5 + 0.5 - 1 per token
    kl = cf.published_grpo_loss(logp, logp.detach(), ref, torch.zeros(2), mask, 1.0, 0.2)
    assert float(kl.detach()) == pytest.approx(math.exp(-0.5) - 0.5)


def test_prose_setting_matches_the_sweep():
    text = "\n".join(
        c.source
        for c in nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4).cells
        if c.cell_type == "markdown"
    )
    cfg = cf.SWEEP
    assert f"{cfg.prompts * cfg.k} responses per step" in text
    assert f"{cfg.prompts} prompts, $k = {cfg.k}$ each" in text
    assert f"$\\beta = {cfg.beta}$" in text and f"{cfg.steps} steps" in text


def test_credit_correlations_against_a_loop():
    """The correlation of each estimator's per-token advantage with the good-token indicator,
    recomputed with explicit loops over tokens (GAE by its backward recursion)."""
    g = torch.Generator().manual_seed(4)
    B, T, k = 8, 6, 4
    tokens = torch.randint(0, 10, (B, T), generator=g)
    tokens[:, 1::2] = toy_lm_good()  # plenty of good tokens
    tokens[0, 2] = 0
    mask = torch.ones(B, T - 1, dtype=torch.float64)
    mask[:, 0] = 0  # the prompt
    mask[1, 4] = 0  # a shorter response
    roll = dict(
        tokens=tokens,
        mask=mask,
        logp_old=-torch.rand(B, T - 1, generator=g, dtype=torch.float64) * mask,
        logp_ref=-torch.rand(B, T - 1, generator=g, dtype=torch.float64) * mask,
        values_old=torch.randn(B, T - 1, generator=g, dtype=torch.float64),
    )
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    got = cf.credit_correlations(roll, scores, 0.3, k, 1.0, 0.9)
    rewards = ppo_lm.shaped_rewards(scores, roll["logp_old"], roll["logp_ref"], mask, 0.3)
    gae_adv = ppo_lm.gae(rewards, roll["values_old"], mask, 1.0, 0.9)[0]
    seq = cf.sequence_returns(scores, roll, 0.3)
    per = {"gae": lambda b, t: float(gae_adv[b, t])}
    for name, fn in (("rloo", cf.rloo_advantages), ("grpo", cf.grpo_advantages)):
        a = fn(seq, k)
        per[name] = lambda b, t, a=a: float(a[b])
    pairs = [(b, t) for b in range(B) for t in range(T - 1) if mask[b, t]]
    good = [float(tokens[b, t + 1] == toy_lm_good()) for b, t in pairs]
    for name, adv in per.items():
        xs = [adv(b, t) for b, t in pairs]
        mx, my = statistics.fmean(xs), statistics.fmean(good)
        cov = sum((x - mx) * (y - my) for x, y in zip(xs, good, strict=True))
        want = cov / math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in good))
        assert got[name] == pytest.approx(want, rel=1e-9), name


def toy_lm_good():
    from mlbook.posttrain.toy_lm import GOOD_ID

    return GOOD_ID


def test_steps_to_threshold():
    assert cf.steps_to_threshold([0, 0, 5, 5, 5, 5, 5, 5], 4.0, window=5) == 6
    assert cf.steps_to_threshold([1.0] * 10, 4.0) is None
    assert cf.steps_to_threshold([4.0] * 5, 4.0) == 5


def test_claims_about_credit(results):
    """§4.5's credit paragraph and its two bullets, against the cached numbers they describe."""
    c = cf.credit_summary(results)
    first, ninth, last = "1", "9", str(cf.SWEEP.steps)
    others = ("rloo", "grpo")
    # "after the first update GAE's advantage is the one most correlated, by a few hundredths"
    lead = c["gae"]["corr"][first] - max(c[e]["corr"][first] for e in others)
    assert 0 < lead < 0.1
    # "by 9 updates its correlation is gone while the sequence-level advantages still carry theirs"
    assert abs(c["gae"]["corr"][ninth]) < 0.1
    assert all(c[e]["corr"][ninth] > 0.15 for e in others)
    # "by the end all three are at or a little below zero"
    assert all(-0.25 < c[e]["corr"][last] < 0.05 for e in c)
    # "every arm climbs to the same optimum within about 15 steps"
    s = cf.summarise(results)
    for arm in ("gae", "rloo", "grpo"):
        curve = [
            statistics.fmean(v)
            for v in zip(*(r["reward"] for r in results["runs"][arm]), strict=True)
        ]
        assert statistics.fmean(curve[12:17]) > 0.85 * s[arm]["reward"], arm
    # fewer samples: "the GAE arm needs more steps ... than either critic-free arm on every seed"
    for seed in range(len(cf.SWEEP.seeds)):
        gae_steps = c["gae"]["steps"][seed]
        assert gae_steps is not None
        assert all(
            c[e]["steps"][seed] is not None and c[e]["steps"][seed] < gae_steps for e in others
        )
    # "and all three end at about the same reward"
    finals = [c[e]["reward"] for e in c]
    assert max(finals) - min(finals) < 0.3
    assert results["credit_config"]["prompts"] * results["credit_config"]["k"] == 8
