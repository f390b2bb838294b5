"""§4.5: RLOO and GRPO advantages against loops, the critic's measured memory, and the cached
three-arm sweep (fingerprint, float64 replay, and the claims the prose makes)."""

import statistics

import nbformat
import pytest
import torch
from mlbook_solutions import critic_free as cf
from mlbook_solutions import ppo_lm
from mlbook_tools.config import layout

from mlbook.posttrain.toy_lm import TinyCritic, ToyLMConfig, make_prompts


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
    objectives = [v["objective"] for v in s.values()]
    assert max(objectives) - min(objectives) < 0.05  # a tie at the end ...
    spread = min(v["objective_max"] - v["objective_min"] for v in s.values())
    assert max(objectives) - min(objectives) < spread  # ... within the spread over seeds
    assert s["gae"]["early"] > max(
        s["rloo"]["early"], s["grpo"]["early"]
    )  # GAE a little ahead on average
    early = {a: [statistics.fmean(r["reward"][:10]) for r in results["runs"][a]] for a in cf.ARMS}
    assert any(
        g < max(o) for g, *o in zip(early["gae"], early["rloo"], early["grpo"], strict=True)
    )  # not on every seed
    for seed in range(len(cf.SWEEP.seeds)):  # every seed: a critic-free run is faster
        gae = results["runs"]["gae"][seed]["seconds"]
        assert all(results["runs"][a][seed]["seconds"] < gae for a in ("rloo", "grpo"))
    assert (
        s["gae"]["critic_bytes"] > 0 and s["rloo"]["critic_bytes"] == s["grpo"]["critic_bytes"] == 0
    )
    mean_curve = [
        statistics.fmean(c)
        for c in zip(*(r["reward"] for r in results["runs"]["gae"]), strict=True)
    ]
    assert mean_curve[0] < 0.6 and 4.5 < mean_curve[14] < 5.5  # the figure's alt text


def test_prose_setting_matches_the_sweep():
    text = "\n".join(c.source for c in nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4).cells
                     if c.cell_type == "markdown")  # fmt: skip
    cfg = cf.SWEEP
    assert f"{cfg.prompts * cfg.k} responses per step" in text
    assert f"{cfg.prompts} prompts, $k = {cfg.k}$ each" in text
    assert f"$\\beta = {cfg.beta}$" in text and f"{cfg.steps} steps" in text
