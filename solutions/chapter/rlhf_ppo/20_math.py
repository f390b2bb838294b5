# %% [markdown]
# ## 2. The math
#
# ### 2.1 From the RLHF objective to a per-token reward
#
# For a prompt $x$ we want responses the reward model likes, without wandering far from the
# reference model:
#
# $$J(\theta) = \mathbb{E}_{y\sim\pi_\theta(\cdot \mid x)}\left[r_\phi(x,y)\right] - \beta\,\mathrm{KL}\big(\pi_\theta(\cdot \mid x)\,\|\,\pi_{\text{ref}}(\cdot \mid x)\big).$$
#
# A response is generated one token at a time, so its log-probability is a sum over tokens,
# $\log\pi(y|x) = \sum_{t=1}^T \log\pi(a_t \mid s_t)$. Writing the KL as an expectation under the
# policy and using that sum,
#
# $$\mathrm{KL}(\pi_\theta\|\pi_{\text{ref}}) = \mathbb{E}_{y\sim\pi_\theta}\Big[\sum_{t=1}^T \log\pi_\theta(a_t \mid s_t) - \log\pi_{\text{ref}}(a_t \mid s_t)\Big],$$
#
# and both terms of $J$ become one expectation of a sum over the episode. That is exactly an RL
# return with the per-token reward
#
# $$\boxed{R_t = -\beta\left[\log\pi_\theta(a_t \mid s_t) - \log\pi_{\text{ref}}(a_t \mid s_t)\right] + \mathbb 1[t = T]\, r_\phi(x, y)}$$
#
# This is the KL-penalised reward of Ziegler et al. (2019), Stiennon et al. (2020) and InstructGPT
# (Ouyang et al., 2022). Three remarks that matter in code. (i) The log-probs in $R_t$ are those of the policy that
# *sampled* the batch, recorded at rollout time and treated as constants: the KL then shapes the
# reward and its gradient reaches the policy through the surrogate below, not through $R_t$.
# (ii) $T$ is the last *response* token: `<|end|>` when the model stopped, otherwise the last token
# it was allowed to generate; prompt and padding positions get nothing. (iii) Why pay a KL at all?
# The reward model is only trustworthy near the data it was trained on; the reference is a prior
# over fluent text; and with $\beta > 0$ the optimum is a tilt of the reference,
# $\pi^\star \propto \pi_{\text{ref}}\, e^{r/\beta}$, instead of a collapse onto a single
# highest-scoring string.
#
# ### 2.2 Importance ratio and the clipped surrogate
#
# The policy-gradient theorem gives $\nabla J = \mathbb{E}\left[\sum_t A_t \nabla\log\pi_\theta(a_t \mid s_t)\right]$
# for advantages $A_t$. We sample a batch once with $\pi_{\text{old}}$ and want several gradient
# steps on it, so we reweight each token by the ratio
# $r_t(\theta) = \pi_\theta(a_t \mid s_t) / \pi_{\text{old}}(a_t \mid s_t)$:
# $L^{\mathrm{PG}}(\theta) = \mathbb{E}_t[r_t(\theta) A_t]$, whose gradient at
# $\theta = \theta_{\text{old}}$ is the policy gradient above. Left alone, the optimiser would
# inflate $r_t$ without limit wherever $A_t > 0$. PPO (Schulman et al., 2017) takes the pessimistic of two estimates,
#
# $$\boxed{L^{\mathrm{CLIP}}(\theta) = \mathbb{E}_t\Big[\min\big(r_t A_t,\ \operatorname{clip}(r_t, 1-\epsilon, 1+\epsilon)\, A_t\big)\Big]}, \qquad \epsilon = 0.2.$$
#
# * $A_t > 0$: the minimum is $r_t A_t$ up to $r_t = 1+\epsilon$ and the constant $(1+\epsilon)A_t$ beyond: flat, zero gradient.
# * $A_t < 0$: the minimum is $r_t A_t$ down to $r_t = 1-\epsilon$ and the constant $(1-\epsilon)A_t$ below it.
# * Moving the ratio *against* the advantage is never clipped, so a harmful step can always be undone.
#
# The figure below (drawn by `mlbook.figures.plot_clip_objective`) shows the per-token objective
# for both signs; shaded regions are where the gradient is zero.

# %% demo=true
show(
    plot_clip_objective(eps=0.2),
    alt="Two panels of the per-token clipped objective against the ratio r from 0 to 2, epsilon 0.2. For A = +1 the "
    "objective follows r*A up to r = 1.2 and is flat beyond it (shaded: zero gradient). For A = -1 it follows r*A down "
    "to r = 0.8 and is flat below it. On the other side of 1 it stays on the unclipped dashed line r*A.",
)

# %% [markdown]
# **What the clip is not.** Descriptions often call it a trust region. It is weaker than that:
# the clip removes the *incentive* to push a token further, not the possibility. Other tokens'
# gradients move shared weights, so after a few epochs some ratios do end up outside
# $[1-\epsilon, 1+\epsilon]$. That is why implementations also watch the approximate KL between the
# sampling policy and the current one, and stop the epochs early when it passes a threshold;
# `ppo_update` below does both. Schulman (2020) gives three single-sample estimators of that KL,
# and all three are in use. The plain $k_1 = \mathbb{E}_t[-\log r_t]$ is unbiased but can come out
# negative on a batch (OpenRLHF logs it as `ppo_kl`, and the legacy TRL trainer's early stop tests
# it). This chapter and CleanRL use $k_3 = \mathbb{E}_t[r_t - 1 - \log r_t]$, never negative; TRL
# and lm-human-preferences log $k_2 = \tfrac12\mathbb{E}_t[(\log r_t)^2]$ as `approxkl`. $k_2$ and
# $k_3$ agree to second order in $\log r_t$, so they are close while the ratios stay near 1, but
# they are not the same number; §3.6 prints both along the chapter's run. The *clip fraction*, the share of response
# tokens whose ratio has left the band, is the diagnostic to watch. Two definitions circulate: "the
# ratio is outside the band" (used here and in CleanRL) and "the clipped term is the active one",
# i.e. the ratio moved $\epsilon$ in the advantage's direction (TRL's and OpenRLHF's `clipfrac`).
# The second is never larger than the first, and on the chapter's run it is markedly smaller (§3.6
# measures both).
#
# ### 2.3 Advantages (GAE), the value loss and the full loss
#
# With the critic's values $V(s_t)$ and the convention $V(s_{T+1}) = 0$ after the last response token,
#
# $$\delta_t = R_t + \gamma\, V_{t+1} - V_t, \qquad A_t = \sum_{k=0}^{T-t} (\gamma\lambda)^{k}\,\delta_{t+k} = \delta_t + \gamma\lambda\, A_{t+1}.$$
#
# $\lambda$ trades bias (small $\lambda$ leans on the critic) against variance (large $\lambda$ leans
# on the sampled rewards). With $\gamma = \lambda = 1$ the sum telescopes to
# $A_t = \sum_{l\ge0} R_{t+l} - V(s_t)$: advantage plus value is the Monte-Carlo reward-to-go.
# Language-model PPO uses $\gamma = 1$ (no reason to discount inside one response). The
# $\lambda = 0.95$ used here is the default that lm-human-preferences and TRL ship, a convention
# rather than a result: the GAE paper (Schulman et al., 2016) found its best runs with $\lambda$
# anywhere from 0.92 to 0.98 on its control tasks, and OpenRLHF defaults to $\lambda = 1$ (§5
# tabulates the defaults). The critic regresses on the returns
# $G_t = A_t + V(s_t)$ with a clipped loss that keeps the new value within $\epsilon_v$ of the value
# recorded at rollout time:
#
# $$L^V = \tfrac12\max\Big(\big(V_\psi(s_t) - G_t\big)^2,\ \big(\operatorname{clip}(V_\psi(s_t), V_{\text{old}}(s_t) - \epsilon_v, V_{\text{old}}(s_t) + \epsilon_v) - G_t\big)^2\Big).$$
#
# Libraries give the value clip its own setting: `cliprange_value` in lm-human-preferences and TRL
# (0.2, the same as the policy's clip), `value_clip` in OpenRLHF (0.5). This chapter's code uses
# one number for both, $\epsilon_v = \epsilon = 0.2$: `ppo_update` passes its `clip_eps` to
# `value_loss`.
#
# The total loss minimised per epoch is $-L^{\mathrm{CLIP}} + c_v L^V - c_e H[\pi_\theta]$, and
# usually $c_e = 0$ for language models (the KL to the reference already keeps the distribution
# from collapsing). This chapter's $c_v = 0.5$ is CleanRL's default for control tasks; the language
# model codebases weight the critic less, $c_v = 0.1$ in lm-human-preferences, in TRL and in the
# N+ reproduction of Huang et al. (2024), and OpenRLHF gives the critic its own optimiser, so it has
# no $c_v$ at all. Every average runs over **response tokens only**, and each token counts once in
# the batch's mean: a choice, not a law (§5 compares it with a per-sequence mean).
#
# Advantages are *whitened* over the batch's response tokens, $A \leftarrow (A - \bar A)/\mathrm{sd}(A)$.
# Subtracting a constant does not bias an on-policy gradient, and dividing by a constant only
# rescales it. With the clip in play the scale is no longer innocent: it decides how hard each
# epoch pushes, and therefore which tokens reach the clip. Exercise 3 measures this.
#
# ### 2.4 The adaptive KL controller
#
# A fixed $\beta$ gives a KL that depends on the reward model's scale and the stage of training.
# Ziegler et al. (2019) steer $\beta$ toward a target KL $\kappa$ with a proportional controller
# in log space. Their paper writes it with a gain $K_\beta$,
#
# $$\beta_{\text{next}} = \beta\,\big(1 + K_\beta\, e\big) \quad\text{with}\quad e = \operatorname{clip}(\mathrm{KL}/\kappa - 1,\ \pm 0.2) \text{ and } K_\beta = 0.1 .$$
#
# Their released code, lm-human-preferences (`train_policy.py`), sets the gain from the batch
# instead: $K_\beta = n/h$, with $n$ the episodes (samples) in the update and a horizon of
# $h = 10^4$ episodes, so the gain grows with the batch (the cell below computes it). The
# simplified form $\beta \leftarrow \beta(1 + e/h)$ with $h$ counted in *updates* is the case
# $n = 1$; our `AdaptiveKLController.update(kl, n_steps=1)` covers all three. Which KL? Here, and
# in the original code, the per-sequence estimate: sum the log-ratios over a response's tokens, then
# average over the samples of the batch. (OpenRLHF averages per token instead, which changes what
# a target like "6" means by a factor of the response length.) Each update moves $\beta$ by at
# most $\pm 20\,\%$ times the gain.
#
# The controller is this chapter's teaching device, and you will implement it. Most current stacks
# leave it off and keep $\beta$ fixed: TRL's PPO trainer has no target at all (`kl_coef` 0.05), and
# OpenRLHF starts from `init_coef` 0.01 and adapts only when a target is passed (and a comment in
# its v0.11.0 trainer calls the adaptive controller incompatible with its training step). §5
# lists these defaults.

# %% tags=["nbval-check-output"]
paper_gain, lmhp_horizon = 0.1, 10_000  # Ziegler et al. (2019); lm-human-preferences, in episodes
for n in (64, 512):
    print(
        f"{n:>4} episodes per update: lm-human-preferences' gain n/h = {n / lmhp_horizon:.4f} "
        f"(the paper's K_beta = {paper_gain}); largest step of beta: {100 * 0.2 * n / lmhp_horizon:.2f} %"
    )
