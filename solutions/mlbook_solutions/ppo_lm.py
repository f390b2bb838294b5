"""Reference PPO-RLHF for a language model (the chapter's §3, solved).

Read top to bottom: shaped rewards (score + per-token KL) -> GAE -> clipped surrogate and clipped
value loss -> KL controller -> rollouts -> one PPO update -> the training loop. Every per-token
tensor is (B, T-1) and aligned with ``token_log_probs``: index t is about token ``tokens[:, t+1]``.

This module is also the single source of the chapter notebook's code: ``mlbook build`` copies
these functions into the notebooks (the five math functions become student stubs; the rest are
read-only cells), so edit the code here, never in a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from mlbook.posttrain.masks import (
    Reduce,
    global_mean,
    masked_mean,
    masked_whiten,
    no_reduce,
    validate_has_response,
    validate_mask,
    validate_per_token,
    validate_scores,
)
from mlbook.posttrain.toy_lm import sample, token_log_probs


def last_response_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last response token in each row: (B, T-1) -> (B,) long.

    That is where the sequence score lands: the ``<|end|>`` token if the model stopped, otherwise
    the last token it generated. Rows must have at least one response token.
    """
    validate_mask(response_mask)
    validate_has_response(response_mask)
    columns = torch.arange(response_mask.shape[1], device=response_mask.device).expand_as(
        response_mask
    )  # (B, T-1)
    return torch.where(response_mask.bool(), columns, -1).amax(dim=1)  # (B,)


def shaped_rewards(
    scores: torch.Tensor,
    logp_policy: torch.Tensor,
    logp_ref: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-token reward ``R_t = -beta * (logp_policy_t - logp_ref_t) + [t == last] * score``.

    Args:
        scores: (B,) sequence-level reward from the reward model.
        logp_policy: (B, T-1) log-probs of the sampled tokens under the sampling policy.
        logp_ref: (B, T-1) log-probs of the same tokens under the frozen reference.
        response_mask: (B, T-1) 1.0 on response tokens, 0.0 on prompt and padding.
        beta: weight of the KL fee.
    Returns:
        (B, T-1) per-token rewards; prompt and padding positions hold 0.
    """
    validate_per_token(response_mask, logp_policy=logp_policy, logp_ref=logp_ref)
    validate_scores(scores, response_mask.shape[0])
    rewards = -beta * (logp_policy - logp_ref) * response_mask  # (B, T-1) signed per-token KL fee
    last = last_response_index(response_mask)  # (B,)
    rows = torch.arange(rewards.shape[0], device=rewards.device)  # (B,)
    rewards[rows, last] = rewards[rows, last] + scores.to(
        rewards.dtype
    )  # score on the final response token
    return rewards


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation restricted to the response.

    ``delta_t = R_t + gamma * V_{t+1} - V_t`` with ``V = 0`` after the last response token, and
    ``A_t = delta_t + gamma * lam * A_{t+1}``. All inputs (B, T-1); ``values[:, t]`` is the
    critic's V(s_t) for the state just before token ``tokens[:, t+1]``.

    Returns:
        ``(advantages, returns)``, each (B, T-1) and zero outside the response;
        ``returns = advantages + values`` are the critic's regression targets.
    """
    validate_per_token(response_mask, rewards=rewards, values=values)
    advantages = torch.zeros_like(rewards)  # (B, T-1)
    carry = rewards.new_zeros(rewards.shape[0])  # (B,) A_{t+1}
    value_after = rewards.new_zeros(rewards.shape[0])  # (B,) V_{t+1}, zero past the response
    for t in range(rewards.shape[1] - 1, -1, -1):
        m = response_mask[:, t].to(rewards.dtype)  # (B,)
        delta = rewards[:, t] + gamma * value_after - values[:, t]  # (B,)
        carry = m * (delta + gamma * lam * carry)  # (B,) reset to zero off the response
        advantages[:, t] = carry
        value_after = m * values[:, t]  # (B,)
    returns = (advantages + values) * response_mask  # (B, T-1)
    return advantages, returns


def ppo_clip_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> tuple[torch.Tensor, float]:
    """Negative clipped surrogate, averaged over response tokens, and the clip fraction.

    ``ratio = exp(logp_new - logp_old)``; per token ``min(r * A, clip(r, 1-eps, 1+eps) * A)``.
    All inputs (B, T-1); only ``logp_new`` carries gradient.

    Returns:
        ``(loss, clip_frac)``: a scalar tensor to minimise, and the fraction (float) of response
        tokens whose ratio lies outside ``[1 - eps, 1 + eps]``.
    """
    validate_per_token(response_mask, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    ratio = torch.exp(logp_new - logp_old)  # (B, T-1)
    surrogate = torch.minimum(
        ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    )  # (B, T-1)
    loss = -masked_mean(surrogate, response_mask)  # scalar
    outside = ((ratio - 1).abs() > clip_eps).to(ratio.dtype)  # (B, T-1)
    return loss, float(masked_mean(outside, response_mask))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> torch.Tensor:
    """Clipped value loss ``0.5 * max((V - G)^2, (V_clip - G)^2)`` averaged over response tokens.

    ``V_clip`` keeps the new value within ``clip_eps`` of the value recorded at rollout time
    (``old_values``), not of the return. All inputs (B, T-1). Returns a scalar tensor.
    """
    validate_per_token(response_mask, values=values, old_values=old_values, returns=returns)
    v_clipped = torch.clamp(values, old_values - clip_eps, old_values + clip_eps)  # (B, T-1)
    worst = torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)  # (B, T-1)
    return 0.5 * masked_mean(worst, response_mask)


class AdaptiveKLController:
    """Proportional controller that steers ``beta`` so the measured KL tracks ``target``.

    The KL it is fed is the per-sequence KL estimate: for each sample, the sum over response
    tokens of ``logp_policy - logp_ref``, averaged over samples (as in lm-human-preferences and
    TRL). ``horizon`` is in the same unit as ``n_steps``: with ``n_steps=1`` per update it counts
    updates (the chapter's form); pass ``n_steps=batch_size`` to count samples (the original form).
    """

    def __init__(self, beta: float, target: float, horizon: float = 10) -> None:
        if beta <= 0 or target <= 0 or horizon <= 0:
            raise ValueError(
                f"beta, target and horizon must be positive, got {beta}, {target}, {horizon}"
            )
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n_steps: int = 1) -> float:
        """``beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``; returns it."""
        error = min(0.2, max(-0.2, float(kl) / self.target - 1.0))
        self.beta = self.beta * (1.0 + error * n_steps / self.horizon)
        return self.beta


def masked_entropy(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token entropy over response positions: (B, T-1, V), (B, T-1) -> scalar."""
    logp = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    entropy = -(logp.exp() * logp).sum(dim=-1)  # (B, T-1)
    return masked_mean(entropy, response_mask)


def collect_rollouts(
    policy: nn.Module,  # the model being trained
    ref: nn.Module,  # frozen KL anchor
    critic: nn.Module,  # value model
    prompts: torch.Tensor,
    max_new_tokens: int,
    eos_id: int,
    generator: torch.Generator | None = None,
    sampler: nn.Module | None = None,
) -> dict[str, torch.Tensor]:
    """Sample responses and record, without gradient, what the PPO update needs.

    ``sampler`` generates the responses (default: ``policy``; a stale copy for asynchronous
    rollouts). ``logp_old`` always comes from the model that sampled, and is checked against the
    log-probs recorded during generation, so a mismatch (dropout, padding, temperature) fails here.

    Returns a dict of tensors: ``tokens`` and ``response_mask`` (B, T) (what a reward function
    takes); ``mask``, ``logp_old``, ``logp_ref``, ``values_old``, each (B, T-1) and aligned with
    ``token_log_probs``; ``on_policy`` (0-d bool: sampler is policy).
    """
    sampler = policy if sampler is None else sampler
    tokens, full_mask, logp_sampled = sample(
        sampler, prompts, max_new_tokens, eos_id, generator=generator
    )
    mask = full_mask[:, 1:]  # (B, T-1) aligned with the log-probs of tokens[:, 1:]
    with torch.no_grad():
        logp_old = token_log_probs(sampler(tokens), tokens) * mask  # (B, T-1)
        logp_ref = token_log_probs(ref(tokens), tokens) * mask  # (B, T-1)
        values_old = critic(tokens)[:, :-1]  # (B, T-1) V(s_t) before tokens[:, t+1]
    gap = float((logp_old - logp_sampled).abs().max())
    if gap > 1e-4:
        raise RuntimeError(
            f"log-probs recomputed on the sampled tokens differ from those at sampling by {gap:.2e}"
        )
    on_policy = torch.tensor(sampler is policy)
    return dict(
        tokens=tokens,
        response_mask=full_mask,
        mask=mask,
        logp_old=logp_old,
        logp_ref=logp_ref,
        values_old=values_old,
        on_policy=on_policy,
    )


@dataclass(kw_only=True)
class PPOConfig:
    """Every hyperparameter of one PPO-RLHF run. The defaults are the chapter's §3.6 run."""

    steps: int = 40
    """PPO iterations: each samples a rollout batch, then makes one update."""
    max_new_tokens: int = 8
    """Longest response sampled per prompt."""
    beta: float = 0.3
    """Weight of the per-token KL fee: the initial value if ``kl_target`` is set, else fixed."""
    kl_target: float | None = 3.0
    """Per-sequence KL (nats) the adaptive controller steers toward; ``None`` keeps beta fixed."""
    horizon: float = 10
    """Controller horizon in updates (it is fed ``n_steps=1`` per update)."""
    lr: float = 2e-3
    """Adam learning rate for policy and critic."""
    clip_eps: float = 0.2
    """Half-width of the ratio band [1 - eps, 1 + eps], and of the value clip around V_old."""
    ppo_epochs: int = 4
    """Full-batch optimiser steps on each rollout batch."""
    gamma: float = 1.0
    """Discount of GAE (1: no discount within a response)."""
    lam: float = 0.95
    """GAE lambda: 1 gives Monte-Carlo returns minus V, 0 one-step TD errors."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus (0: none, as in most RLHF runs)."""
    whiten: bool = True
    """Whiten advantages over the response tokens of the whole (global) batch."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm of policy + critic to this."""
    approx_kl_stop: float | None = None
    """Skip the remaining epochs of an update once E[r - 1 - log r] exceeds this; None: never."""
    behaviour_clip: tuple[float, float] | None = None
    """Decoupled PPO for stale samples: clip around the policy as it is when the update starts (the
    proximal policy) and weight each token by pi_prox / pi_sampler clamped to this range; None:
    clip around ``logp_old``, the sampler's log-probs."""


@dataclass
class EpochStats:
    """What one epoch of ``ppo_update`` measured, before its optimiser step (global under DDP)."""

    clip_frac: float  # share of response tokens with |ratio - 1| > clip_eps
    value_loss: float  # clipped critic loss
    entropy: float  # mean next-token entropy over response positions
    approx_kl: float  # E[r - 1 - log r]: sampling policy vs the policy at the start of this epoch
    extra_loss: float = math.nan  # value of the optional extra loss term (e.g. PPO-ptx)


def ppo_update(
    policy: nn.Module,  # possibly DDP-wrapped
    critic: nn.Module,  # possibly DDP-wrapped
    opt: torch.optim.Optimizer,  # over policy and critic parameters
    roll: dict[str, torch.Tensor],  # from collect_rollouts
    scores: torch.Tensor,  # (B,) sequence rewards
    beta: float,  # this step's KL coefficient
    cfg: PPOConfig,
    *,
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
    reduce: Reduce | None = None,
) -> list[EpochStats]:
    """Up to ``cfg.ppo_epochs`` full-batch steps of ``-L_clip + vf_coef * L_V - ent_coef * H``.

    ``extra_loss(policy)``: a term added to every epoch's loss (PPO-ptx: ``ptx_coef * sft_loss``).
    ``reduce``: sums a tensor over ranks under DDP (``mlbook_solutions.ddp.make_reduce``); it makes
    the whitening, the approx-KL and the token-mean losses global, so N ranks reproduce one process
    on the whole batch. Returns one :class:`EpochStats` per epoch that ran (fewer than asked when
    the approx-KL early stop fired). With ``cfg.behaviour_clip`` the ratio, its clip fraction and
    the approx-KL are measured against the proximal policy (the policy when the update starts).
    """
    reduce = reduce or no_reduce
    m = roll["mask"]  # (B, T-1)
    rewards = shaped_rewards(scores, roll["logp_old"], roll["logp_ref"], m, beta)  # (B, T-1)
    advantages, returns = gae(rewards, roll["values_old"], m, cfg.gamma, cfg.lam)  # (B, T-1) each
    if cfg.whiten:  # zero mean, unit std over every response token of the global batch
        advantages = masked_whiten(advantages, m, reduce)  # (B, T-1)
    # Token means over the *global* batch: DDP averages the ranks' gradients, so rank r's local
    # token mean is weighted by its token count relative to the average rank's, n_r / mean_r(n_r).
    n_local = m.sum()
    scale = n_local / global_mean(n_local.reshape(1), reduce=reduce).to(n_local.dtype)
    params = [p for group in opt.param_groups for p in group["params"]]
    history: list[EpochStats] = []
    logp_anchor, weighted = roll["logp_old"], advantages  # what the clip is centred on; A or w * A
    for epoch in range(cfg.ppo_epochs):
        logits = policy(roll["tokens"])  # (B, T, V)
        logp_new = token_log_probs(logits, roll["tokens"]) * m  # (B, T-1)
        if epoch == 0 and cfg.behaviour_clip is not None:  # decoupled: the policy now is pi_prox
            logp_anchor = logp_new.detach()  # (B, T-1)
            behaviour = torch.exp(logp_anchor - roll["logp_old"]).clamp(*cfg.behaviour_clip)
            # w * min(rA, clip(r) A) = min(r wA, clip(r) wA) because w > 0
            weighted = advantages * behaviour  # (B, T-1)
        log_ratio = (logp_new - logp_anchor).detach()  # (B, T-1)
        approx_kl = float(global_mean(log_ratio.exp() - 1 - log_ratio, m, reduce))  # k3 estimator
        if (
            epoch == 0
            and bool(roll.get("on_policy", False))
            and float((log_ratio * m).abs().max()) > 1e-5
        ):
            raise RuntimeError(
                "the first PPO epoch must start at ratio 1: the forward pass is not deterministic"
            )
        if cfg.approx_kl_stop is not None and epoch > 0 and approx_kl > cfg.approx_kl_stop:
            break
        policy_loss, clip_frac = ppo_clip_loss(logp_new, logp_anchor, weighted, m, cfg.clip_eps)
        values = critic(roll["tokens"])[:, :-1]  # (B, T-1)
        v_loss = value_loss(values, roll["values_old"], returns, m, cfg.clip_eps)
        ent = masked_entropy(logits[:, :-1], m)
        loss = scale * (policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent)  # scalar
        extra = math.nan
        if extra_loss is not None:
            term = extra_loss(policy)
            loss = loss + term
            extra = float(term.detach())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        clip_frac = float(global_mean(n_local.new_tensor([clip_frac]), n_local.reshape(1), reduce))
        history.append(
            EpochStats(clip_frac, float(v_loss.detach()), float(ent.detach()), approx_kl, extra)
        )
    return history


@dataclass
class PPOStats:
    """One training step, as ``train_ppo`` logs it."""

    reward: float  # mean sequence score of the step's rollouts
    kl: float  # per-sequence KL estimate to the reference (sum over tokens, mean over samples)
    beta: float  # the beta used for this step's rewards
    response_len: float  # mean response length in tokens
    epochs: list[EpochStats]  # what each PPO epoch of the update measured
    eval: float = math.nan  # train_ppo's evaluate(policy) at the start of the step, if given

    @property
    def clip_frac(self) -> float:
        """Clip fraction of the last epoch that ran."""
        return self.epochs[-1].clip_frac

    @property
    def approx_kl(self) -> float:
        """Old-vs-new policy drift at the start of the last epoch."""
        return self.epochs[-1].approx_kl

    @property
    def value_loss(self) -> float:
        return self.epochs[-1].value_loss

    @property
    def entropy(self) -> float:
        return self.epochs[-1].entropy


def sequence_kl(roll: dict[str, torch.Tensor], reduce: Reduce | None = None) -> float:
    """Per-sequence KL ``mean_i sum_t (logp_old - logp_ref)``, over all ranks with ``reduce``."""
    per_seq = ((roll["logp_old"] - roll["logp_ref"]) * roll["mask"]).sum(dim=1)  # (B,)
    return float(global_mean(per_seq, reduce=reduce or no_reduce))


def train_ppo(
    policy: nn.Module,  # trained
    ref: nn.Module,  # frozen here
    critic: nn.Module,  # trained
    prompts: torch.Tensor,  # (B, P) long
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    eos_id: int,
    cfg: PPOConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    sampler: Callable[[nn.Module], nn.Module] | None = None,
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
    reduce: Reduce | None = None,
    evaluate: Callable[[nn.Module], float] | None = None,
    progress: bool = False,
) -> list[PPOStats]:
    """The outer loop, ``cfg.steps`` times: rollouts -> reward -> PPO update -> (maybe) new beta.

    ``reward_fn(tokens, response_mask) -> (B,)`` scores whole sequences (``response_mask`` is the
    (B, T) mask over tokens). With ``cfg.kl_target`` an :class:`AdaptiveKLController` moves beta.
    ``sampler(policy)`` returns the model that samples this step (default: the policy itself; an
    older copy for asynchronous rollouts). ``extra_loss`` and ``reduce`` go to :func:`ppo_update`.
    ``evaluate(policy) -> float`` is logged as ``PPOStats.eval`` at the start of every step.
    """
    cfg = cfg or PPOConfig()
    reduce = reduce or no_reduce
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([*policy.parameters(), *critic.parameters()], lr=cfg.lr)
    controller = (
        AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.horizon)
        if cfg.kl_target is not None
        else None
    )
    beta, history = cfg.beta, []
    bar = range(cfg.steps)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc="PPO", unit="step")
    for _ in bar:
        evaluated = math.nan
        if evaluate is not None:
            with torch.no_grad():
                evaluated = float(evaluate(policy))
        model = sampler(policy) if sampler is not None else None
        roll = collect_rollouts(
            policy, ref, critic, prompts, cfg.max_new_tokens, eos_id, generator, sampler=model
        )
        scores = reward_fn(roll["tokens"], roll["response_mask"]).float()  # (B,)
        kl = sequence_kl(roll, reduce)
        epochs = ppo_update(
            policy, critic, opt, roll, scores, beta, cfg, extra_loss=extra_loss, reduce=reduce
        )
        reward, length = global_mean(
            torch.stack([scores, roll["mask"].sum(1)]), reduce=reduce
        ).tolist()
        history.append(PPOStats(reward, kl, beta, length, epochs, evaluated))
        if progress:
            bar.set_postfix(reward=f"{reward:.2f}", kl=f"{kl:.2f}", beta=f"{beta:.3f}")
        if controller is not None:  # adapt beta for the next step
            beta = controller.update(kl)
    return history
