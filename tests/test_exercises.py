"""The §7 exercises: their measured claims hold, the cache is current, and the notebook's checks work.

The notebook cells are read straight from ``solutions/chapter/rlhf_ppo/70_exercises.py`` and executed
here, so the visible checks and the extra-credit test cells that students meet are the code under
test: they must pass on the worked solutions and fail on plausible wrong answers.
"""

import math
import pathlib
import re
import statistics

import pytest
import torch
import torch.nn.functional as F
from mlbook_solutions import exercises as ex
from mlbook_solutions import ppo_lm as sol
from mlbook_solutions.run_toy import CHAPTER_RUN

from mlbook.posttrain.toy_lm import TinyCausalLM, ToyLMConfig, demonstration_batch, sft_loss, token_log_probs

FRAGMENT = pathlib.Path(__file__).resolve().parents[1] / "solutions" / "chapter" / "rlhf_ppo" / "70_exercises.py"
MARKER = re.compile(r"^\s*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)\s*$")


# ------------------------------------------------------------------------------ fragment helpers


def _cells():
    """[(header line, source)] of the fragment, in order."""
    cells, header, lines = [], None, []
    for line in FRAGMENT.read_text().splitlines():
        if line.startswith("# %%"):
            if header is not None:
                cells.append((header, "\n".join(lines)))
            header, lines = line, []
        else:
            lines.append(line)
    cells.append((header, "\n".join(lines)))
    return cells


def _meta(header):
    return dict(re.findall(r'(\w+)="([^"]*)"', header)) | {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", header)}


def _cell(raw=False, **wanted):
    """Source of the one cell whose metadata contains ``wanted``: solved form (marker lines dropped) unless ``raw``."""
    found = [src for header, src in _cells() if all(_meta(header).get(k) == v for k, v in wanted.items())]
    assert len(found) == 1, f"expected one cell with {wanted}, found {len(found)}"
    return found[0] if raw else "\n".join(line for line in found[0].splitlines() if not MARKER.match(line))


def _student_form(src):
    """What nbgrader gives students: solution regions replaced by a NotImplementedError, hidden tests removed."""
    out, skip = [], None
    for line in src.splitlines():
        m = MARKER.match(line)
        if m and m.group(1) == "BEGIN":
            skip = m.group(2)
            if skip == "SOLUTION":
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f"{indent}raise NotImplementedError()")
            continue
        if m and m.group(1) == "END":
            skip = None
            continue
        if skip is None:
            out.append(line)
    return "\n".join(out)


def _run(src, **namespace):
    ns = {"torch": torch, **namespace}
    exec(compile(src, str(FRAGMENT), "exec"), ns)
    return ns


# ------------------------------------------------------------------------------------ structure


def test_fragment_grade_ids_and_student_form():
    cells = _cells()
    ids = [m[k] for h, _ in cells for m in [_meta(h)] for k in ("solution", "test", "manual") if k in m]
    assert ids and all(i.startswith("ex") for i in ids), ids
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    assert '# %% [markdown] manual="ex3_whitening_argument" points=2' in [h for h, _ in cells]
    for header, src in cells:
        meta = _meta(header)
        if "solution" in meta and "[markdown]" not in header:
            assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src, header
            student = _student_form(src)
            compile(student, header, "exec")  # the stub is valid Python
            assert "mlbook_solutions" not in student, f"{header}: students must not need mlbook_solutions"
        if "test" in meta:
            assert "mlbook_solutions" not in src, f"{header}: graded tests must be self-contained"
            assert meta.get("points") == 1
    # Demonstration cells are solution regions from their first line to their last.
    for name in ("ex3_demo", "ex4_demo", "ex5_demo"):
        body = [line for line in _student_form(_cell(raw=True, solution=name)).splitlines() if line.strip()]
        assert body == ["raise NotImplementedError()"], name


# ------------------------------------------------------------------------------------ exercise 1


def test_ex1_numbers():
    r02, r01 = ex.ex1_rewards(0.2), ex.ex1_rewards(0.1)
    assert torch.allclose(r02, torch.tensor([[-0.04, 0.0, 0.2, 1.5]]), atol=1e-6)
    assert math.isclose(float(r02.sum()), 1.66, abs_tol=1e-6) and math.isclose(float(r01.sum()), 1.58, abs_tol=1e-6)
    assert math.isclose(ex.ex1_summed_log_ratio(), -0.8, abs_tol=1e-9)
    for beta in (0.0, 0.05, 0.3):  # the return is 1.5 - beta * (summed log-ratio) = 1.5 + 0.8 beta
        assert math.isclose(float(ex.ex1_rewards(beta).sum()), 1.5 + 0.8 * beta, abs_tol=1e-6)


def test_ex1_cells():
    ns = _run(_cell(solution="ex1_shaped_rewards"), shaped_rewards=sol.shaped_rewards)
    check = next(src for h, src in _cells() if "Check for exercise 1" in src)
    _run(check, **ns)
    wrong_sign = lambda s, lp, lr, m, beta: sol.shaped_rewards(s, lp, lr, m, -beta)  # noqa: E731
    with pytest.raises(AssertionError):
        _run(check, **_run(_cell(solution="ex1_shaped_rewards"), shaped_rewards=wrong_sign))


# ------------------------------------------------------------------------------------ exercise 2


def _leaky_gae(rewards, values, response_mask, gamma=1.0, lam=0.95):
    """A plausible bug: the value after the last response token is read from the padding, not set to 0."""
    advantages, carry = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(carry)
        carry = response_mask[:, t] * (rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * carry)
        advantages[:, t] = carry
    return advantages, (advantages + values) * response_mask


def test_ex2_identity_with_padding():
    for seed in range(3):
        rewards, values, mask = ex.padded_gae_batch(seed)
        adv, ret = sol.gae(rewards, values, mask, gamma=1.0, lam=1.0)
        to_go = ex.reward_to_go(rewards, mask)
        assert torch.allclose((adv + values) * mask, to_go, atol=1e-10)
        assert torch.allclose(ret, to_go, atol=1e-10)
        assert not torch.allclose((_leaky_gae(rewards, values, mask, 1.0, 1.0)[0] + values) * mask, to_go, atol=1e-3)


def test_ex2_cells():
    check = next(src for h, src in _cells() if "Check for exercise 2" in src)
    ns = _run(_cell(solution="ex2_reward_to_go"))
    _run(check, gae=sol.gae, **ns)
    with pytest.raises(AssertionError, match="reward-to-go"):
        _run(check, gae=_leaky_gae, **ns)
    no_mask = lambda rewards, mask: rewards.flip(1).cumsum(1).flip(1)  # noqa: E731 -- fine: the check masks it
    _run(check, gae=sol.gae, reward_to_go=no_mask)
    forward = lambda rewards, mask: (rewards * mask).cumsum(1) * mask  # noqa: E731 -- reward-so-far, not to-go
    with pytest.raises(AssertionError, match="reward_to_go"):
        _run(check, gae=sol.gae, reward_to_go=forward)


# ------------------------------------------------------------------------------------ exercise 3


def test_ex3_constant_baseline_has_zero_expectation():
    out = ex.exact_baseline_gradient(seed=0)
    assert out["single_term"] > 0.1 and out["expectation"] < 1e-5 * out["single_term"]


def test_ex3_whitening_changes_clip_counts():
    res = ex.whitening_clip_counts(seed=0, batch=64, epochs=6)
    whitened, raw = res["counts"]["whitened"], res["counts"]["raw"]
    assert len(whitened) == len(raw) == 7
    assert whitened[0] == raw[0] == 0  # on-policy batch: every ratio starts at 1
    assert whitened != raw
    assert whitened[1] == 24 and raw[1] == 49  # the numbers the model answer quotes (seed 0, first epoch)
    assert res["raw_adv_positive"] == 1.0


# ------------------------------------------------------------------------------------ exercise 4


@pytest.fixture(scope="module")
def results():
    return ex.load_results()


def _same_torch(results):
    if results["torch"] != torch.__version__:
        pytest.skip(f"cache made with torch {results['torch']}, running {torch.__version__}: replay not bitwise")


def test_ex4_cache_config(results):
    assert results["chapter_run"] == CHAPTER_RUN
    assert results["ptx_config"] == {**ex.PTX, "seeds": list(ex.PTX["seeds"]), "ptx_coefs": list(ex.PTX["ptx_coefs"])}
    assert sorted(results["ptx"]) == sorted(str(c) for c in ex.PTX["ptx_coefs"])
    for runs in results["ptx"].values():
        assert [r["seed"] for r in runs] == list(ex.PTX["seeds"])
        assert all(len(r["reward"]) == len(r["sft"]) == ex.PTX["steps"] for r in runs)


def test_ex4_claims(results):
    final = {k: [r["sft_final"] / r["sft"][0] for r in runs] for k, runs in results["ptx"].items()}
    for r in results["ptx"]["2.0"]:  # the headline arm: reward rises, SFT loss ends within 10 % on every seed
        assert abs(r["sft_final"] / r["sft"][0] - 1) <= 0.10
        assert statistics.fmean(r["reward"][-5:]) > r["reward"][0]
    assert min(final["0.0"]) > 1.10 and min(final["0.0"]) > max(final["2.0"]) and min(final["0.0"]) > max(final["1.0"])
    assert statistics.fmean(final["0.0"]) > 3 * statistics.fmean(final["1.0"])
    starts = [r["sft"][0] for runs in results["ptx"].values() for r in runs]
    assert max(starts) < 1.1 * ex.demonstration_floor()  # PPO starts from a model that fits the demonstrations


def test_ex4_cache_replays(results):
    _same_torch(results)
    steps = 4
    for key, runs in results["ptx"].items():
        fresh = ex.ptx_run(0, float(key), steps=steps)
        for field in ("reward", "kl", "sft", "beta"):
            assert fresh[field] == pytest.approx(runs[0][field][:steps], rel=1e-5, abs=1e-6), (key, field)


PTX_WRONG = {
    "no coefficient": lambda batch, c: lambda p: sft_loss(p(batch.input_ids), batch.labels),
    "detached": lambda batch, c: lambda p: c * sft_loss(p(batch.input_ids), batch.labels).detach(),
    "labels not shifted": lambda batch, c: (
        lambda p: (
            c
            * F.cross_entropy(
                p(batch.input_ids).reshape(-1, p(batch.input_ids).shape[-1]), batch.labels.reshape(-1), ignore_index=-100
            )
        )
    ),
    "summed": lambda batch, c: (
        lambda p: (
            c
            * F.cross_entropy(
                p(batch.input_ids)[:, :-1].flatten(0, 1), batch.labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
            )
        )
    ),
    "padding counted": lambda batch, c: lambda p: c * sft_loss(p(batch.input_ids), batch.input_ids),
}


def test_ex4_test_cell_passes_solution_and_rejects_wrong_answers(capfd):
    test_cell = _cell(test="ex4_ptx_test")
    ns = _run(_cell(solution="ex4_ptx"))
    _run(test_cell, make_ptx_loss=ns["make_ptx_loss"])
    assert capfd.readouterr().err == "", "a graded test cell must not write to stderr"
    torch.manual_seed(11)
    captured = TinyCausalLM(ToyLMConfig(init_std=0.3))
    wrong = {**PTX_WRONG, "captured model": lambda batch, c: lambda p: c * sft_loss(captured(batch.input_ids), batch.labels)}
    for name, fn in wrong.items():
        with pytest.raises(AssertionError):
            _run(test_cell, make_ptx_loss=fn)
            pytest.fail(f"the ex4 test cell accepted a wrong answer: {name}")
    # The reference helper and the notebook's solution agree.
    demos = demonstration_batch()
    model = TinyCausalLM(ToyLMConfig())
    assert float(ns["make_ptx_loss"](demos, 0.7)(model)) == pytest.approx(float(ex.make_ptx_loss(demos, 0.7)(model)))


# ------------------------------------------------------------------------------------ exercise 5


def test_ex5_cache_config_and_claims(results):
    assert results["stale_config"] == {**ex.STALE, "seeds": list(ex.STALE["seeds"])}
    clip = {k: [statistics.fmean(r["clip_frac"][1:]) for r in runs] for k, runs in results["stale"].items()}
    assert min(clip["stale"]) > max(clip["on_policy"])  # higher on every seed, not just on average
    assert statistics.fmean(clip["stale"]) > 2 * statistics.fmean(clip["on_policy"])
    for on, st in zip(results["stale"]["on_policy"], results["stale"]["stale"], strict=True):
        assert on["seed"] == st["seed"] and on["clip_frac"][0] == st["clip_frac"][0]  # step 1 is on-policy in both


def test_ex5_cache_replays(results):
    _same_torch(results)
    steps = 4
    for name, runs in results["stale"].items():
        fresh = ex.stale_run(0, name == "stale", steps=steps)
        for field in ("clip_frac", "reward", "approx_kl"):
            assert fresh[field] == pytest.approx(runs[0][field][:steps], rel=1e-5, abs=1e-6), (name, field)


def test_ex5_logp_old_from_current_policy_makes_every_ratio_one():
    policy, sampler, roll = ex.stale_batch(seed=0, batch=32)
    on = roll["mask"].bool()
    right = ex.importance_ratios(policy, sampler, roll["tokens"], roll["mask"])
    wrong = ex.importance_ratios(policy, policy, roll["tokens"], roll["mask"])
    assert torch.equal(wrong[on], torch.ones_like(wrong[on]))  # exactly 1: no importance correction left
    stats = ex.ratio_stats(right, roll["mask"])
    assert stats["mean_abs_dev"] > 0.05 and stats["clip_frac"] > 0.05
    # The right ratio is the one collect_rollouts(sampler=) sets up: exp(logp_policy - recorded logp_old).
    with torch.no_grad():
        logp_policy = token_log_probs(policy(roll["tokens"]), roll["tokens"]) * roll["mask"]
    assert torch.allclose(torch.log(right) * roll["mask"], logp_policy - roll["logp_old"], atol=1e-5)
    assert not bool(roll["on_policy"])


def _ratios_via(model_top, model_bottom, log=False, shift=0):
    def fn(policy, sampler, tokens, mask):
        top, bottom = model_top(policy, sampler), model_bottom(policy, sampler)
        with torch.no_grad():
            lp = torch.log_softmax(top(tokens), -1)[:, shift : tokens.shape[1] - 1 + shift]
            ls = torch.log_softmax(bottom(tokens), -1)[:, shift : tokens.shape[1] - 1 + shift]
            idx = tokens[:, 1:].unsqueeze(-1)
            d = lp.gather(-1, idx).squeeze(-1) - ls.gather(-1, idx).squeeze(-1)
        return d if log else d.exp()

    return fn


def test_ex5_test_cell_passes_solution_and_rejects_wrong_answers(capfd):
    test_cell = _cell(test="ex5_stale_test")
    ns = _run(_cell(solution="ex5_stale"))
    _run(test_cell, importance_ratios=ns["importance_ratios"])
    _run(test_cell, importance_ratios=ex.importance_ratios)
    pol, smp = (lambda p, s: p), (lambda p, s: s)
    masked = _ratios_via(pol, smp)
    _run(test_cell, importance_ratios=lambda p, s, t, m: masked(p, s, t, m) * m)  # 0 off the response is fine
    assert capfd.readouterr().err == ""
    wrong = {
        "logp_old from the current policy": _ratios_via(pol, pol),
        "inverted": _ratios_via(smp, pol),
        "log-ratio": _ratios_via(pol, smp, log=True),
        "off by one position": _ratios_via(pol, smp, shift=1),
    }
    for name, fn in wrong.items():
        with pytest.raises(AssertionError):
            _run(test_cell, importance_ratios=fn)
            pytest.fail(f"the ex5 test cell accepted a wrong answer: {name}")


# (summary key, statistic index: 0 mean / 1 std / 2 min / 3 max, format, the text the model answers quote)
QUOTED = [
    ("plain_sft_final_ratio", 0, ".1f", "5.5"),
    ("plain_sft_final_ratio", 1, ".1f", "3.0"),
    ("plain_sft_final_ratio", 2, ".1f", "2.9"),
    ("plain_sft_final_ratio", 3, ".1f", "10.2"),
    ("ptx2_sft_final_ratio", 0, ".2f", "1.00"),
    ("ptx2_sft_final_ratio", 1, ".2f", "0.03"),
    ("ptx2_sft_final_ratio", 2, ".2f", "0.98"),
    ("ptx2_sft_final_ratio", 3, ".2f", "1.05"),
    ("ptx2_sft_peak_ratio", 3, ".2f", "1.10"),
    ("ptx2_reward_first", 0, ".2f", "0.16"),
    ("ptx2_reward_last5", 0, ".2f", "0.49"),
    ("ptx2_reward_last5", 1, ".2f", "0.16"),
    ("ptx2_reward_last5", 2, ".2f", "0.29"),
    ("ptx2_reward_last5", 3, ".2f", "0.70"),
    ("ptx1_reward_last5", 0, ".2f", "0.57"),
    ("ptx1_reward_last5", 1, ".2f", "0.12"),
    ("ptx1_sft_final_ratio", 0, ".2f", "1.07"),
    ("ptx1_sft_final_ratio", 1, ".2f", "0.05"),
    ("ptx1_sft_final_ratio", 3, ".2f", "1.16"),
    ("plain_reward_last5", 0, ".2f", "0.64"),
    ("plain_reward_last5", 1, ".2f", "0.10"),
    ("on_policy_clip_mean", 0, ".3f", "0.111"),
    ("on_policy_clip_mean", 1, ".3f", "0.026"),
    ("on_policy_clip_mean", 3, ".3f", "0.149"),
    ("stale_clip_mean", 0, ".3f", "0.341"),
    ("stale_clip_mean", 1, ".3f", "0.026"),
    ("stale_clip_mean", 2, ".3f", "0.309"),
    ("stale_reward_last5", 0, ".2f", "4.84"),
    ("on_policy_reward_last5", 0, ".2f", "3.71"),
    ("stale_kl_last5", 0, ".2f", "8.93"),
    ("on_policy_kl_last5", 0, ".2f", "5.62"),
    ("stale_beta_final", 0, ".3f", "0.336"),
    ("on_policy_beta_final", 0, ".3f", "0.399"),
]


def test_prose_numbers_match_cache(results):
    """The model answers quote the cached sweeps: after a refresh that moves a number, update the prose."""
    summary, text = ex.summarise(results), FRAGMENT.read_text()
    for key, index, fmt, quoted in QUOTED:
        assert format(summary[key][index], fmt) == quoted, (key, index, summary[key][index], quoted)
        assert quoted in text, quoted
    band = {k: sum(abs(v / r["sft"][0] - 1) > 0.10 for r in runs for v in r["sft"]) for k, runs in results["ptx"].items()}
    assert band["2.0"] == 1 and band["1.0"] == 25
    assert "only 1 of the 150 seed-steps" in text and "25 of the 150 seed-steps" in text
