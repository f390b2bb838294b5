"""Critic-free advantages next to GAE, on the toy, with the same number of samples per step.

    python -m mlbook_solutions.critic_free --refresh   # rerun the five arms, rewrite the cache
    python -m mlbook_solutions.critic_free             # print the table of the cached runs

Every arm samples 64 responses per step. The first three pay the same per-token KL fee (fixed
beta, in the reward) and update with the same clipped surrogate (``ppo_clip_loss``: same epochs,
same clip, a token mean over the batch, advantages whitened over the batch's response tokens).
Only the advantage differs:

- ``gae``: the chapter's PPO, a learned critic V(s_t) and GAE over the response;
- ``rloo``: PPO's update with RLOO's advantage, the sequence's return minus the mean return of the
  other k - 1 (Ahmadian et al., 2024), on every token. Not Ahmadian et al.'s algorithm, which is a
  single REINFORCE step per batch with no clip;
- ``grpo``: PPO's update with GRPO's group-normalised advantage, (R - group mean) / group std
  (Shao et al., 2024), on every token, the KL still in the reward.

Two more arms follow the published objectives instead:

- ``grpo_published``: GRPO as DeepSeekMath writes it: the group-normalised advantage of the score
  alone, the k3 KL to the reference in the loss (coefficient beta), each response's token terms
  averaged within the response and then over responses (which is where its length bias lives);
- ``dr_grpo``: Dr. GRPO (Liu et al., 2025): the same without the two terms it removes, the
  division by the group's std and by the response's length (token terms summed and divided by a
  constant, batch size x the longest allowed response).

The sweep (5 arms x 3 seeds) takes about half a minute, so the notebook reads it from the
library's cached results (``mlbook.posttrain.cached``), built like the exercises' cache (code
fingerprint, float64 replay).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import pathlib
import statistics
import time

import torch
import torch.nn as nn

from mlbook.posttrain.cached import results_path
from mlbook.posttrain.masks import masked_whiten, validate_mask
from mlbook.posttrain.toy_lm import (
    END_ID,
    GOOD_ID,
    build_models,
    default_dtype,
    good_count_reward,
    token_log_probs,
)
from mlbook_solutions.exercises import code_fingerprint
from mlbook_solutions.ppo_lm import (
    collect_rollouts,
    gae,
    ppo_clip_loss,
    sequence_kl,
    shaped_rewards,
    train_ppo,
)
from mlbook_solutions.run_toy import CHAPTER_RUN

RESULTS_PATH = results_path("critic_free")  # shipped with the library: the notebook draws it


def _validate_groups(returns: torch.Tensor, k: int) -> None:
    if returns.dim() != 1 or not returns.is_floating_point():
        raise ValueError(f"returns must be a 1-D float tensor (B,), got {tuple(returns.shape)}")
    if k < 2 or returns.shape[0] % k:
        raise ValueError(
            f"need k >= 2 samples per prompt and B divisible by k, got B={returns.shape[0]}, k={k}"
        )


def rloo_advantages(returns: torch.Tensor, k: int) -> torch.Tensor:
    """Leave-one-out baseline: (B,) -> (B,), rows grouped as k consecutive samples per prompt.

    ``A_i = R_i - mean_{j != i} R_j`` over the other samples of the same prompt, which equals
    ``k / (k - 1) * (R_i - mean_j R_j)``: unbiased, because the baseline does not use R_i.
    """
    _validate_groups(returns, k)
    r = returns.view(-1, k)  # (B/k, k)
    others = (r.sum(dim=1, keepdim=True) - r) / (k - 1)  # (B/k, k) mean of the other k - 1
    return (r - others).reshape(-1)  # (B,)


def grpo_advantages(returns: torch.Tensor, k: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised return: (B,) -> (B,), ``(R_i - mean_group) / (std_group + eps)``.

    The std is the group's unbiased sample std (``torch.std``, as TRL's GRPO trainer computes it);
    a group whose returns are all equal gets advantage 0 everywhere.
    """
    _validate_groups(returns, k)
    r = returns.view(-1, k)  # (B/k, k)
    mean, std = r.mean(dim=1, keepdim=True), r.std(dim=1, keepdim=True)  # (B/k, 1) each
    return ((r - mean) / (std + eps)).reshape(-1)  # (B,)


def critic_memory(critic: nn.Module, tokens: torch.Tensor) -> tuple[int, int]:
    """Bytes of the critic's weights, and of what training it adds: its gradients plus the state
    Adam allocates for it, measured after one step on a copy: ``(weights, grads + Adam state)``."""
    critic = copy.deepcopy(critic)
    opt = torch.optim.Adam(critic.parameters())
    critic(tokens).sum().backward()
    opt.step()
    weights = sum(p.numel() * p.element_size() for p in critic.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in critic.parameters())
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    return weights, grads + state


ESTIMATORS = {"rloo": rloo_advantages, "grpo": grpo_advantages}


class NoCritic(nn.Module):
    """The stand-in ``collect_rollouts`` gets instead of a value model: V = 0, no parameters."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.zeros(tokens.shape, dtype=torch.get_default_dtype(), device=tokens.device)


def sequence_returns(scores: torch.Tensor, roll: dict, beta: float) -> torch.Tensor:
    """Score minus the KL fee summed over the response: (B,). Equal to the sum of the chapter's
    shaped rewards over the response (gamma = 1)."""
    validate_mask(roll["mask"])
    log_ratio = (roll["logp_old"] - roll["logp_ref"]) * roll["mask"]  # (B, T-1)
    return scores.to(log_ratio.dtype) - beta * log_ratio.sum(dim=1)  # (B,)


def critic_free_update(
    policy: nn.Module,
    opt: torch.optim.Optimizer,
    roll: dict,
    scores: torch.Tensor,  # (B,)
    beta: float,
    k: int,
    estimator: str,
    epochs: int,
    clip_eps: float,
    max_grad_norm: float,
) -> float:
    """``epochs`` full-batch steps of the clipped surrogate with a per-sequence advantage on every
    response token, whitened over the batch's response tokens as the GAE arm's are. Returns the
    last epoch's clip fraction."""
    m = roll["mask"]  # (B, T-1)
    adv = ESTIMATORS[estimator](sequence_returns(scores, roll, beta), k)  # (B,)
    adv = masked_whiten(adv.unsqueeze(1) * m, m)  # (B, T-1) one advantage per response, whitened
    params = [p for g in opt.param_groups for p in g["params"]]
    for _ in range(epochs):
        logp_new = token_log_probs(policy(roll["tokens"]), roll["tokens"]) * m  # (B, T-1)
        loss, clip_frac = ppo_clip_loss(logp_new, roll["logp_old"], adv, m, clip_eps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
    return clip_frac


def published_grpo_loss(
    logp_new: torch.Tensor,  # (B, T-1)
    logp_old: torch.Tensor,  # (B, T-1)
    logp_ref: torch.Tensor,  # (B, T-1)
    adv: torch.Tensor,  # (B,) one advantage per response
    mask: torch.Tensor,  # (B, T-1)
    kl_coef: float,
    clip_eps: float,
    budget: int | None = None,
) -> torch.Tensor:
    """GRPO's loss as published (``budget=None``): per token the clipped surrogate plus
    ``kl_coef`` times k3 to the reference (``exp(d) - d - 1``, ``d = log pi_ref - log pi``),
    averaged within each response, then over responses. Dr. GRPO's (``budget`` = B x the longest
    allowed response): the same token terms summed and divided by that constant."""
    a = adv.unsqueeze(1).to(logp_new.dtype) * mask  # (B, T-1)
    ratio = torch.exp((logp_new - logp_old) * mask)  # (B, T-1)
    surrogate = -torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    d = (logp_ref - logp_new) * mask  # (B, T-1)
    per_token = (surrogate + kl_coef * (torch.exp(d) - d - 1)) * mask  # (B, T-1)
    if budget is not None:
        return per_token.sum() / budget
    return (per_token.sum(1) / mask.sum(1).clamp(min=1)).mean()


def published_grpo_update(
    policy: nn.Module,
    opt: torch.optim.Optimizer,
    roll: dict,
    scores: torch.Tensor,  # (B,)
    kl_coef: float,
    k: int,
    epochs: int,
    clip_eps: float,
    max_grad_norm: float,
    max_new_tokens: int,
    dr: bool = False,
    divide_std: bool | None = None,
) -> None:
    """``epochs`` full-batch steps of GRPO's published objective (``dr=False``: group-normalised
    advantage, per-response mean) or Dr. GRPO's (``dr=True``: no std, constant normaliser).
    ``divide_std`` (default: ``not dr``) switches the division by the group's std on its own."""
    m = roll["mask"]  # (B, T-1)
    if divide_std is None:
        divide_std = not dr
    if divide_std:
        adv = grpo_advantages(scores, k)  # (B,)
    else:  # the group's mean subtracted, no division by its std
        adv = scores - scores.view(-1, k).mean(1).repeat_interleave(k)  # (B,)
    budget = m.shape[0] * max_new_tokens if dr else None  # B x the longest allowed response
    params = [p for g in opt.param_groups for p in g["params"]]
    for _ in range(epochs):
        logp_new = token_log_probs(policy(roll["tokens"]), roll["tokens"]) * m  # (B, T-1)
        loss = published_grpo_loss(
            logp_new, roll["logp_old"], roll["logp_ref"], adv, m, kl_coef, clip_eps, budget
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()


@dataclasses.dataclass(kw_only=True)
class CriticFreeConfig:
    """The sweep: every arm sees ``prompts * k`` samples per step for ``steps`` steps."""

    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 40
    prompts: int = 16
    """Distinct prompts per step for RLOO/GRPO (the GAE arm samples prompts * k distinct ones)."""
    k: int = 4
    """Samples per prompt (RLOO, GRPO)."""
    beta: float = 0.3
    """Fixed KL coefficient of every arm (the chapter's starting beta): the fee binds, so the arms
    are compared on the KL-regularised objective, not on a saturated reward."""


SWEEP = CriticFreeConfig()
REPLAY = dict(seed=0, steps=4)
CREDIT = CriticFreeConfig(prompts=2, k=4)
"""Where credit could matter: 8 samples a step instead of 64, the PPO-update arms only."""
CREDIT_ARMS = ("gae", "rloo", "grpo")
CREDIT_PROBES = (1, 4, 9, 19)
"""Updates after which the GAE arm measures credit (and after its last update)."""
PROBE_SEED = 1000
CREDIT_THRESHOLD = 4.0
"""Mean reward (good tokens) that counts as reached in the credit sweep, smoothed over 5 steps."""


def credit_correlations(
    roll: dict, scores: torch.Tensor, beta: float, k: int, gamma: float, lam: float
) -> dict[str, float]:
    """On one batch of groups of ``k`` (rows grouped as in ``rloo_advantages``), with the critic's
    ``values_old`` in ``roll``: the Pearson correlation, over response tokens, between each
    estimator's per-token advantage and the indicator that the token is ``good`` (the one thing
    the reward counts). GAE's advantage differs token by token; RLOO's and GRPO's are one number
    per response."""
    m = roll["mask"]  # (B, T-1)
    on = m.bool()
    good = (roll["tokens"][:, 1:] == GOOD_ID)[on].double()  # (N,) the token at t + 1 is good
    rewards = shaped_rewards(scores, roll["logp_old"], roll["logp_ref"], m, beta)  # (B, T-1)
    per_token = {"gae": gae(rewards, roll["values_old"], m, gamma, lam)[0]}
    returns = sequence_returns(scores, roll, beta)  # (B,)
    for name, fn in ESTIMATORS.items():
        per_token[name] = fn(returns, k).unsqueeze(1).expand_as(m)  # (B, T-1)
    out = {}
    for name, adv in per_token.items():
        # (2, N) in float64: a float32 correlation goes through the BLAS, whose kernels (so the
        # rounding) depend on the CPU; the stored float64 replay must hold on every CPU
        pair = torch.stack([adv[on].double(), good])
        out[name] = float(torch.corrcoef(pair)[0, 1])
    return out


def steps_to_threshold(reward: list[float], threshold: float, window: int = 5) -> int | None:
    """The first step (1-based) at which the mean reward of the last ``window`` steps reaches
    ``threshold``; None if it never does."""
    for t in range(window, len(reward) + 1):
        if statistics.fmean(reward[t - window : t]) >= threshold:
            return t
    return None


def run_arm(arm: str, seed: int, cfg: CriticFreeConfig = SWEEP, steps: int | None = None) -> dict:
    """One run of ``arm`` (one of ``ARMS``): per-step reward, KL and response length, the CPU
    seconds it took (process time: a busy, shared machine slows every arm alike),
    and the bytes the critic and its Adam state take (0 without a critic)."""
    steps = cfg.steps if steps is None else steps
    batch = cfg.prompts * cfg.k
    run = dataclasses.replace(CHAPTER_RUN, steps=steps, beta=cfg.beta, kl_target=None)
    t0 = time.process_time()  # CPU time of this process (torch runs on one thread here)
    if arm == "gae":
        policy, ref, critic, prompts, gen = build_models(seed, batch)
        groups = prompts[: cfg.prompts].repeat_interleave(cfg.k, dim=0)  # (prompts * k, P)
        probe_gen = torch.Generator().manual_seed(PROBE_SEED + seed)  # leaves training's alone
        credit, updates, probe_seconds = {}, [0], [0.0]

        def probe(model: nn.Module) -> float:
            """Credit on one batch of groups, sampled by the policy, valued by the critic as
            they stand after ``updates[0]`` updates (off the clock, its own generator)."""
            if updates[0] in CREDIT_PROBES or updates[0] == steps:
                t = time.process_time()
                roll = collect_rollouts(
                    model, ref, critic, groups, run.max_new_tokens, END_ID, probe_gen
                )
                scores = good_count_reward(roll["tokens"], roll["response_mask"])
                credit[str(updates[0])] = credit_correlations(
                    roll, scores.to(roll["logp_old"].dtype), run.beta, cfg.k, run.gamma, run.lam
                )
                probe_seconds[0] += time.process_time() - t
            updates[0] += 1
            return float("nan")

        history = train_ppo(
            policy,
            ref,
            critic,
            prompts,
            good_count_reward,
            END_ID,
            run,
            generator=gen,
            evaluate=probe,
        )
        with torch.no_grad():
            probe(policy)  # after the last update
        reward, kl = [h.reward for h in history], [h.kl for h in history]
        length = [h.response_len for h in history]
        critic_bytes, state_bytes = critic_memory(critic, prompts)
        t0 += probe_seconds[0]
    else:
        policy, ref, _, prompts, gen = build_models(seed, cfg.prompts)
        prompts = prompts.repeat_interleave(cfg.k, dim=0)  # (prompts * k, P): groups of k rows
        opt = torch.optim.Adam(policy.parameters(), lr=run.lr)
        reward, kl, length = [], [], []
        for _ in range(steps):
            roll = collect_rollouts(
                policy, ref, NoCritic(), prompts, run.max_new_tokens, END_ID, gen
            )
            scores = good_count_reward(roll["tokens"], roll["response_mask"]).to(
                roll["logp_old"].dtype
            )  # (B,)
            reward.append(float(scores.mean()))
            kl.append(sequence_kl(roll))
            length.append(float(roll["response_mask"].sum(1).mean()))
            if arm in ("grpo_published", "grpo_published_no_std", "dr_grpo"):
                published_grpo_update(
                    policy,
                    opt,
                    roll,
                    scores,
                    run.beta,
                    cfg.k,
                    run.ppo_epochs,
                    run.clip_eps,
                    run.max_grad_norm,
                    run.max_new_tokens,
                    dr=arm == "dr_grpo",
                    divide_std=arm == "grpo_published",
                )
            else:
                critic_free_update(
                    policy,
                    opt,
                    roll,
                    scores,
                    run.beta,
                    cfg.k,
                    arm,
                    run.ppo_epochs,
                    run.clip_eps,
                    run.max_grad_norm,
                )
        critic_bytes = state_bytes = 0
        credit = None
    return dict(
        arm=arm,
        seed=seed,
        reward=reward,
        kl=kl,
        length=length,
        seconds=time.process_time() - t0,
        critic_bytes=critic_bytes,
        critic_state_bytes=state_bytes,
        credit=credit,
    )


ARMS = ("gae", "rloo", "grpo", "grpo_published", "grpo_published_no_std", "dr_grpo")
LABELS = {
    "gae": "PPO: critic + GAE",
    "rloo": "PPO-clip, RLOO advantage",
    "grpo": "PPO-clip, group-normalised advantage",
    "grpo_published": "GRPO's objective, chapter's settings",
    "grpo_published_no_std": "the same, no division by the group std",
    "dr_grpo": "Dr. GRPO",
}
FINGERPRINT_MODULES = (
    "mlbook.posttrain.toy_lm",
    "mlbook.posttrain.masks",
    "mlbook_solutions.ppo_lm",
    "mlbook_solutions.run_toy",
    "mlbook_solutions.critic_free",
)


def fingerprint() -> str:
    settings = [
        dataclasses.asdict(CHAPTER_RUN),
        dataclasses.asdict(SWEEP),
        REPLAY,
        dataclasses.asdict(CREDIT),
        CREDIT_THRESHOLD,
        CREDIT_PROBES,
        PROBE_SEED,
    ]
    return code_fingerprint(FINGERPRINT_MODULES, settings)


def replay64() -> dict:
    """The first ``REPLAY["steps"]`` steps of seed 0 of every arm, in float64 (no timings)."""
    with default_dtype(torch.float64):
        runs = {a: run_arm(a, REPLAY["seed"], steps=REPLAY["steps"]) for a in ARMS}
    out = {a: dict(reward=r["reward"], kl=r["kl"], length=r["length"]) for a, r in runs.items()}
    out["gae"]["credit"] = [
        c[e] for _, c in sorted(runs["gae"]["credit"].items()) for e in ("gae", "rloo", "grpo")
    ]
    return out


def refresh(path: pathlib.Path = RESULTS_PATH, verbose: bool = True) -> dict:
    """Run every arm on every seed (interleaved, so machine load hits the arms alike); replay."""
    runs = {a: [] for a in ARMS}
    credit_runs = {a: [] for a in CREDIT_ARMS}
    for seed in SWEEP.seeds:
        for arm in ARMS:
            runs[arm].append(run_arm(arm, seed))
        for arm in CREDIT_ARMS:
            r = run_arm(arm, seed, CREDIT)
            credit_runs[arm].append(dict(seed=seed, reward=r["reward"], kl=r["kl"]))
    results = dict(
        torch=torch.__version__,
        fingerprint=fingerprint(),
        config={
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(SWEEP).items()
        },
        replay_config=REPLAY,
        runs=runs,
        credit_config={
            **{
                k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(CREDIT).items()
            },
            "threshold": CREDIT_THRESHOLD,
        },
        credit_runs=credit_runs,
        replay64=replay64(),
    )
    path.write_text(json.dumps(results, indent=1) + "\n")
    if verbose:
        print(f"wrote {path}")
    return results


def load_results(path: pathlib.Path = RESULTS_PATH) -> dict:
    """The cached sweep (``python -m mlbook_solutions.critic_free --refresh`` regenerates it)."""
    return json.loads(path.read_text())


def summarise(results: dict, last: int = 10, first: int = 10) -> dict[str, dict[str, float]]:
    """Per arm, over seeds: reward, KL and the regularised objective ``reward - beta * KL``, each
    averaged over the last ``last`` steps (mean, and min and max over seeds); ``early``: the
    reward averaged over the first ``first`` steps; ``wobble``: the std of the reward over the
    last 20 steps (how much it still swings from step to step); seconds per run; the bytes of the
    critic's weights and of its gradients plus Adam state (0 without a critic)."""
    beta, out = results["config"]["beta"], {}
    for arm, runs in results["runs"].items():
        rew = [statistics.fmean(r["reward"][-last:]) for r in runs]
        kls = [statistics.fmean(r["kl"][-last:]) for r in runs]
        obj = [r - beta * k for r, k in zip(rew, kls, strict=True)]
        out[arm] = dict(
            early=statistics.fmean(statistics.fmean(r["reward"][:first]) for r in runs),
            wobble=statistics.fmean(statistics.pstdev(r["reward"][-20:]) for r in runs),
            reward=statistics.fmean(rew),
            reward_min=min(rew),
            reward_max=max(rew),
            kl=statistics.fmean(kls),
            kl_min=min(kls),
            kl_max=max(kls),
            objective=statistics.fmean(obj),
            objective_min=min(obj),
            objective_max=max(obj),
            seconds=statistics.fmean(r["seconds"] for r in runs),
            length=statistics.fmean(statistics.fmean(r["length"][-last:]) for r in runs),
            length_early=statistics.fmean(statistics.fmean(r["length"][:first]) for r in runs),
            critic_bytes=runs[0]["critic_bytes"],
            critic_train_bytes=runs[0]["critic_state_bytes"],
        )
    return out


def credit_summary(results: dict) -> dict[str, dict]:
    """Per estimator: the correlation of its per-token advantage with the good-token indicator on
    a batch of groups sampled in the GAE runs, after each number of updates (mean over seeds); and,
    for the 8-samples-a-step sweep, each seed's step at which the smoothed reward first reaches the
    threshold (None: never within the run) and its reward over the last 10 steps (seed mean)."""
    out, threshold = {}, results["credit_config"]["threshold"]
    runs = results["runs"]["gae"]
    points = sorted(runs[0]["credit"], key=int)
    for name in ("gae", "rloo", "grpo"):
        sweep = results["credit_runs"][name]
        out[name] = dict(
            corr={u: statistics.fmean(r["credit"][u][name] for r in runs) for u in points},
            steps=[steps_to_threshold(r["reward"], threshold) for r in sweep],
            reward=statistics.fmean(statistics.fmean(r["reward"][-10:]) for r in sweep),
        )
    return out


def format_credit_table(credit: dict, config: dict) -> str:
    """A Markdown table, one row per estimator; ``config`` is the cache's ``credit_config``."""
    points = list(next(iter(credit.values()))["corr"])
    lines = [
        "| advantage | "
        + " | ".join(f"corr after {u} update{'' if u == '1' else 's'}" for u in points)
        + f" | steps to {config['threshold']:g}, {config['prompts'] * config['k']} samples a step "
        "| reward, last 10 |",
        "|---" * (len(points) + 3) + "|",
    ]
    for name, c in credit.items():
        steps = ", ".join("never" if t is None else str(t) for t in c["steps"])
        corr = " | ".join(f"{c['corr'][u]:+.2f}" for u in points)
        lines.append(f"| {LABELS[name]} | {corr} | {steps} | {c['reward']:.2f} |")
    return "\n".join(lines)


def format_table(summary: dict, beta: float) -> str:
    """A Markdown table, one row per arm; ranges are min-max over seeds."""
    lines = [
        f"| arm | reward, steps 1-10 | reward | KL (nats) | reward - {beta:g} KL "
        "| response length, steps 1-10 / last 10 | s per run | critic weights "
        "| critic grads + Adam |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        lines.append(
            f"| {LABELS[arm]} | {s['early']:.2f} "
            f"| {s['reward']:.2f} ({s['reward_min']:.2f}-{s['reward_max']:.2f}) "
            f"| {s['kl']:.2f} ({s['kl_min']:.2f}-{s['kl_max']:.2f}) "
            f"| {s['objective']:.2f} ({s['objective_min']:.2f}-{s['objective_max']:.2f}) "
            f"| {s['length_early']:.2f} / {s['length']:.2f} "
            f"| {s['seconds']:.1f} | {s['critic_bytes'] / 1e3:.0f} kB "
            f"| {s['critic_train_bytes'] / 1e3:.0f} kB |"
        )
    return "\n".join(lines)


def plot_arms(results: dict):
    """Reward and KL per step, mean over seeds with a min-max band, one colour per arm."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for arm, color in zip(ARMS, ("C0", "C3", "C2", "C1", "C5", "C4"), strict=True):
        runs = results["runs"][arm]
        for ax, field in zip(axes, ("reward", "kl", "length"), strict=True):
            data = torch.tensor([r[field] for r in runs], dtype=torch.float64)  # (seeds, steps)
            steps = range(1, data.shape[1] + 1)
            ax.plot(
                steps,
                data.mean(0),
                color=color,
                lw=1.5,
                label=LABELS[arm],
            )
            ax.fill_between(
                steps, data.min(0).values, data.max(0).values, color=color, alpha=0.2, lw=0
            )
    axes[0].set_title("mean reward (good tokens)", fontsize=10)
    axes[1].set_title("KL to the reference (per sequence)", fontsize=10)
    axes[2].set_title("mean response length (tokens)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step (64 samples each)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--refresh", action="store_true", help="rerun the sweep and rewrite the cache")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = refresh() if args.refresh else load_results()
    print(format_table(summarise(results), results["config"]["beta"]))


if __name__ == "__main__":
    main()
