"""A catalog of student answers for the graded functions: realistic mistakes and equivalent correct forms.

Each entry is the source of an answer cell, written as a student would write it in the notebook
(the notebook's namespace has ``torch``, ``masked_mean`` and the ``validate_*`` helpers). The
catalog serves two tests: ``test_grading_catalog.py`` runs the graded checks on every entry, and
``test_autograde.py`` pastes a few entries into a notebook and grades it with real nbgrader.

``WRONG[name] = (graded test that must fail, defined symbol, source)``;
``CORRECT[name] = (defined symbol, source)``. ``test_visible_checks.py`` also runs every wrong answer
through the check cells students see: each must be caught there too.
"""

from ppo_checks import CHECKS

_ID = {c.fn.__name__: gid for gid, c in CHECKS.items()}  # grade ids from the one registry
SHAPED, GAE, CLIP = _ID["check_shaped_rewards"], _ID["check_gae"], _ID["check_ppo_clip_loss"]
VALUE, KL, TRAIN = _ID["check_value_loss"], _ID["check_kl_controller"], _ID["check_train_ppo"]
# The answers this catalog writes (the core checks' parameters, less what the training loop is called
# with) and, for each, the graded tests that call it: from the registry, never copied by hand.
ANSWERED = [gid for gid, c in CHECKS.items() if not c.extra and gid != TRAIN]
USES = {
    name: [gid for gid in ANSWERED if name in CHECKS[gid].names]
    for gid in ANSWERED
    for name in CHECKS[gid].names
}

_SHAPED_TEMPLATE = (
    "def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
    "    {kl}\n"
    "    last = last_response_index(response_mask)\n"
    "    rows = torch.arange(scores.shape[0])\n"
    "    rewards = kl.clone()\n"
    "    rewards[rows, {pos}] += scores\n"
    "    return rewards\n"
)


def _shaped(kl="kl = -beta * (logp_policy - logp_ref) * response_mask", pos="last"):
    return _SHAPED_TEMPLATE.format(kl=kl, pos=pos)


_GAE_TEMPLATE = (
    "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
    "    B, L = rewards.shape\n"
    "    adv = torch.zeros_like(rewards)\n"
    "    carry = torch.zeros(B, dtype=rewards.dtype)\n"
    "    nxt = torch.zeros(B, dtype=rewards.dtype)\n"
    "    for t in reversed(range(L)):\n"
    "        m = response_mask[:, t]\n"
    "        delta = rewards[:, t] + gamma * nxt - values[:, t]\n"
    "        carry = {carry}\n"
    "        adv[:, t] = carry\n"
    "        nxt = {nxt}\n"
    "    return adv, {ret}\n"
)


def _gae(carry="m * (delta + gamma * lam * carry)", nxt="m * values[:, t]", ret="adv + values"):
    return _GAE_TEMPLATE.format(carry=carry, nxt=nxt, ret=ret)


_CLIP_TEMPLATE = (
    "def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
    "    ratio = {ratio}\n"
    "    per_token = {per_token}\n"
    "    loss = {reduce}\n"
    "    frac = ((ratio - 1).abs() > clip_eps).float()\n"
    "    return loss, float({frac})\n"
)


def _clip(
    ratio="torch.exp(logp_new - logp_old)",
    per_token="-torch.min(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)",
    reduce="(per_token * response_mask).sum() / response_mask.sum()",
    frac="(frac * response_mask).sum() / response_mask.sum()",
):
    return _CLIP_TEMPLATE.format(ratio=ratio, per_token=per_token, reduce=reduce, frac=frac)


_VALUE_TEMPLATE = (
    "def value_loss(values, old_values, returns, response_mask, clip_eps=0.2):\n"
    "    v_clip = {v_clip}\n"
    "    per_token = {per_token}\n"
    "    return {reduce}\n"
)


def _value(
    v_clip="old_values + (values - old_values).clamp(-clip_eps, clip_eps)",
    per_token="0.5 * torch.max((values - returns) ** 2, (v_clip - returns) ** 2)",
    reduce="(per_token * response_mask).sum() / response_mask.sum()",
):
    return _VALUE_TEMPLATE.format(v_clip=v_clip, per_token=per_token, reduce=reduce)


_KL_TEMPLATE = (
    "class AdaptiveKLController:\n"
    "    def __init__(self, beta, target, horizon=10):\n"
    "        self.beta, self.target, self.horizon = beta, target, horizon\n"
    "\n"
    "    def update(self, kl, n_steps=1):\n"
    "        e = {error}\n"
    "        {assign}\n"
    "        return self.beta\n"
)


def _kl(
    error="min(max(kl / self.target - 1, -0.2), 0.2)",
    assign="self.beta = self.beta * (1 + e * n_steps / self.horizon)",
):
    return _KL_TEMPLATE.format(error=error, assign=assign)


WRONG = {
    # shaped rewards
    "kl_sign_flipped": (
        SHAPED,
        "shaped_rewards",
        _shaped(kl="kl = beta * (logp_policy - logp_ref) * response_mask"),
    ),
    "kl_not_masked": (
        SHAPED,
        "shaped_rewards",
        _shaped(kl="kl = -beta * (logp_policy - logp_ref)"),
    ),
    "score_on_first_response_token": (
        SHAPED,
        "shaped_rewards",
        _shaped(pos="response_mask.argmax(dim=1)"),
    ),
    "score_one_past_the_end": (
        SHAPED,
        "shaped_rewards",
        _shaped(pos="(last + 1).clamp(max=response_mask.shape[1] - 1)"),
    ),
    "score_on_every_response_token": (
        SHAPED,
        "shaped_rewards",
        "def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
        "    return (-beta * (logp_policy - logp_ref) + scores[:, None]) * response_mask\n",
    ),
    "kl_computed_in_place": (
        SHAPED,
        "shaped_rewards",
        _shaped(kl="logp_policy -= logp_ref\n    kl = -beta * logp_policy * response_mask"),
    ),
    "last_index_by_counting": (
        SHAPED,
        "last_response_index",
        "def last_response_index(response_mask):\n    return response_mask.sum(dim=1).long() - 1\n",
    ),
    "last_index_is_first_one": (
        SHAPED,
        "last_response_index",
        "def last_response_index(response_mask):\n    return response_mask.argmax(dim=1)\n",
    ),
    # GAE
    "gae_leaks_past_response_end": (GAE, "gae", _gae(nxt="values[:, t]")),
    "gae_lambda_ignored": (GAE, "gae", _gae(carry="m * (delta + gamma * carry)")),
    "gae_gamma_ignored_in_carry": (GAE, "gae", _gae(carry="m * (delta + lam * carry)")),
    "gae_not_masked": (GAE, "gae", _gae(carry="delta + gamma * lam * carry", nxt="values[:, t]")),
    "gae_returns_without_values": (GAE, "gae", _gae(ret="adv")),
    "gae_reward_to_go_without_baseline": (
        GAE,
        "gae",
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    adv = (rewards * response_mask).flip(1).cumsum(1).flip(1) * response_mask\n"
        "    return adv, adv + values\n",
    ),
    # clipped surrogate
    "clip_applied_to_advantage": (
        CLIP,
        "ppo_clip_loss",
        _clip(
            per_token="-torch.min(ratio * advantages, ratio * advantages.clamp(1 - clip_eps, 1 + clip_eps))"
        ),
    ),
    "clip_unmasked_mean": (CLIP, "ppo_clip_loss", _clip(reduce="per_token.mean()")),
    "clip_optimistic_max": (
        CLIP,
        "ppo_clip_loss",
        _clip(
            per_token="-torch.max(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)"
        ),
    ),
    "clip_sign_flipped": (
        CLIP,
        "ppo_clip_loss",
        _clip(
            per_token="torch.min(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)"
        ),
    ),
    "clip_ratio_not_exponentiated": (CLIP, "ppo_clip_loss", _clip(ratio="1 + logp_new - logp_old")),
    "clip_loss_detached": (
        CLIP,
        "ppo_clip_loss",
        _clip(reduce="((per_token * response_mask).sum() / response_mask.sum()).detach()"),
    ),
    "clip_only_clipped_term": (
        CLIP,
        "ppo_clip_loss",
        _clip(per_token="-ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages"),
    ),
    "clip_fraction_counts_padding": (CLIP, "ppo_clip_loss", _clip(frac="frac.mean()")),
    "clip_fraction_upper_side_only": (
        CLIP,
        "ppo_clip_loss",
        _clip(frac="((ratio > 1 + clip_eps).float() * response_mask).sum() / response_mask.sum()"),
    ),
    "gae_default_lambda_changed": (GAE, "gae", _gae().replace("lam=0.95", "lam=0.9")),
    "clip_mean_over_rows_then_tokens": (
        CLIP,
        "ppo_clip_loss",
        _clip(reduce="((per_token * response_mask).sum(1) / response_mask.sum(1)).mean()"),
    ),
    # value loss
    "value_clip_around_returns": (
        VALUE,
        "value_loss",
        _value(v_clip="returns + (values - returns).clamp(-clip_eps, clip_eps)"),
    ),
    "value_min_instead_of_max": (
        VALUE,
        "value_loss",
        _value(per_token="0.5 * torch.min((values - returns) ** 2, (v_clip - returns) ** 2)"),
    ),
    "value_missing_half": (
        VALUE,
        "value_loss",
        _value(per_token="torch.max((values - returns) ** 2, (v_clip - returns) ** 2)"),
    ),
    "value_unmasked_mean": (VALUE, "value_loss", _value(reduce="per_token.mean()")),
    "value_clip_width_hard_coded": (
        VALUE,
        "value_loss",
        _value(v_clip="old_values + (values - old_values).clamp(-0.2, 0.2)"),
    ),
    "value_no_clip": (VALUE, "value_loss", _value(per_token="0.5 * (values - returns) ** 2")),
    # KL controller
    "controller_without_clip": (KL, "AdaptiveKLController", _kl(error="kl / self.target - 1")),
    "controller_additive": (
        KL,
        "AdaptiveKLController",
        _kl(assign="self.beta = self.beta + e * n_steps / self.horizon"),
    ),
    "controller_ignores_n_steps": (
        KL,
        "AdaptiveKLController",
        _kl(assign="self.beta = self.beta * (1 + e / self.horizon)"),
    ),
    "controller_sign_flipped": (
        KL,
        "AdaptiveKLController",
        _kl(assign="self.beta = self.beta * (1 - e * n_steps / self.horizon)"),
    ),
    "controller_forgets_beta": (
        KL,
        "AdaptiveKLController",
        _kl(assign="return self.beta * (1 + e * n_steps / self.horizon)"),
    ),
}

# Mistakes whose effect shows in training, run through the read-only train_ppo (slower: a few seconds each).
WRONG_IN_TRAINING = {
    "kl_sign_flipped": WRONG["kl_sign_flipped"],
    "no_learning_signal": (
        TRAIN,
        "gae",
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    return torch.zeros_like(rewards), values * response_mask\n",
    ),
}

CORRECT = {
    "shaped_rewards_loop": (
        "shaped_rewards",
        "def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
        "    out = torch.zeros_like(logp_policy)\n"
        "    for b in range(out.shape[0]):\n"
        "        cols = [t for t in range(out.shape[1]) if response_mask[b, t] > 0]\n"
        "        for t in cols:\n"
        "            out[b, t] = -beta * (logp_policy[b, t] - logp_ref[b, t])\n"
        "        out[b, cols[-1]] += scores[b]\n"
        "    return out\n",
    ),
    "shaped_rewards_one_hot": (
        "shaped_rewards",
        "def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
        "    last = last_response_index(response_mask)\n"
        "    one_hot = torch.nn.functional.one_hot(last, response_mask.shape[1]).to(logp_policy.dtype)\n"
        "    return beta * (logp_ref - logp_policy) * response_mask + scores[:, None].to(logp_policy.dtype) * one_hot\n",
    ),
    "last_index_flip_argmax": (
        "last_response_index",
        "def last_response_index(response_mask):\n"
        "    T = response_mask.shape[1]\n"
        "    return T - 1 - response_mask.flip(1).argmax(dim=1)\n",
    ),
    "last_index_python_list": (
        "last_response_index",
        "def last_response_index(response_mask):\n"
        "    return [max(i for i, v in enumerate(row) if v) for row in response_mask.tolist()]\n",
    ),
    "gae_vectorised": (
        "gae",
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    m = response_mask.to(rewards.dtype)\n"
        "    next_v = torch.cat([values[:, 1:] * m[:, 1:], torch.zeros_like(values[:, :1])], dim=1)\n"
        "    delta = (rewards + gamma * next_v - values) * m\n"
        "    L = rewards.shape[1]\n"
        "    idx = torch.arange(L)\n"
        "    power = (idx[None, :] - idx[:, None]).clamp(min=0).to(rewards.dtype)\n"
        "    weight = torch.where(idx[None, :] >= idx[:, None], (gamma * lam) ** power, torch.zeros((), dtype=rewards.dtype))\n"
        "    adv = (delta @ weight.T) * m\n"
        "    return adv, adv + values\n",
    ),
    "gae_float64_inside": (
        "gae",
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    r, v, m = rewards.double(), values.double(), response_mask.double()\n"
        "    adv = torch.zeros_like(r)\n"
        "    a = torch.zeros(r.shape[0], dtype=torch.float64)\n"
        "    for t in range(r.shape[1] - 1, -1, -1):\n"
        "        v_next = v[:, t + 1] * m[:, t + 1] if t + 1 < r.shape[1] else torch.zeros_like(a)\n"
        "        a = (r[:, t] + gamma * v_next - v[:, t] + gamma * lam * a) * m[:, t]\n"
        "        adv[:, t] = a\n"
        "    return adv.to(rewards.dtype), (adv + v).to(rewards.dtype)\n",
    ),
    "clip_max_of_negatives_trl_clipfrac": (
        "ppo_clip_loss",
        "def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
        "    ratio = (logp_new - logp_old).exp()\n"
        "    losses = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps))\n"
        "    loss = masked_mean(losses, response_mask)\n"
        "    clipped_active = -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) > -advantages * ratio\n"
        "    clipfrac = masked_mean(clipped_active.float(), response_mask)\n"
        "    return loss, clipfrac\n",
    ),
    "clip_where_form": (
        "ppo_clip_loss",
        "def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
        "    ratio = torch.exp(logp_new - logp_old)\n"
        "    bound = torch.where(advantages >= 0, torch.clamp(ratio, max=1 + clip_eps), torch.clamp(ratio, min=1 - clip_eps))\n"
        "    per_token = -torch.min(ratio * advantages, bound * advantages)\n"
        "    m = response_mask.bool()\n"
        "    return per_token[m].mean(), ((ratio[m] - 1).abs() > clip_eps).double().mean().item()\n",
    ),
    "value_where_form": (
        "value_loss",
        "def value_loss(values, old_values, returns, response_mask, clip_eps=0.2):\n"
        "    lo, hi = old_values - clip_eps, old_values + clip_eps\n"
        "    v_clip = torch.where(values < lo, lo, torch.where(values > hi, hi, values))\n"
        "    err = torch.maximum(torch.square(values - returns), torch.square(v_clip - returns))\n"
        "    return 0.5 * err[response_mask.bool()].mean()\n",
    ),
    "controller_numpy_clip": (
        "AdaptiveKLController",
        "import numpy as np\n\n\n"
        "class AdaptiveKLController:\n"
        "    def __init__(self, beta, target, horizon=10):\n"
        "        self.beta, self.target, self.horizon = beta, target, horizon\n\n"
        "    def update(self, kl, n_steps=1):\n"
        "        proportional_error = np.clip(kl / self.target - 1, -0.2, 0.2)\n"
        "        mult = 1 + proportional_error * n_steps / self.horizon\n"
        "        self.beta *= mult\n"
        "        return self.beta\n",
    ),
}
