"""Reference PPO-RLHF for a language model (the chapter's §3, solved).

Read top to bottom: shaped rewards (score + per-token KL) -> GAE -> clipped surrogate and clipped
value loss -> KL controller -> rollouts -> one PPO update -> the training loop. Every per-token
tensor is (B, T-1) and aligned with ``token_log_probs``: index t is about token ``tokens[:, t+1]``.

This module is also the single source of the chapter notebook's code: ``mlbook build`` copies
these functions into the notebooks (the five math functions become student stubs; the rest are
read-only cells), so edit the code here, never in a notebook.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from mlbook.posttrain.masks import (
    Reduce,
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
    columns = torch.arange(response_mask.shape[1], device=response_mask.device).expand_as(response_mask)  # (B, T-1)
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
    rewards[rows, last] = rewards[rows, last] + scores.to(rewards.dtype)  # score on the final response token
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

    ``ratio = exp(logp_new - logp_old)``; per token ``min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)``.
    All inputs (B, T-1); only ``logp_new`` carries gradient.

    Returns:
        ``(loss, clip_frac)``: a scalar tensor to minimise, and the fraction (float) of response
        tokens whose ratio lies outside ``[1 - eps, 1 + eps]``.
    """
    validate_per_token(response_mask, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    ratio = torch.exp(logp_new - logp_old)  # (B, T-1)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)  # (B, T-1)
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
            raise ValueError(f"beta, target and horizon must be positive, got {beta}, {target}, {horizon}")
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n_steps: int = 1) -> float:
        """``beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``; returns the new beta."""
        error = min(0.2, max(-0.2, float(kl) / self.target - 1.0))
        self.beta = self.beta * (1.0 + error * n_steps / self.horizon)
        return self.beta


def masked_entropy(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the next-token distribution over response positions: (B, T-1, V), (B, T-1) -> scalar."""
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

    Returns a dict of tensors: ``tokens`` (B, T), ``mask``, ``logp_old``, ``logp_ref``,
    ``values_old`` (each (B, T-1)), and ``on_policy`` (0-d bool: sampler is policy).
    """
    sampler = policy if sampler is None else sampler
    tokens, full_mask, logp_sampled = sample(sampler, prompts, max_new_tokens, eos_id, generator=generator)
    mask = full_mask[:, 1:]  # (B, T-1) aligned with the log-probs of tokens[:, 1:]
    with torch.no_grad():
        logp_old = token_log_probs(sampler(tokens), tokens) * mask  # (B, T-1)
        logp_ref = token_log_probs(ref(tokens), tokens) * mask  # (B, T-1)
        values_old = critic(tokens)[:, :-1]  # (B, T-1) V(s_t) before tokens[:, t+1]
    gap = float((logp_old - logp_sampled).abs().max())
    if gap > 1e-4:
        raise RuntimeError(f"log-probs recomputed on the sampled tokens differ from those at sampling time by {gap:.2e}")
    on_policy = torch.tensor(sampler is policy)
    return dict(tokens=tokens, mask=mask, logp_old=logp_old, logp_ref=logp_ref, values_old=values_old, on_policy=on_policy)


@dataclass
class UpdateStats:
    clip_frac: float  # from the last epoch that ran
    value_loss: float
    entropy: float
    approx_kl: float  # E[r - 1 - log r] between the sampling policy and the policy before the last epoch's step
    epochs: int  # epochs actually run (fewer than asked when the approx-KL early stop fired)
    extra_loss: float = math.nan  # value of the optional extra loss term (e.g. PPO-ptx SFT loss)


def ppo_update(
    policy: nn.Module,  # possibly DDP-wrapped
    critic: nn.Module,  # possibly DDP-wrapped
    opt: torch.optim.Optimizer,  # over policy and critic parameters
    roll: dict[str, torch.Tensor],  # from collect_rollouts
    scores: torch.Tensor,  # (B,) sequence rewards
    beta: float,
    clip_eps: float = 0.2,  # ratio band and value clip width
    ppo_epochs: int = 2,  # full-batch passes over the rollouts
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    whiten: bool = True,
    max_grad_norm: float = 1.0,
    approx_kl_stop: float | None = None,
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
    reduce: Reduce | None = None,
) -> UpdateStats:
    """``ppo_epochs`` full-batch steps of ``-L_clip + vf_coef * L_V - ent_coef * H (+ extra_loss(policy))``.

    ``approx_kl_stop``: skip the remaining epochs once ``E[r - 1 - log r]`` exceeds it.
    ``extra_loss``: a term added to every epoch's loss (PPO-ptx passes ``ptx_coef * sft_loss``).
    ``reduce``: sums a tensor over ranks under DDP (see ``mlbook_solutions.ddp``). It makes the
    advantage whitening, the approx-KL and the token-mean losses global, so N ranks reproduce one
    process on the whole batch. ``None`` means one process.
    """
    reduce = reduce or no_reduce
    m = roll["mask"]  # (B, T-1)
    rewards = shaped_rewards(scores, roll["logp_old"], roll["logp_ref"], m, beta)  # (B, T-1)
    advantages, returns = gae(rewards, roll["values_old"], m)  # (B, T-1) each
    if whiten:
        advantages = masked_whiten(advantages, m, reduce)  # (B, T-1) zero mean, unit std over all response tokens
    # Token-mean losses over the *global* batch: rank r's mean is rescaled by n_r * world / n_total,
    # because DDP averages (divides by world) the per-rank gradients.
    n_local = m.sum()
    n_total, world = reduce(torch.stack([n_local, torch.ones_like(n_local)])).unbind()
    scale = n_local * world / n_total.clamp(min=1.0)
    params = [p for group in opt.param_groups for p in group["params"]]
    epochs_run, approx_kl, extra = 0, 0.0, math.nan
    for epoch in range(ppo_epochs):
        logits = policy(roll["tokens"])  # (B, T, V)
        logp_new = token_log_probs(logits, roll["tokens"]) * m  # (B, T-1)
        log_ratio = (logp_new - roll["logp_old"]).detach()  # (B, T-1)
        approx_kl = float(reduce(torch.stack([((log_ratio.exp() - 1 - log_ratio) * m).sum(), n_local]))[0] / n_total)
        if epoch == 0 and bool(roll.get("on_policy", False)) and float((log_ratio * m).abs().max()) > 1e-5:
            raise RuntimeError("the first PPO epoch must start at ratio 1: the policy's forward is not deterministic")
        if approx_kl_stop is not None and epoch > 0 and approx_kl > approx_kl_stop:
            break
        policy_loss, clip_frac = ppo_clip_loss(logp_new, roll["logp_old"], advantages, m, clip_eps)
        values = critic(roll["tokens"])[:, :-1]  # (B, T-1)
        v_loss = value_loss(values, roll["values_old"], returns, m, clip_eps)
        ent = masked_entropy(logits[:, :-1], m)
        loss = scale * (policy_loss + vf_coef * v_loss - ent_coef * ent)  # scalar
        if extra_loss is not None:
            term = extra_loss(policy)
            loss = loss + term
            extra = float(term.detach())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        epochs_run += 1
    clip_frac = float(reduce(n_local.new_tensor([clip_frac * float(n_local)]))[0] / float(n_total))
    return UpdateStats(clip_frac, float(v_loss.detach()), float(ent.detach()), approx_kl, epochs_run, extra)


@dataclass
class PPOStats:
    reward: float  # mean sequence score of the step's rollouts
    kl: float  # per-sequence KL estimate to the reference (sum over tokens, mean over samples)
    clip_frac: float  # share of response tokens outside the ratio band (last epoch)
    value_loss: float  # clipped critic loss (last epoch)
    entropy: float  # mean next-token entropy over response positions
    beta: float  # the beta used for this step's rewards
    approx_kl: float  # old-vs-new policy drift within the step
    response_len: float
    extra_loss: float = math.nan


def sequence_kl(roll: dict[str, torch.Tensor], reduce: Reduce | None = None) -> float:
    """Per-sequence KL estimate ``mean_i sum_t (logp_old - logp_ref)``, over all ranks when ``reduce`` is given."""
    per_seq = ((roll["logp_old"] - roll["logp_ref"]) * roll["mask"]).sum(dim=1)  # (B,)
    total, count = (reduce or no_reduce)(torch.stack([per_seq.sum(), per_seq.new_tensor(float(len(per_seq)))]))
    return float(total / count)


def train_ppo(
    policy: nn.Module,  # trained
    ref: nn.Module,  # frozen here
    critic: nn.Module,  # trained
    prompts: torch.Tensor,  # (B, P) long
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    eos_id: int,
    steps: int = 30,  # PPO iterations (rollout + update)
    max_new_tokens: int = 8,
    beta: float = 0.05,  # initial (or fixed) KL coefficient
    kl_target: float | None = None,  # per-sequence KL target; None keeps beta fixed
    lr: float = 1e-3,
    clip_eps: float = 0.2,
    ppo_epochs: int = 2,
    horizon: float = 10,
    generator: torch.Generator | None = None,
    stale_sampler: bool = False,
    progress: bool = False,
    reduce: Reduce | None = None,
    **update_kwargs,
) -> list[PPOStats]:
    """The outer loop, ``steps`` times: rollouts -> reward -> one PPO update -> (maybe) new beta.

    ``reward_fn(tokens, response_mask) -> (B,)`` scores whole sequences (``response_mask`` is the
    (B, T) mask over tokens). With ``kl_target`` an :class:`AdaptiveKLController` (horizon in
    updates, ``n_steps=1``) moves ``beta``; otherwise ``beta`` stays fixed. ``stale_sampler``
    samples each step with the policy as it was one update earlier (asynchronous rollouts).
    Extra keyword arguments go to :func:`ppo_update`.
    """
    reduce = reduce or no_reduce
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([*policy.parameters(), *critic.parameters()], lr=lr)
    controller = AdaptiveKLController(beta, kl_target, horizon) if kl_target is not None else None
    previous = copy.deepcopy(policy) if stale_sampler else None
    history: list[PPOStats] = []
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc="PPO", unit="step")
    for _ in bar:
        roll = collect_rollouts(policy, ref, critic, prompts, max_new_tokens, eos_id, generator, sampler=previous)
        full_mask = torch.cat([torch.zeros_like(roll["mask"][:, :1]), roll["mask"]], dim=1)  # (B, T)
        scores = reward_fn(roll["tokens"], full_mask).float()  # (B,)
        kl = sequence_kl(roll, reduce)
        if previous is not None:
            previous.load_state_dict(policy.state_dict())  # next step samples with the weights before this update
        upd = ppo_update(policy, critic, opt, roll, scores, beta, clip_eps, ppo_epochs, reduce=reduce, **update_kwargs)
        reward, length = reduce(torch.stack([scores.sum(), roll["mask"].sum()])).tolist()
        n = len(scores) * float(reduce(scores.new_ones(())))  # sequences over all ranks
        history.append(
            PPOStats(reward / n, kl, upd.clip_frac, upd.value_loss, upd.entropy, beta, upd.approx_kl, length / n, upd.extra_loss)
        )
        if progress:
            bar.set_postfix(reward=f"{reward / n:.2f}", kl=f"{kl:.2f}", beta=f"{beta:.3f}")
        if controller is not None:  # adapt beta for the next step
            beta = controller.update(kl)
    return history
