"""The systems helpers (memory table, step timer) and the chapter's explanatory figures."""

import dataclasses
from functools import partial

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from mlbook_solutions.ppo_lm import PPOConfig, collect_rollouts, ppo_update  # noqa: E402

from mlbook.figures import CLIPPED_LABEL, PIPELINE_BOXES, draw_pipeline, plot_clip_objective  # noqa: E402
from mlbook.posttrain.systems import (  # noqa: E402
    PHASES,
    StepClock,
    format_memory_table,
    format_time_split,
    rlhf_memory_table,
    rlhf_over_pretraining,
    time_ppo_step,
)
from mlbook.posttrain.toy_lm import (  # noqa: E402
    END_ID,
    TinyCausalLM,
    TinyCritic,
    ToyLMConfig,
    build_models,
    good_count_reward,
)

pytestmark = pytest.mark.unit

# ------------------------------------------------------------------------------------- memory table


def test_7b_memory_is_36_bytes_per_param_and_252_gb():
    rows = {r.component.split(" (")[0]: r for r in rlhf_memory_table(7e9)}
    assert [rows[k].bytes_per_param for k in ("policy", "critic", "reference", "reward model")] == [
        16,
        16,
        2,
        2,
    ]
    assert rows["policy"].total_bytes == pytest.approx(112e9)
    assert rows["total"].bytes_per_param == pytest.approx(36)
    assert rows["total"].total_bytes == pytest.approx(252e9)
    assert rlhf_over_pretraining(7e9) == pytest.approx(2.25)
    md = format_memory_table(rlhf_memory_table(7e9))
    assert "252 GB" in md and md.count("\n") == 6 and md.startswith("| component")
    plain = format_memory_table(rlhf_memory_table(7e9), markdown=False)
    assert "252 GB" in plain and "|" not in plain


def test_toy_memory_rows_match_the_models_parameter_counts():
    cfg = ToyLMConfig()
    n_policy = sum(p.numel() for p in TinyCausalLM(cfg).parameters())
    n_critic = sum(p.numel() for p in TinyCritic(cfg).parameters())
    rows = rlhf_memory_table(n_policy, critic_params=n_critic, reward_params=0)
    policy, critic, ref, rm, total = rows
    assert (policy.n_params, critic.n_params, ref.n_params, rm.n_params) == (
        n_policy,
        n_critic,
        n_policy,
        0,
    )
    assert (
        policy.total_bytes == 16 * n_policy
        and critic.total_bytes == 16 * n_critic
        and ref.total_bytes == 2 * n_policy
    )
    assert rm.total_bytes == 0
    assert total.total_bytes == 18 * n_policy + 16 * n_critic
    assert total.bytes_per_param == pytest.approx(total.total_bytes / n_policy)
    with pytest.raises(ValueError):
        rlhf_memory_table(0)


# -------------------------------------------------------------------------------------- step timer


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny models gain nothing from more, and a busy machine makes spin-waits costly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_time_ppo_step_fractions_and_leaves_models_untouched(one_thread):
    policy, ref, critic, prompts, _ = build_models(
        0, batch=8, cfg=ToyLMConfig(d_model=16, n_layers=1, max_len=12)
    )
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    rng_before = torch.get_rng_state()
    split = time_ppo_step(
        policy,
        ref,
        critic,
        prompts,
        rollout=collect_rollouts,
        reward_fn=good_count_reward,
        update=partial(ppo_update, beta=0.05, cfg=PPOConfig()),
        max_new_tokens=4,
        eos_id=END_ID,
        repeats=2,
        warmup=0,
    )
    assert set(split["seconds"]) == set(PHASES) == set(split["fractions"])
    assert all(s > 0 for s in split["seconds"].values())
    assert all(0 < f < 1 for f in split["fractions"].values())
    assert sum(split["fractions"].values()) == pytest.approx(1.0)
    assert split["total_s"] == pytest.approx(sum(split["seconds"].values()))
    assert 0 < split["response_tokens"] <= 8 * 4
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert torch.equal(rng_before, torch.get_rng_state())
    assert "generation" in format_time_split(split)


def test_step_clock_splits_a_rollout_into_decode_steps_and_scoring_forwards(one_thread):
    torch.manual_seed(0)
    cfg = ToyLMConfig(d_model=16, n_layers=1, max_len=16)
    policy, ref, critic, prompts, _ = build_models(0, batch=4, cfg=cfg)
    for use_cache in (False, True):
        policy.cfg.use_cache = use_cache
        clock, lengths = StepClock(), []
        hook = policy.register_forward_hook(
            lambda m, a, o, seen=lengths: seen.append(a[0].shape[1])
        )
        with clock.rollout(policy, ref, critic):
            roll = collect_rollouts(
                policy, ref, critic, prompts, 6, None, torch.Generator().manual_seed(1)
            )
        hook.remove()
        T = roll["tokens"].shape[1]
        assert T == 2 + 6
        # six decode calls of the policy (prefixes, or prompt + single tokens), then one full-length pass
        assert lengths == ([2, 3, 4, 5, 6, 7] if not use_cache else [2, 1, 1, 1, 1, 1]) + [T]
        assert clock.seconds["generation"] > 0 and clock.seconds["forward"] > 0
        assert clock.seconds["reward"] == clock.seconds["update"] == 0
        assert not policy._forward_hooks and not ref._forward_pre_hooks  # hooks removed
    with clock.phase("reward"):
        pass
    assert clock.seconds["reward"] > 0
    with pytest.raises(ValueError, match="unknown phase"):
        with clock.phase("sampling"):
            pass


# ----------------------------------------------------------------------------------------- figures


@pytest.mark.parametrize("eps", [0.2, 0.1])
def test_clip_objective_is_flat_exactly_past_the_bound_the_advantage_favours(eps):
    fig = plot_clip_objective(eps)
    assert len(fig.axes) == 2
    for ax, sign in zip(fig.axes, (1, -1), strict=True):
        (line,) = [ln for ln in ax.lines if ln.get_label() == CLIPPED_LABEL]
        r, y = (np.asarray(v, dtype=float) for v in line.get_data())
        slope = np.gradient(y, r)
        flat = r > 1 + eps if sign > 0 else r < 1 - eps
        away = np.abs(r - (1 + sign * eps)) > 0.02  # skip the kink
        assert np.allclose(slope[flat & away], 0.0)
        assert np.allclose(slope[~flat & away], sign)  # d(rA)/dr = A where unclipped
        assert np.allclose(y, np.minimum(r * sign, np.clip(r, 1 - eps, 1 + eps) * sign))
    plt.close(fig)


def test_pipeline_draws_every_stage_once():
    fig = draw_pipeline()
    (ax,) = fig.axes
    boxes = [p.get_gid() for p in ax.patches if p.get_gid()]
    assert sorted(boxes) == sorted(PIPELINE_BOXES)
    text = " ".join(t.get_text() for t in ax.texts)
    assert "(frozen)" in text and "(trained)" in text and "new weights" in text
    plt.close(fig)


def test_precision_mismatch_is_small_and_real():
    """§4.2's bf16-sample / fp32-score cell: a gap exists, no token near the [0.5, 5] band's edges."""
    from mlbook_solutions.ppo_lm import train_ppo
    from mlbook_solutions.run_toy import CHAPTER_RUN

    from mlbook.posttrain.systems import precision_mismatch
    from mlbook.posttrain.toy_lm import END_ID, build_models, good_count_reward

    torch.manual_seed(0)
    policy, ref, critic, prompts, gen = build_models(0, 64)
    cfg = dataclasses.replace(CHAPTER_RUN, steps=10)
    train_ppo(policy, ref, critic, prompts, good_count_reward, END_ID, cfg, generator=gen)
    mm = precision_mismatch(policy, prompts, 8, generator=torch.Generator().manual_seed(0))
    assert mm["tokens"] > 100
    assert 0 < mm["mean_abs"] < 0.02 and mm["max_abs"] < 0.1  # "real but small"
    assert mm["outside_band"] == 0.0  # "no token comes near the band's edges"
    assert 0.9 < mm["seq_ratio_min"] <= mm["seq_ratio_max"] < 1.1
    assert abs(mm["kl"]) < 0.01
    policy64 = build_models(0, 4).policy.double()
    same = precision_mismatch(policy64, prompts[:4], 4, engine_dtype=torch.float64)
    assert same["max_abs"] < 1e-6  # same dtype, same numbers: the gap is the precision


_EMULATED_MISMATCH = """
import json, torch
torch.set_num_threads(1)
from mlbook.posttrain.systems import precision_mismatch
from mlbook.posttrain.toy_lm import TinyCausalLM, ToyLMConfig, default_dtype, make_prompts
with default_dtype(torch.float64):
    torch.manual_seed(0)
    model = TinyCausalLM(ToyLMConfig(init_std=0.3))
prompts = make_prompts(64, torch.Generator().manual_seed(0))
print(json.dumps({
    name: precision_mismatch(model, prompts, 8, engine_dtype=dtype,
                             generator=torch.Generator().manual_seed(0), emulate=True)
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))
}))
"""


def test_emulated_mismatch_table_is_the_same_on_both_kernel_paths():
    """§4.2's output-checked mismatch table (the cell's own computation): the same numbers with the
    CPU's vectorised kernels and with ATEN_CPU_CAPABILITY=default (measured: equal to ~1e-13
    relative), and the claims the prose makes about them."""
    import json
    import os
    import subprocess
    import sys

    runs = []
    for capability in (None, "default"):
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        out = subprocess.run(
            [sys.executable, "-c", _EMULATED_MISMATCH], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
    vectorised, portable = runs
    for name in ("bf16", "fp16"):
        assert vectorised[name]["tokens"] == portable[name]["tokens"]
        for key, value in vectorised[name].items():
            assert value == pytest.approx(portable[name][key], rel=1e-9, abs=1e-12), (name, key)
    bf16, fp16 = vectorised["bf16"], vectorised["fp16"]
    assert bf16["outside_band"] == fp16["outside_band"] == 0.0  # "no token comes near the edges"
    assert bf16["max_abs"] < 0.2  # "far less than the band allows" (log 0.5 = -0.69)
    assert fp16["mean_abs"] * 3 < bf16["mean_abs"] and fp16["max_abs"] < bf16["max_abs"]
    assert 0.95 < bf16["seq_ratio_min"] <= bf16["seq_ratio_max"] < 1.05
