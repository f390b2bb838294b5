# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "ba615995ac71dad7d8be621a1783c93a", "grade": false, "grade_id": "00_intro-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # RLHF with PPO
#
# Proximal Policy Optimization is the algorithm behind the first generation of instruction-tuned
# chat models, and it remains the yardstick later methods (DPO, GRPO) are measured against. In this
# chapter you will write its six load-bearing functions yourself and train a tiny language model
# with them on your laptop's CPU:
#
# | section | what you do |
# |---|---|
# | §1 Intuition | follow one four-token response through the reward computation |
# | §2 The math | the objective, the per-token KL reward, the clipped surrogate, GAE, the KL controller |
# | §3 Implementation | fill in `last_response_index`, `shaped_rewards`, `gae`, `ppo_clip_loss`, `value_loss`, `AdaptiveKLController.update`; then train; then train a reward model from preferences and watch PPO over-optimise it (§3.7–3.8) |
# | §4 Systems view | memory of the four models, where the time goes, how runs fail; RLOO and GRPO measured against the critic (§4.5) |
# | §5 In production | what InstructGPT, Llama 2, Constitutional AI and Llama 3 did; the recipes that replaced them; the libraries' defaults and the knobs of 2025–26 long-response training |
# | §6 Interview questions | answers hidden until you click |
# | §7 Exercises ★ to ★★★ | extend the code and measure the claims |
# | References | the papers and code the prose cites by author and year |

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "cda8abc1c0ad91825cda89a91eb53499", "grade": false, "grade_id": "00_intro-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["student-instructions", "self-paced"]
# **How to work through it.** Work in your own copy of this notebook, never in the checkout's
# `chapters/` folder (commands there regenerate it): `mlbook start` copies it to `~/rlhf-ppo-work/`,
# where nothing but you ever writes (a course hands you your copy). Run the cells from the top. Each
# cell that says `raise NotImplementedError` is yours: replace that line with your implementation.
# Right after each of your functions a *check* cell runs it on a small example and prints ✓ or tells
# you what is off. The graded cells (marked "Graded") run more thorough hidden tests when the
# notebook is graded; they accept any correct implementation (loops or vectorised, float32 or
# float64). The checks are built to catch the common mistakes those tests punish, but the hidden
# tests probe more cases. Before you hand in, the cell under "Check your work" at the end runs every
# check again in one summary; with the full checkout it also prints the command that grades your
# saved notebook the way the course will, hidden tests included. Read-only cells hold the code you
# only need to read; edits to them are undone at grading time.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "329a8405556b673aaa0007d1d27c4b18", "grade": false, "grade_id": "00_intro-3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Conventions used everywhere below.** A batch of sequences is a `(B, T)` tensor of token ids:
# prompt, then response, then padding. The log-prob of every *next* token is a `(B, T-1)` tensor
# whose column `t` scores `tokens[:, t+1]`, and every per-token tensor (rewards, values,
# advantages, the response mask) uses that same `(B, T-1)` alignment.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "fabd0bca2000842ea3998c64888e333c", "grade": false, "grade_id": "00_intro-4", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
import copy
import dataclasses
import math
import os
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from mlbook.figures import draw_pipeline, plot_clip_objective
from mlbook.plotting import plot_gae_trace, plot_response_shape, plot_training_curves, show
from mlbook.posttrain.toy_lm import (
    BOS_ID,
    END_ID,
    GOOD_ID,
    PAD_ID,
    VOCAB,
    TinyCausalLM,
    TinyCritic,
    build_models,
    decode,
    good_count_reward,
    make_prompts,
)
from mlbook.tables import show_table

torch.set_num_threads(1)  # the toy's tensors are tiny: extra threads only add contention
print(f"torch {torch.__version__}; toy vocabulary of {len(VOCAB)} words: {' '.join(VOCAB)}")

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "bd296e427973b591bd07b744fc75bdfc", "grade": false, "grade_id": "00_intro-5", "locked": true, "schema_version": 3, "solution": false, "task": false}
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

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "a55460f3c90e697d4a38ee97b5fab9c0", "grade": false, "grade_id": "10_intuition-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. Intuition: one response, followed through the reward
#
# In RLHF the language model is the *policy*. Every generated token is an **action** $a_t$; the
# **state** $s_t$ is the prompt plus everything generated so far; one response is one **episode**.
# A reward model reads the finished response and returns a single number $r_\phi(x, y)$. On top of
# that, each token pays (or earns back) a small fee for drifting away from a frozen **reference**
# model, usually the supervised fine-tuned model we started from.
#
# Here is one response of four tokens, the last being `<|end|>`. The policy and the reference
# assigned these log-probabilities to the tokens that were actually sampled; the reward model gave
# the whole response 1.5, and the KL coefficient is $\beta = 0.1$. The cell computes the per-token
# reward $R_t = -\beta(\log\pi_\theta - \log\pi_{\text{ref}}) + \mathbb 1[t = T]\, r_\phi$.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "221bc358adf6c20a90037b8d8b90f11c", "grade": false, "grade_id": "10_intuition-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
example = dict(
    logp_policy=torch.tensor([-1.0, -0.5, -2.0, -0.1]),
    logp_ref=torch.tensor([-1.2, -0.5, -1.0, -0.1]),
    score=1.5,
    beta=0.1,
)
kl_term = -example["beta"] * (example["logp_policy"] - example["logp_ref"])  # (4,)
score_term = torch.tensor(
    [0.0, 0.0, 0.0, example["score"]]
)  # the score arrives on the final token only
R = kl_term + score_term
rows = [
    f"| {t + 1} | {lp:+.1f} | {lr:+.1f} | {k:+.2f} | {s:.1f} | **{r:+.2f}** |"
    for t, (lp, lr, k, s, r) in enumerate(
        zip(example["logp_policy"], example["logp_ref"], kl_term, score_term, R, strict=True)
    )
]
display(
    Markdown(
        "\n".join(
            [
                "| $t$ | $\\log\\pi_\\theta$ | $\\log\\pi_{\\text{ref}}$ | KL term | score | $R_t$ |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
        )
    )
)
print(f"return of the episode: sum R_t = {float(R.sum()):.2f}")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3e9ebd168d4e71d58b7190812db1338c", "grade": false, "grade_id": "10_intuition-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Read the table row by row. The first token is *more* likely under the policy than under the
# reference, so it pays a fee; the third is *less* likely, so the estimator hands back a small
# refund. A single-sample estimate of the KL can be negative on individual tokens; only its
# expectation under the policy is guaranteed non-negative (a finite batch's mean can dip below zero). The 1.5 shows up only on
# the last token: deciding how much of it tokens 1–3 deserve is the job of the **critic** $V(s_t)$,
# which predicts the reward still to come from each prefix, and of **GAE**, which turns "what
# happened minus what was predicted" into a per-token advantage.
#
# The update then asks, token by token, how much more likely the current policy has made that
# token than the policy that sampled it (the ratio $r_t$), and multiplies by the advantage. Once a
# token with positive advantage has had its probability pushed up by more than a factor
# $1 + \epsilon$, PPO's clip stops pushing it for this batch.
#
# One iteration of the whole loop, with the four models involved:

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "d84a97de09fb98ad999513d4f217f2e4", "grade": false, "grade_id": "10_intuition-3", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
show(
    draw_pipeline(),
    alt="Diagram of one PPO-RLHF iteration. Prompts go to the trained policy, which samples responses; the frozen "
    "reward model scores them, the frozen reference gives per-token log-probs for the KL fee, and the trained critic "
    "gives a value per token. Score and KL fee form the shaped reward, GAE turns rewards and values into advantages "
    "and returns, and the clipped PPO update sends new weights back to the policy and the critic.",
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "b1265fc52f0c1274e99976ce072f08de", "grade": false, "grade_id": "20_math-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
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

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "02843d7092efd6a92ff4402c3cf4018d", "grade": false, "grade_id": "20_math-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
show(
    plot_clip_objective(eps=0.2),
    alt="Two panels of the per-token clipped objective against the ratio r from 0 to 2, epsilon 0.2. For A = +1 the "
    "objective follows r*A up to r = 1.2 and is flat beyond it (shaded: zero gradient). For A = -1 it follows r*A down "
    "to r = 0.8 and is flat below it. On the other side of 1 it stays on the unclipped dashed line r*A.",
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "b55f1fa495212661bcb183eb6de6e812", "grade": false, "grade_id": "20_math-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
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

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "0e2b71c86b3dc41216d22aaeebb29589", "grade": false, "grade_id": "20_math-3", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
paper_gain, lmhp_horizon = 0.1, 10_000  # Ziegler et al. (2019); lm-human-preferences, in episodes
for n in (64, 512):
    print(
        f"{n:>4} episodes per update: lm-human-preferences' gain n/h = {n / lmhp_horizon:.4f} "
        f"(the paper's K_beta = {paper_gain}); largest step of beta: {100 * 0.2 * n / lmhp_horizon:.2f} %"
    )


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "f38cdde49cad29192956956785d33e43", "grade": false, "grade_id": "30_implementation-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Implementation
#
# Five functions and one method carry the math of §2; you write them. Everything else (sampling,
# the critic, the update loop) is given in read-only cells and calls *your* functions, so the
# training run at the end of this section is powered by your code.
#
# Every function below validates its inputs first (`validate_per_token`, `validate_mask`, ...,
# from `mlbook.posttrain.masks`): a wrong shape, a mask that is not 0/1, an empty response or a NaN
# raises an error that says which argument is wrong. Those lines are given; keep them.
# `masked_mean(x, mask)` (mean over positions where `mask == 1`) is imported for you.
#
# ### 3.1 Shaped rewards
#
# First find, for each row, the column of the last response token: that is where the sequence
# score lands. Prompts have different lengths and responses end at different columns, so counting
# the ones in a row is not enough.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "2d79509fb1184a28f05c62c7ad131640", "grade": false, "grade_id": "last_response_index", "locked": false, "schema_version": 3, "solution": true, "task": false}
def last_response_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last response token in each row: (B, T-1) -> (B,) long.

    That is where the sequence score lands: the ``<|end|>`` token if the model stopped, otherwise
    the last token it generated. Rows must have at least one response token.
    """
    validate_mask(response_mask)
    validate_has_response(response_mask)
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false nbgrader={"cell_type": "code", "checksum": "cce85f150b4a8f0ea92d9ecc7fa28a58", "grade": false, "grade_id": "shaped_rewards", "locked": false, "schema_version": 3, "solution": true, "task": false}
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
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "bfb26a9e31abfc1445c42fb27e7f2d87", "grade": false, "grade_id": "30_implementation-3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Check: the §1 example, then a ragged batch in which the policy's log-prob exceeds the reference's
# by 1 nat at *every* column, prompt and padding included: only response tokens may pay the fee,
# the score must land on the right column, and your function must leave its inputs untouched.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "a719fd0a5ca49ce0d779468daee4e0f5", "grade": false, "grade_id": "30_implementation-4", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
r = shaped_rewards(
    torch.tensor([1.5]),
    torch.tensor([[-1.0, -0.5, -2.0, -0.1]]),
    torch.tensor([[-1.2, -0.5, -1.0, -0.1]]),
    torch.ones(1, 4),
    beta=0.1,
)
print("R =", [round(v, 4) + 0.0 for v in r[0].tolist()])
assert torch.allclose(r, torch.tensor([[-0.02, 0.0, 0.10, 1.50]]), atol=1e-6), (
    "expected (-0.02, 0, +0.10, +1.50), the §1 table"
)
ragged = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.float)
idx = last_response_index(ragged)
assert [int(i) for i in idx] == [3, 4], f"last response index should be [3, 4], got {idx}"
logp_pol, logp_ref = (
    torch.full((2, 5), -1.0),
    torch.full((2, 5), -2.0),
)  # log-ratio +1 on every column
r = shaped_rewards(torch.tensor([2.0, 3.0]), logp_pol, logp_ref, ragged, beta=0.1)
assert torch.equal(logp_pol, torch.full((2, 5), -1.0)), (
    "shaped_rewards modified logp_policy in place: compute a new tensor"
)
assert (r[ragged == 0] == 0).all(), (
    f"prompt and padding positions must get nothing, not even the KL fee (mask it):\n{r}"
)
expected = -0.1 * ragged
expected[0, 3], expected[1, 4] = expected[0, 3] + 2.0, expected[1, 4] + 3.0
assert torch.allclose(r, expected, atol=1e-6), (
    f"expected -0.1 on response tokens plus the score on the last one:\n{r}"
)
print(
    "✓ shaped_rewards reproduces §1, charges the fee on response tokens only, and places scores on the last one"
)


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "b53ba20972943249bfac6c8de569fe49", "grade": true, "grade_id": "test_shaped_rewards_places_score_and_kl", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (2 points): hidden tests compare `last_response_index` and `shaped_rewards` with a
# position-by-position computation on ragged batches (float32 and float64).

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "e9b589804b4a042c62d7486ad9020240", "grade": false, "grade_id": "30_implementation-6", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.2 Generalised advantage estimation
#
# Walk backwards over the columns. Two details decide correctness: the value *after* the last
# response token is 0 (the critic's prediction on padding must not leak in), and positions outside
# the response carry no advantage.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "9ac190e592ecd646055c52b1fc063643", "grade": false, "grade_id": "gae", "locked": false, "schema_version": 3, "solution": true, "task": false}
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
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "ea405d83ea287b7705a4a38eee154feb", "grade": false, "grade_id": "30_implementation-8", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Check: with $\gamma = \lambda = 1$, advantages plus values must equal the reward-to-go on every
# response token, including a row that ends in padding.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "9b20674e56a73764f42166032863ba02", "grade": false, "grade_id": "30_implementation-9", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float)
rewards = torch.tensor([[0.0, 0.1, -0.2, 1.0, 0.0, 0.0], [0.0, 0.0, 0.3, 0.0, -0.1, 2.0]])
values = torch.tensor(
    [[9.0, 0.5, 0.2, 0.8, 9.0, 9.0], [9.0, 9.0, 1.0, 1.1, 1.2, 1.5]]
)  # 9.0 = junk off the response
adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
reward_to_go = rewards.flip(1).cumsum(1).flip(1) * mask
print(
    "advantages + values:",
    [[round(v, 4) + 0.0 for v in row] for row in ((adv + values) * mask).tolist()],
)
assert torch.allclose((adv + values) * mask, reward_to_go, atol=1e-6), (
    "with gamma = lambda = 1, A + V must be the reward-to-go; check that the value after the last "
    "response token counts as 0, so the padding values (9.0 here) never leak into the advantages"
)
assert torch.allclose(ret * mask, (adv + values) * mask, atol=1e-6), (
    "the second output must be the returns G = A + V"
)
adv95, _ = gae(rewards, values, mask, gamma=1.0, lam=0.95)
assert not torch.allclose(adv95 * mask, adv * mask), "lambda = 0.95 should change the advantages"
assert torch.allclose(gae(rewards, values, mask)[0], adv95), (
    "the defaults should be gamma = 1, lambda = 0.95 (§2.3)"
)
# Zero values on a 3-token response (then one padding column with a junk value) and a reward of 1 at its end:
# A_t = (gamma * lambda)^(T - t) on the response, so both factors must discount and the junk must not leak in.
one, v_pad, m_pad = (
    torch.tensor([[0.0, 0.0, 1.0, 0.0]]),
    torch.tensor([[0.0, 0.0, 0.0, 9.0]]),
    torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
)
for g, lam in ((0.5, 1.0), (1.0, 0.5)):
    a = gae(one, v_pad, m_pad, gamma=g, lam=lam)[0][:, :3]
    assert torch.allclose(a, torch.tensor([[0.25, 0.5, 1.0]])), (
        f"gamma={g}, lambda={lam}: expected A = (0.25, 0.5, 1), got {a.tolist()}; check that the "
        "value after the last response token counts as 0 (padding values, 9.0 here, must not leak "
        "in) and that gamma * lambda multiplies the carried advantage"
    )
print(
    "✓ gae gives Monte-Carlo returns at lambda = 1, discounts by gamma * lambda and ignores padding"
)


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "774846a2aea5a94389cda7b0933120ca", "grade": true, "grade_id": "test_gae_matches_brute_force_and_mc_return", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (2 points): hidden tests compare `gae` with the explicit sum over (gamma*lambda)^l delta
# for several (gamma, lambda), and with the Monte-Carlo return at lambda = 1.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "9ae40296e8878f60a536c64984f1a844", "grade": false, "grade_id": "30_implementation-11", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.3 The clipped surrogate and the clipped value loss
#
# Compute the ratio in log space (`exp(logp_new - logp_old)`), take the pessimistic minimum, and
# average over response tokens. Return the clip fraction as a Python float.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "d459cb16211a309abca22628b615d78e", "grade": false, "grade_id": "ppo_clip_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
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
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "c93fccb7ce73c62a8835feaf50d22576", "grade": false, "grade_id": "30_implementation-13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Check: at ratio 1 the loss is $-\bar A$ and its gradient is the vanilla policy gradient. Then a
# ragged batch of two rows in which three tokens have moved: one with $A > 0$ pushed past
# $1+\epsilon$ and one with $A < 0$ pushed below $1-\epsilon$ (both clipped: zero gradient), and one
# with $A > 0$ whose ratio fell to $e^{-0.5}$, the wrong way, which is never clipped.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "0b757be055f8aa5e016c4ac4ce8b6564", "grade": false, "grade_id": "30_implementation-14", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
logp_old = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
adv = torch.tensor([[1.0, -2.0, 0.5, 7.0]])
m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
logp_new = logp_old.clone().requires_grad_(True)
loss, frac = ppo_clip_loss(logp_new, logp_old, adv, m, 0.2)
assert isinstance(loss, torch.Tensor) and loss.requires_grad, (
    "the loss must be a tensor that carries gradient to logp_new"
)
loss.backward()
print(
    f"loss at ratio 1 = {float(loss.detach()):.4f}, gradient = {[round(g, 4) + 0.0 for g in logp_new.grad[0].tolist()]}, clip fraction = {float(frac):.3f}"
)
assert abs(float(loss.detach()) - 0.5 / 3) < 1e-6, (
    f"at ratio 1 the loss must be -mean(A) over response tokens = {0.5 / 3:.4f}"
)
assert torch.allclose(logp_new.grad, -adv * m / 3), (
    "at ratio 1 the gradient must be -A / (number of response tokens)"
)

old2 = torch.full((2, 4), -1.0)
adv2 = torch.tensor([[1.0, -1.0, 1.0, 5.0], [2.0, 5.0, 5.0, 5.0]])
m2 = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
moved = torch.tensor(
    [[0.5, -0.5, -0.5, 3.0], [0.0, 3.0, 3.0, 3.0]]
)  # log-ratios; padding moved far, it must not count
new2 = (old2 + moved).requires_grad_(True)
loss, frac = ppo_clip_loss(new2, old2, adv2, m2, 0.2)
loss.backward()
per_token = [-1.2, 0.8, -math.exp(-0.5), -2.0]  # -min(r A, clip(r) A) for the four response tokens
print(
    f"moved batch: loss = {float(loss.detach()):.4f} (expected {sum(per_token) / 4:.4f}), clip fraction = {float(frac):.3f}"
)
assert abs(float(loss.detach()) - sum(per_token) / 4) < 1e-5, (
    "loss must be -mean over all response tokens of min(r*A, clip(r, 1-eps, 1+eps)*A), r = exp(logp_new - logp_old)"
)
g = new2.grad
assert g[0, 0] == 0 and g[0, 1] == 0, (
    f"tokens already moved eps the way A wants must get zero gradient, got {g[0, :2].tolist()}"
)
assert abs(float(g[0, 2]) + math.exp(-0.5) / 4) < 1e-6, (
    "a token that moved against its advantage is unclipped: gradient -A*r/N"
)
assert abs(float(frac) - 3 / 4) < 1e-6 or abs(float(frac) - 2 / 4) < 1e-6, (
    f"clip fraction: 3 of the 4 response tokens have a ratio outside [0.8, 1.2] (2 if you count only those clipped in "
    f"the advantage's direction, as TRL does); got {float(frac):.3f}: count both sides, and never padding"
)
print(
    "✓ ppo_clip_loss: vanilla gradient at ratio 1, zero gradient once clipped, token mean over response tokens"
)


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "4c354c747d97076699c6de0acc517cb9", "grade": true, "grade_id": "test_ppo_clip_loss_gradient_and_clipping", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (2 points): hidden tests check the value against a per-token loop, the gradient at ratio 1,
# the zero gradient in each clipped region, the unclipped wrong-way cases and padding invariance.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "175c2bb2c9d1ef1d5265578bad3ec07f", "grade": false, "grade_id": "value_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
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
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "68927c3ac9f172fc43a5951b6961d95c", "grade": false, "grade_id": "30_implementation-17", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
v_old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
ret = torch.tensor([[1.0, 1.0, -1.0, 5.0]])
v_new = torch.tensor([[0.1, 0.5, 0.5, 0.0]])
m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the fourth column is padding
vl = value_loss(v_new, v_old, ret, m)
# token 1: inside the clip, 0.5*0.81; token 2: clipped to 0.2 is worse (0.64 > 0.25); token 3: unclipped is worse (2.25)
expected = 0.5 * (0.81 + 0.64 + 2.25) / 3
print(f"value loss = {float(vl):.4f} (expected {expected:.4f})")
assert abs(float(vl) - expected) < 1e-6, (
    "value loss: 0.5 * max(unclipped, clipped-around-V_old) squared error, mean over response tokens"
)
wide = value_loss(v_new, v_old, ret, m, clip_eps=0.5)  # token 2 is now inside the clip: 0.25
assert abs(float(wide) - 0.5 * (0.81 + 0.25 + 2.25) / 3) < 1e-6, (
    "value_loss must clip at its clip_eps argument, not at 0.2"
)
print("✓ value_loss takes the worse of the clipped and unclipped errors")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "83aa52085fc03a4d454129a8a3c2d9c2", "grade": true, "grade_id": "test_value_loss_clipping", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (1 point): hidden tests compare value and gradient with a per-token computation for two clip widths.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "bb01432b26fbfec2e6ab82245012c023", "grade": false, "grade_id": "30_implementation-19", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.4 The KL controller
#
# Only `update` is yours; remember the clip of the relative error to ±0.2 and the `n_steps / horizon` scaling.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "43ffaf1e4f755ed331b8f993326f3ffd", "grade": false, "grade_id": "AdaptiveKLController", "locked": false, "schema_version": 3, "solution": true, "task": false}
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
        # YOUR CODE HERE
        raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "1a1716b7e9f221667a3bbf38af3ca203", "grade": false, "grade_id": "30_implementation-21", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
ctl = AdaptiveKLController(beta=0.1, target=6.0, horizon=10)
print(f"KL 12 (twice the target) -> beta {ctl.update(12.0):.4f}")
assert abs(ctl.beta - 0.1 * 1.02) < 1e-12, (
    "a KL far above target raises beta by at most 20 % / horizon, stored in self.beta"
)
ctl = AdaptiveKLController(beta=0.1, target=6.0, horizon=10)
assert abs(ctl.update(5.4) - 0.1 * 0.99) < 1e-12, "KL 10 % under target lowers beta by 1 %"
ctl = AdaptiveKLController(beta=0.1, target=6.0, horizon=10_000)  # horizon counted in samples
assert abs(ctl.update(12.0, n_steps=500) - 0.1 * 1.01) < 1e-12, (
    "500 samples of a 10,000-sample horizon: step 0.2 * 500 / 10,000"
)
print("✓ AdaptiveKLController.update")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "fd981b299b43b1d7e622442f84f0d89d", "grade": true, "grade_id": "test_kl_controller_moves_beta_toward_target", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (1 point): hidden tests check single updates on both sides of the target, the n_steps form
# and a closed loop in which beta must converge toward the target.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "e1bef580e47cbb560f52c7a5b66ae5c2", "grade": false, "grade_id": "30_implementation-23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.5 Rollouts, the update and the training loop (read only)
#
# `collect_rollouts` is the four-model forward: the policy samples, then the sampling policy, the
# reference and the critic each score the finished sequences once. It also compares the
# log-probs recomputed on the sampled tokens with those recorded while sampling: a mismatch
# (dropout left on, a temperature used in one place only, misaligned padding) is a classic
# production bug that silently biases every ratio, so here it raises. For the same reason
# `ppo_update` asserts that its first epoch starts at ratio 1 when the batch is on-policy.
#
# Every hyperparameter of a run lives in one place, `PPOConfig`, with a line on each field.
# `ppo_update` turns a batch into shaped rewards, advantages (whitened over response tokens), and
# `ppo_epochs` full-batch steps of the total loss, stopping early if the approximate KL exceeds
# `approx_kl_stop`; it returns what each epoch measured (`EpochStats`), so you can watch the ratio
# drift from epoch to epoch. Three arguments serve later parts of the chapter: `extra_loss` adds a
# term to every epoch's loss (exercise 4's SFT anchor), `sampler` chooses the model that samples
# (stale rollouts, exercise 5), and `reduce` sums statistics over processes (the DDP appendix). One
# field does too: `behaviour_clip` switches the update to the decoupled form for stale samples (§4.2).

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "64abfcd505caea927e2d8a96a91852d2", "grade": false, "grade_id": "30_implementation-24", "locked": true, "schema_version": 3, "solution": false, "task": false}
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


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "fe3f0b30481697e5b51442d7f2738aad", "grade": false, "grade_id": "30_implementation-25", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.6 Training the toy model
#
# The task: the reward is the number of `good` tokens in the response; the reference is the
# untrained toy model, whose next-token distribution is nearly uniform. The policy starts as a copy
# of it. An adaptive controller aims the KL at a target of 3 nats per sequence.
#
# The run also keeps a log for the figures after it, through two hooks and without changing a
# single number: the reward function sees every step's rollouts before the update, and
# `extra_loss`, called at the start of every epoch, looks at the policy and adds a zero to the loss.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "747c59f8c2ab3615f2bbfe42f70c639f", "grade": false, "grade_id": "30_implementation-26", "locked": true, "schema_version": 3, "solution": false, "task": false}
class RunLog:
    """Per step: the sampled tokens, the response mask, the critic's values and the reference's log-probs at
    rollout time, and the policy's log-probs at the start of every epoch (epoch 0 = log pi_old)."""

    def __init__(self, critic, ref):
        self.critic, self.ref, self.steps = critic, ref, []

    def reward(self, tokens, full_mask):  # (B, T), (B, T) -> (B,): the reward model, watched
        self.steps.append(dict(tokens=tokens, mask=full_mask[:, 1:], logp=[]))
        return good_count_reward(tokens, full_mask)

    def __call__(self, policy):  # used as extra_loss: records, then adds nothing
        step = self.steps[-1]
        with torch.no_grad():
            step["logp"].append(
                token_log_probs(policy(step["tokens"]), step["tokens"]) * step["mask"]
            )  # (B, T-1)
            if len(step["logp"]) == 1:  # before the first optimiser step: the critic is still V_old
                step["values"] = self.critic(step["tokens"])[:, :-1]
                step["logp_ref"] = (
                    token_log_probs(self.ref(step["tokens"]), step["tokens"]) * step["mask"]
                )
        return torch.zeros(())


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "76332bfebad9aac3562ce5f501e5b621", "grade": false, "grade_id": "30_implementation-27", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
CHAPTER_RUN = PPOConfig()


policy, ref, critic, prompts, gen = build_models(seed=0)
run_cfg = CHAPTER_RUN
print(run_cfg)
run_log = RunLog(critic, ref)
t0 = time.perf_counter()
history = train_ppo(
    policy,
    ref,
    critic,
    prompts,
    run_log.reward,
    END_ID,
    run_cfg,
    generator=gen,
    progress=True,
    extra_loss=run_log,
)
train_seconds = time.perf_counter() - t0
print(f"{len(history)} PPO steps in {train_seconds:.1f} s")
show_table(
    ["step", "reward", "KL", "clip", "beta"],
    [
        [i, f"{h.reward:.2f}", f"{h.kl:.2f}", f"{h.clip_frac:.3f}", f"{h.beta:.4f}"]
        for i, h in enumerate(history, 1)
        if i % 5 == 0 or i == 1
    ],
)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "68a739145724b00046712e1ea6a0a36c", "grade": false, "grade_id": "30_implementation-28", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
peak = max(range(len(history)), key=lambda i: history[i].kl)
best = max(range(len(history)), key=lambda i: history[i].reward)
curves = (
    f"reward {history[0].reward:.2f} -> peak {history[best].reward:.2f} (step {best + 1}) -> {history[-1].reward:.2f}; "
    f"KL peaks at {history[peak].kl:.2f} (step {peak + 1}, target {CHAPTER_RUN.kl_target}) and ends at {history[-1].kl:.2f}"
)
show(
    plot_training_curves(history, kl_target=CHAPTER_RUN.kl_target),
    alt=f"Four training curves over {len(history)} PPO steps: {curves}; clip fraction between "
    f"{min(h.clip_frac for h in history):.2f} and {max(h.clip_frac for h in history):.2f}; "
    f"beta from {history[0].beta:.3f} to {history[-1].beta:.3f}.",
)
print(curves)
print(
    f"beta {history[0].beta:.3f} -> {history[-1].beta:.3f}; the controller moves it by at most "
    f"{100 * 0.2 / CHAPTER_RUN.horizon:.0f} % per step"
)
samples = collect_rollouts(policy, ref, critic, prompts[:4], 8, END_ID, gen)["tokens"]
for row in samples:
    print(decode(row))


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "d811d8eaa942bc9340a2d7ee6e6d58b5", "grade": false, "grade_id": "30_implementation-29", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Read the curves together. The reward climbs as `good` becomes more likely; the KL climbs with it
# and overshoots the target, because the controller may change $\beta$ only a little per step (the
# cell above prints by how much). $\beta$ then rises and pulls the KL back toward the target, and
# the reward gives back part of its peak: that is the KL budget binding, exactly what the penalty is
# for. The clip fraction is measured at the start of each step's last epoch, after the earlier
# epochs' steps: the share of response tokens those steps had already pushed out of the band. The
# samples are what the KL fee buys: the policy says `good` far more often than the reference would,
# but it has not collapsed onto a single string.
#
# **Before and after, and where the length comes from.** The log holds the very first batch, sampled by the
# untrained policy (an exact copy of the reference), and every batch after it. The next cell puts
# the first four samples of step 1 next to the four above, and follows three numbers over the run.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "5ec57e724b4f7014664883a6b8b575df", "grade": false, "grade_id": "30_implementation-30", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
def response_stats(step):
    """Share of responses that emitted <|end|>, and the share of response tokens that are <|pad|> / <|bos|>."""
    resp, m = step["tokens"][:, 1:], step["mask"]  # (B, T-1) each: response token t is resp[:, t]
    ended = float(((resp == END_ID).float() * m).sum(dim=1).gt(0).float().mean())
    special = {VOCAB[i]: float(((resp == i).float() * m).sum() / m.sum()) for i in (PAD_ID, BOS_ID)}
    return ended, special


end_share = [response_stats(step)[0] for step in run_log.steps]
first, last = run_log.steps[0], run_log.steps[-1]
print("step 1, sampled by the untrained policy:")
for row in first["tokens"][:4]:
    print("  ", decode(row))


def md_code(word):
    """A token as inline code inside a Markdown table cell (its | and <> escaped)."""
    return (
        "<code>" + word.replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;") + "</code>"
    )


shape_rows = [
    ["good tokens per response", f"{history[0].reward:.2f}", f"{history[-1].reward:.2f}"],
    [
        "response length (tokens)",
        f"{history[0].response_len:.2f}",
        f"{history[-1].response_len:.2f}",
    ],
    [f"responses ending in {md_code('<|end|>')}", f"{end_share[0]:.0%}", f"{end_share[-1]:.0%}"],
]
for name in ("<|pad|>", "<|bos|>"):
    shape_rows.append(
        [
            f"response tokens = {md_code(name)}",
            f"{response_stats(first)[1][name]:.1%}",
            f"{response_stats(last)[1][name]:.1%}",
        ]
    )
show_table(["", "step 1", f"step {len(history)}"], shape_rows, align="lrr")
show(
    plot_response_shape(history, end_share),
    alt=f"Three curves over {len(history)} PPO steps: good tokens per response rise from {history[0].reward:.2f} to "
    f"{history[-1].reward:.2f}, response length from {history[0].response_len:.2f} to {history[-1].response_len:.2f} "
    f"tokens, and the share of responses ending in <|end|> falls from {end_share[0]:.0%} to {end_share[-1]:.0%}.",
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "aa6c6cad9c4b5fc2ff4d91af30b90407", "grade": false, "grade_id": "30_implementation-31", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The policy did what the reward asked, and part of how it did it is worth naming. A response can
# hold more `good` tokens only if it is long enough, and `<|end|>` spends a position on something
# that scores nothing, so the policy learned to stop less often: the share of responses that end in
# `<|end|>` falls, to almost none around the reward peak, and the mean length climbs to the 8-token
# cap (the table above prints both ends of the run). Only once $\beta$ has risen and the KL budget
# binds does a little of the stopping come back.
# This is not a hack of the reward: the reward here is the true objective, and it favours length,
# because a longer response has room for more `good` tokens. What it shows is the *mechanism* of a
# length hack in miniature: the policy pushes up whatever property the reward pays for, wanted or
# not. When the reward is a learned model that merely prefers longer answers, the same push raises
# the reward through a property nobody asked for (§3.8 measures that case). Here the KL fee limits
# the push; at scale it is why practitioners plot response length next to the reward (§4.3's first
# row, and Q6 of §6).
#
# **Special tokens inside a response.** The sampler draws from the whole vocabulary, so the policy
# can and does emit `<|pad|>` and `<|bos|>` in the middle of a response (the table prints their
# shares at the first and last step); `decode` shows them and hides only the padding after
# `<|end|>`. This chapter *keeps* them, on purpose. They are ordinary actions: sampled from the
# same distribution that `collect_rollouts` scores, paying the same KL fee and earning no reward,
# so PPO treats them correctly. Forbidding them while sampling would have to be repeated in every
# log-prob computation (the policy's, the reference's, the sampler's), or the recorded
# $\log\pi_{\text{old}}$ would no longer be the log-prob of the distribution sampled from: that is
# the impure-sampling bug of §4.3's "negative KL" row. It would also change every trained number in
# this chapter. In a real model the question rarely comes up, because SFT has already left special
# tokens almost no probability in mid-response; the toy starts from a near-uniform model, so it does.
#
# **One response through GAE.** The last batch of the run, first row: the shaped reward of each
# token (the KL fee everywhere, plus the score on the last token), the critic's value before each
# token, and what your `gae` makes of them. The cell uses your `shaped_rewards` and `gae` with the
# step's own $\beta$.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "e1d8faf6f90fb815b827dbecbdbb4930", "grade": false, "grade_id": "30_implementation-32", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
k = len(history) - 1  # the last step
step, m = run_log.steps[k], run_log.steps[k]["mask"]
full_mask = torch.cat([torch.zeros_like(m[:, :1]), m], dim=1)  # (B, T)
scores = good_count_reward(step["tokens"], full_mask)  # (B,)
R = shaped_rewards(scores, step["logp"][0], step["logp_ref"], m, history[k].beta)  # (B, T-1)
A, G = gae(R, step["values"], m)  # (B, T-1) each, before whitening
row = 0
cols = m[row].nonzero().flatten()  # response columns of this row
words = [VOCAB[int(t)] for t in step["tokens"][row, cols + 1]]  # column t scores tokens[:, t+1]
print(
    f"step {k + 1}, row {row}: {decode(step['tokens'][row])}  (score {scores[row]:.0f}, beta {history[k].beta:.4f})"
)
show_table(
    ["t", "token", "R_t", "V(s_t)", "A_t", "G_t"],
    [
        [t, md_code(w), *(f"{x[row, c]:.3f}" for x in (R, step["values"], A, G))]
        for t, (c, w) in enumerate(zip(cols.tolist(), words, strict=True), 1)
    ],
    align="rlrrrr",
)
show(
    plot_gae_trace(
        words,
        R[row, cols],
        step["values"][row, cols],
        A[row, cols],
        G[row, cols],
        title=f"One sampled response after GAE (step {k + 1}, score {scores[row]:.0f})",
    ),
    alt=f"Per-token chart of the response '{' '.join(words)}': bars for the shaped reward R_t, small except "
    f"{float(R[row, cols[-1]]):.2f} on the last token where the score lands; lines for the critic's V(s_t), the advantage "
    f"A_t (from {float(A[row, cols].min()):.2f} to {float(A[row, cols].max()):.2f}) and the return G_t = A_t + V(s_t).",
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3a9c4f10b87548ca6fea27ecf44d9aec", "grade": false, "grade_id": "30_implementation-33", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Read it from the right. The score lands on the last token, so its bar towers over the rest. Each
# `good` pays a visible KL fee, because the policy now says `good` far more often than the
# reference would, while tokens it has made *less* likely than the reference earn a small refund.
# The return $G_t$ is close to the sum of the bars from $t$ to the end (exactly that at
# $\lambda = 1$), and the advantage $A_t$ is how much better things went than the critic predicted
# before the token. This critic has learned the task well enough that its values track the returns,
# so the advantages are small next to the rewards: what is left to learn from this response sits in
# a few tokens. Whitening (next in `ppo_update`) then rescales the advantages over the whole batch.
#
# **Two diagnostics, two definitions each.** The log also holds the policy's log-probs at the start
# of every epoch, so the cell below recomputes, for every step, two quantities that libraries log
# under one name but define differently (§2.2): the clip fraction (ratio outside the band, as here
# and in CleanRL, versus clipped term active, TRL's and OpenRLHF's `clipfrac`), and the
# approximate KL between the sampling policy and the current one ($k_3 = \mathbb E[r - 1 - \log r]$
# as here, versus $k_2 = \tfrac12\mathbb E[(\log r)^2]$, which TRL and lm-human-preferences log as
# `approxkl`). Both are taken at the start of the last epoch, where `ppo_update` measures its own.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "a6528c396c1caeb0415c872070c5f3ee", "grade": false, "grade_id": "30_implementation-34", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
clip_out, clip_active, k2s, k3s = [], [], [], []
for step, h in zip(run_log.steps, history, strict=True):
    m = step["mask"]
    full_mask = torch.cat([torch.zeros_like(m[:, :1]), m], dim=1)
    R = shaped_rewards(
        good_count_reward(step["tokens"], full_mask), step["logp"][0], step["logp_ref"], m, h.beta
    )
    adv = masked_whiten(gae(R, step["values"], m)[0], m)  # the advantages the update used
    log_r = (step["logp"][-1] - step["logp"][0]) * m  # (B, T-1) at the start of the last epoch
    r = log_r.exp()
    clip_out.append(float(masked_mean(((r - 1).abs() > 0.2).float(), m)))
    clip_active.append(
        float(masked_mean((((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8))).float(), m))
    )
    k3s.append(float(masked_mean(r - 1 - log_r, m)))
    k2s.append(float(masked_mean(0.5 * log_r**2, m)))
    assert (
        abs(clip_out[-1] - h.clip_frac) < 1e-6 and abs(k3s[-1] - h.approx_kl) < 1e-6
    )  # same as ppo_update's
n = len(history)
gap_step = max(range(n), key=lambda i: clip_out[i] - clip_active[i])
print(
    f"clip fraction, mean over {n} steps: ratio outside the band {sum(clip_out) / n:.3f}, "
    f"clipped term active (TRL) {sum(clip_active) / n:.3f}"
)
print(
    f"largest gap at step {gap_step + 1}: {clip_out[gap_step]:.3f} vs {clip_active[gap_step]:.3f}"
)
rel = [abs(a - b) / b for a, b in zip(k2s, k3s, strict=True) if b > 0]
print(
    f"approx KL, mean over {n} steps: k3 {sum(k3s) / n:.5f}, k2 {sum(k2s) / n:.5f}; "
    f"they differ by at most {max(rel):.1%} at any step"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "f252badff4fee3c48181f1995fbbaf2b", "grade": false, "grade_id": "30_implementation-35", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Same run, same tokens: the TRL-style clip fraction is clearly the smaller one on average and far
# smaller on single steps (the cell prints both), so a threshold read off one library's dashboard
# means something else in another's. The two approximate KLs agree to within a few per cent here because the ratios stay
# close to 1, where $k_2$ and $k_3$ share their second-order term $\tfrac12(\log r)^2$; they part as
# the policy moves further within a step.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "72bb3f3dcc7b9460eca6af7aacab00da", "grade": true, "grade_id": "test_train_ppo_increases_reward_with_bounded_kl", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
# Graded (2 points): a hidden, seeded 30-step run with beta = 0.5 must raise the mean reward and keep
# the KL to the reference bounded.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "25ef16d4193c7ccdbe64eb62b2c6cb63", "grade": false, "grade_id": "35_reward_model-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3.7 Where $r_\phi$ comes from: a reward model trained on preferences
#
# Up to here the score was a program, `good_count_reward`. In RLHF it is a network $r_\phi(x, y)$
# fitted to human judgements, and the judgement people can give reliably is a comparison: shown two
# responses to one prompt, a rater picks the better one. The Bradley-Terry model turns that choice
# into a likelihood. The response $y_w$ wins over $y_l$ with probability
#
# $$P(y_w \succ y_l \mid x) = \sigma\big(r(x, y_w) - r(x, y_l)\big),$$
#
# and fitting $r_\phi$ by maximum likelihood means minimising the **pairwise loss**
#
# $$\mathcal L(\phi) = -\,\mathbb E_{(x, y_w, y_l)}\,\log \sigma\big(r_\phi(x, y_w) - r_\phi(x, y_l)\big).$$
#
# This is the loss of Christiano et al. (2017) and of Stiennon et al. (2020), and the two-response
# case of what other language-model pipelines fit. Ziegler et al. (2019) showed raters four samples,
# asked for the best one, and trained with a softmax over the four rewards, of which the formula above
# is the $K = 2$ instance. InstructGPT (Ouyang et al., 2022) had labelers rank $K$ responses (4 to 9)
# and turned each ranking into its $\binom{K}{2}$ pairs, all pairs of one prompt in the same batch,
# each entering the pairwise loss. Two consequences shape the rest of the pipeline. Only *differences* of rewards enter the loss, so the offset of $r_\phi$ is
# arbitrary, and its scale says how consistent the labels were rather than anything PPO should
# depend on; lm-human-preferences therefore fixes both after training, with a gain and a bias
# chosen so that the rewards of samples from the initial policy have mean 0 and standard deviation
# 1 (Ziegler et al., 2019, and their code). And the
# reward model only ever sees responses like those it was trained on: samples of the initial
# policy. PPO then moves the policy away from exactly that distribution.
#
# **The toy version.** A hidden *gold* preference plays the raters: a response earns one point per
# `good` token up to two, and loses half a point for every `good` beyond two. A little praise helps;
# a response made of nothing but praise does not. Pairs are two samples of the initial policy for
# the same prompt, and the first one wins with probability $\sigma(\text{gold}_a - \text{gold}_b)$, the
# Bradley-Terry rater itself, so equal gold scores are coin flips. The reward model is the toy
# transformer's trunk, copied from the reference LM as InstructGPT and lm-human-preferences
# initialise theirs from the language model, with a scalar head read at the last response token.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "aab6bbfda30e67b325b7b02c15a8787a", "grade": false, "grade_id": "35_reward_model-1", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import statistics
from typing import NamedTuple

import torch.nn as nn
import torch.nn.functional as F

from mlbook.posttrain.cached import load_cached
from mlbook.posttrain.masks import validate_mask
from mlbook.posttrain.toy_lm import GOOD_ID, PAD_ID, TinyTransformer, make_prompts, sample

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "f5d5c28f61f909892f66e28d5e5009fd", "grade": false, "grade_id": "35_reward_model-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
GOLD_PEAK = 2  # praise helps up to two "good" tokens; every one beyond that costs


GOLD_SLOPE_PAST_PEAK = 0.5


def gold_reward(tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The hidden preference the labels come from: (B, T), (B, T) -> (B,).

    ``g`` = ``good`` tokens in the response; the score rises by 1 per ``good`` up to ``GOLD_PEAK``
    and falls by ``GOLD_SLOPE_PAST_PEAK`` per ``good`` after it: a little praise is what the raters
    like, a response that is nothing but praise is not. Samples of the near-uniform initial policy
    almost never reach the peak, so pairs drawn from it say "more good is better" and nearly nothing
    about what lies past the peak.
    """
    validate_mask(response_mask)
    if tokens.shape != response_mask.shape:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and response_mask {tuple(response_mask.shape)} differ"
        )
    g = ((tokens == GOOD_ID).float() * response_mask).sum(dim=1)  # (B,)
    return torch.clamp(g, max=GOLD_PEAK) - GOLD_SLOPE_PAST_PEAK * torch.clamp(g - GOLD_PEAK, min=0)


class Pairs(NamedTuple):
    """Preference pairs: for each prompt a chosen and a rejected response, both (N, T)."""

    chosen: torch.Tensor  # (N, T) long: prompt, response, PAD
    chosen_mask: torch.Tensor  # (N, T) float: 1 on response tokens
    rejected: torch.Tensor  # (N, T) long
    rejected_mask: torch.Tensor  # (N, T) float
    gold_margin: (
        torch.Tensor
    )  # (N,) gold(chosen) - gold(rejected); negative where the noise flipped


def _padded(samples, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a sample's tokens (PAD) and mask (0) to ``length`` columns."""
    extra = length - samples.tokens.shape[1]
    return F.pad(samples.tokens, (0, extra), value=PAD_ID), F.pad(samples.response_mask, (0, extra))


def preference_pairs(
    model: nn.Module,
    n: int,
    max_new_tokens: int,
    generator: torch.Generator,
    noise: bool = True,
    gold=gold_reward,
) -> Pairs:
    """``n`` pairs: two responses of ``model`` per prompt, labelled by ``gold``.

    With ``noise`` the first response is preferred with probability ``sigmoid(gold_a - gold_b)``
    (the Bradley-Terry model of a rater: ties are coin flips, a margin of 1 is right 73 % of the
    time); without it the higher gold score wins and ties are broken at random.
    """
    prompts = make_prompts(n, generator)  # (N, 2)
    length = prompts.shape[1] + max_new_tokens
    a = _padded(sample(model, prompts, max_new_tokens, END_ID, generator=generator), length)
    b = _padded(sample(model, prompts, max_new_tokens, END_ID, generator=generator), length)
    margin = gold(*a) - gold(*b)  # (N,)
    p_a = torch.sigmoid(margin) if noise else (margin > 0).float() + 0.5 * (margin == 0).float()
    a_wins = torch.rand(n, generator=generator) < p_a  # (N,)
    pick = a_wins.unsqueeze(1)  # (N, 1)
    return Pairs(
        torch.where(pick, a[0], b[0]),
        torch.where(pick, a[1], b[1]),
        torch.where(pick, b[0], a[0]),
        torch.where(pick, b[1], a[1]),
        torch.where(a_wins, margin, -margin),
    )


class TinyRewardModel(nn.Module):
    """A transformer trunk, a scalar head read at the last response token: (B, T), (B, T) -> (B,).

    Built from a language model (``from_lm``) as InstructGPT and LMHP build theirs: the LM's trunk,
    its unembedding replaced by a linear head with one output.
    """

    def __init__(self, trunk: TinyTransformer) -> None:
        super().__init__()
        self.trunk = trunk
        d = trunk.cfg.d_model
        self.head = nn.Linear(d, 1)
        nn.init.normal_(self.head.weight, std=1 / math.sqrt(d + 1))  # LMHP's reward-head init
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_lm(cls, lm: TinyCausalLM):  # no return annotation: the notebook has no __future__
        """A reward model whose trunk is a trainable copy of ``lm``'s."""
        return cls(copy.deepcopy(lm.trunk).requires_grad_(True))

    def forward(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape != response_mask.shape:
            raise ValueError(
                "expected tokens and response_mask of the same (B, T) shape, got "
                f"{tuple(tokens.shape)} and {tuple(response_mask.shape)}"
            )
        hidden = self.trunk(tokens)  # (B, T, d)
        last = last_response_index(response_mask)  # (B,) column of the last response token
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return self.head(hidden[rows, last]).squeeze(-1)  # (B,)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3f8b87d91b4a2a9360723430f441958f", "grade": false, "grade_id": "35_reward_model-3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Pairs of the kind the reward model is trained on, drawn from this chapter's reference model (the
# initial policy), with their gold scores and the label the noisy rater gave:

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "f80e4cc88a63adf585b5fe6277cf9021", "grade": false, "grade_id": "35_reward_model-4", "locked": true, "schema_version": 3, "solution": false, "task": false}
rm_pairs = preference_pairs(build_models(seed=0).ref, 1024, 8, torch.Generator().manual_seed(3))
rm_gold_c = gold_reward(rm_pairs.chosen, rm_pairs.chosen_mask)
rm_gold_r = gold_reward(rm_pairs.rejected, rm_pairs.rejected_mask)
for i in range(3):
    print(f"chosen   (gold {rm_gold_c[i]:+.1f}): {decode(rm_pairs.chosen[i])}")
    print(f"rejected (gold {rm_gold_r[i]:+.1f}): {decode(rm_pairs.rejected[i])}")
rm_ties = float((rm_pairs.gold_margin == 0).float().mean())
rm_flipped = float((rm_pairs.gold_margin < 0).float().mean())
print(
    f"over {len(rm_pairs.chosen):,} pairs: {rm_ties:.0%} tie on gold (a coin flip decides them), "
    f"{rm_flipped:.0%} were labelled against the gold order"
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "89b94ac0c729382f2b1c35503adcc92d", "grade": false, "grade_id": "35_reward_model-5", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Exercise (extra credit).** Write `pairwise_loss(r_chosen, r_rejected)`: the mean over pairs of
# $-\log\sigma(r_{\text{chosen}} - r_{\text{rejected}})$, as a scalar tensor with gradient. Make it
# numerically stable: a reward model that is confidently wrong on a pair has a margin of $-100$ or
# less, where $\sigma$ underflows to 0 in float32 and $\log$ of it is $-\infty$. PyTorch has the
# stable form built in.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "02f78cb77ee04ff03f163cd8a54a6f41", "grade": false, "grade_id": "35_reward_model-6", "locked": true, "schema_version": 3, "solution": false, "task": false}
def validate_pair_rewards(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> None:
    """Both 1-D floating tensors of the same length N (one reward per pair), all finite."""
    for name, r in (("r_chosen", r_chosen), ("r_rejected", r_rejected)):
        if not isinstance(r, torch.Tensor) or not r.is_floating_point() or r.dim() != 1:
            shape = tuple(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__
            raise ValueError(f"{name} must be a 1-D floating tensor (N,), got {shape}")
        if not torch.isfinite(r).all():
            raise ValueError(f"{name} contains NaN or inf")
    if r_chosen.shape != r_rejected.shape:
        raise ValueError(
            f"one reward per pair: r_chosen {tuple(r_chosen.shape)} vs r_rejected "
            f"{tuple(r_rejected.shape)}"
        )


# %% deletable=false nbgrader={"cell_type": "code", "checksum": "4f526b1d255b8b300728cd6d899b32d5", "grade": false, "grade_id": "ex_pairwise_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def pairwise_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry negative log-likelihood ``mean_i -log sigmoid(r_chosen_i - r_rejected_i)``.

    Args:
        r_chosen: (N,) reward of the preferred response of each pair.
        r_rejected: (N,) reward of the other response.
    Returns:
        A scalar tensor with gradient to both inputs, finite for any finite margin.
    """
    validate_pair_rewards(r_chosen, r_rejected)
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "9500b5818e413eff68083d35ba875156", "grade": false, "grade_id": "35_reward_model-8", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Check (not graded): equal rewards give log 2, a margin of m gives log(1 + e^-m), large margins stay finite.
rm_even = pairwise_loss(torch.zeros(4), torch.zeros(4))
assert abs(float(rm_even) - math.log(2)) < 1e-6, (
    f"equal rewards should cost log 2 = 0.693, got {float(rm_even):.4f}"
)
rm_m = torch.tensor([1.0, -2.0])
rm_want = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
rm_got = pairwise_loss(rm_m, torch.zeros(2))
assert abs(float(rm_got) - rm_want) < 1e-5, (
    f"margins +1 and -2 should cost {rm_want:.4f} on average, got {float(rm_got):.4f}: check the sign "
    "of the margin and that you average over pairs"
)
rm_far = pairwise_loss(torch.tensor([0.0]), torch.tensor([150.0]))
assert torch.isfinite(rm_far) and abs(float(rm_far) - 150.0) < 1e-3, (
    f"a margin of -150 should cost 150, got {float(rm_far)}: use a stable log-sigmoid"
)
print(
    f"equal rewards: {float(rm_even):.4f} (log 2 = {math.log(2):.4f}); margins +1, -2: {float(rm_got):.4f}"
)

# %% deletable=false editable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "code", "checksum": "ad0bc5311ea52d127bd899b238538cc0", "grade": true, "grade_id": "ex_pairwise_loss_test", "locked": true, "points": 0, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Graded (1 point, extra credit): value and gradient against a loop over pairs, in float32 and float64,
# for several batch sizes; a large margin stays finite; the inputs are left as they were.
_loss = pairwise_loss(torch.tensor([0.5, -0.5]), torch.tensor([0.0, 0.0]))
assert isinstance(_loss, torch.Tensor) and _loss.numel() == 1, (
    "pairwise_loss must return a scalar tensor"
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "596beef472e5724de0cc3a18e0cf341c", "grade": false, "grade_id": "35_reward_model-10", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Training it.** `train_reward_model` samples 2,048 training pairs and 1,024 held-out pairs from
# the initial policy, fits the model with full-batch Adam on the reference `pairwise_loss`, and
# then fits the gain and bias on 1,024 fresh samples. The three seeds of this section and the PPO
# runs against each of their reward models take a minute or two of CPU (the cell prints how long
# they took when the cache was written), too long for a notebook cell, so they were run once by
# `python -m mlbook_solutions.reward_model --refresh` and are read from the library's cache
# (`mlbook.posttrain.cached`), which stores a fingerprint of the code that produced it and a short
# float64 rerun that the tests repeat. The code is the chapter's own:

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "27a24ccd8ede94918db917058340ba86", "grade": false, "grade_id": "35_reward_model-11", "locked": true, "schema_version": 3, "solution": false, "task": false}
@dataclasses.dataclass(kw_only=True)
class RMConfig:
    """Everything that sets the reward model and the PPO runs against it."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """One reward model and one PPO run per seed per beta."""
    train_pairs: int = 2048
    """Preference pairs the RM is trained on (sampled from the initial policy)."""
    heldout_pairs: int = 1024
    """Pairs it is evaluated on, from the same distribution."""
    rm_steps: int = 40
    """Full-batch Adam steps on the pairwise loss."""
    rm_lr: float = 2e-3
    """Adam learning rate of the reward model."""
    norm_samples: int = 1024
    """Samples of the initial policy the gain and bias are fitted on."""
    betas: tuple[float, ...] = (0.01, 0.1, 0.3)
    """Fixed KL coefficients of the PPO runs (no controller: the KL is free to grow)."""
    ppo_steps: int = 60
    """PPO steps per run."""
    batch: int = 64
    """Prompts per PPO step."""
    control_beta: float = 0.01
    """Beta of the control runs (monotone gold, one RM per seed): the most pressure."""


RM_RUN = RMConfig()


@dataclasses.dataclass
class TrainedRM:
    """A trained reward model, its normalisation, and what was measured while fitting it."""

    model: TinyRewardModel
    gain: float
    bias: float
    loss: list[float]  # pairwise loss per training step
    heldout_loss: float
    heldout_accuracy: float  # agreement with the noisy held-out labels
    gold_accuracy: float  # agreement with the noiseless gold order, pairs with different gold
    gold_mean: float  # gold's mean and std on the samples the gain and bias were fitted on: gold in
    gold_std: float  # the proxy's units is (gold - gold_mean) / gold_std

    def __call__(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """The normalised reward ``gain * r_phi + bias`` (no gradient): a ``reward_fn``."""
        with torch.no_grad():
            return self.gain * self.model(tokens, response_mask) + self.bias


def train_reward_model(seed: int, cfg: RMConfig | None = None, gold=gold_reward) -> TrainedRM:
    """Sample pairs from the initial policy of ``build_models(seed)``, labelled by ``gold``, fit
    the RM, normalise it. ``cfg`` defaults to ``RM_RUN`` (read at call time: the grader keeps
    definitions only)."""
    cfg = RM_RUN if cfg is None else cfg
    policy = build_models(seed).policy  # a copy of the reference: the initial policy
    gen = torch.Generator().manual_seed(10_000 + seed)  # the raters' own random stream
    n_new = CHAPTER_RUN.max_new_tokens
    train = preference_pairs(policy, cfg.train_pairs, n_new, gen, gold=gold)
    heldout = preference_pairs(policy, cfg.heldout_pairs, n_new, gen, gold=gold)
    torch.manual_seed(seed)
    rm = TinyRewardModel.from_lm(policy)
    opt = torch.optim.Adam(rm.parameters(), lr=cfg.rm_lr)
    losses = []
    for _ in range(cfg.rm_steps):
        loss = pairwise_loss(
            rm(train.chosen, train.chosen_mask), rm(train.rejected, train.rejected_mask)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        r_c, r_r = (
            rm(heldout.chosen, heldout.chosen_mask),
            rm(heldout.rejected, heldout.rejected_mask),
        )
        decided = heldout.gold_margin != 0
        gold_acc = float(((r_c > r_r) == (heldout.gold_margin > 0))[decided].float().mean())
        # LMHP: gain and bias so that rewards of the initial policy's samples have mean 0, std 1
        norm = sample(policy, make_prompts(cfg.norm_samples, gen), n_new, END_ID, generator=gen)
        raw = rm(norm.tokens, norm.response_mask)  # (norm_samples,)
        gain = 1.0 / float(raw.std())
        bias = -gain * float(raw.mean())
        gold_norm = gold(norm.tokens, norm.response_mask)  # (norm_samples,) same samples

    return TrainedRM(
        rm.requires_grad_(False),
        gain,
        bias,
        losses,
        float(pairwise_loss(r_c, r_r)),
        float((r_c > r_r).float().mean()),
        gold_acc,
        float(gold_norm.mean()),
        float(gold_norm.std()),
    )


class GoldLogger:
    """A ``reward_fn``: returns the proxy's scores, logs the gold score of the same samples."""

    def __init__(self, proxy, gold=gold_reward) -> None:
        self.proxy, self.gold_fn, self.gold = proxy, gold, []

    def __call__(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        self.gold.append(float(self.gold_fn(tokens, response_mask).mean()))
        return self.proxy(tokens, response_mask)


def overoptimisation_run(
    seed: int, beta: float, rm: TrainedRM, steps: int, batch: int, gold=gold_reward
) -> dict:
    """PPO (the chapter's settings, beta fixed) against the learned reward: per-step proxy, gold
    (``gold`` of the same samples), KL and response length."""
    policy, ref, critic, prompts, gen = build_models(seed, batch)
    logger = GoldLogger(rm, gold)
    cfg = dataclasses.replace(CHAPTER_RUN, steps=steps, beta=beta, kl_target=None)
    history = train_ppo(policy, ref, critic, prompts, logger, END_ID, cfg, generator=gen)
    return dict(
        seed=seed,
        beta=beta,
        proxy=[h.reward for h in history],
        gold=logger.gold,
        kl=[h.kl for h in history],
        length=[h.response_len for h in history],
    )


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "d29c61b02400289c5aa7f6ba112af8e0", "grade": false, "grade_id": "35_reward_model-12", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
rm_results = load_cached("reward_model")
rm_cfg = rm_results["config"]
print(
    f"{rm_cfg['train_pairs']:,} training pairs, {rm_cfg['heldout_pairs']:,} held out, "
    f"{rm_cfg['rm_steps']} Adam steps, gain and bias fitted on {rm_cfg['norm_samples']:,} samples; "
    f"cache written in {rm_results['seconds']:.0f} s"
)
for seed, r in rm_results["rms"].items():
    print(
        f"seed {seed}: pairwise loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f} (train), "
        f"{r['heldout_loss']:.3f} held out; agrees with the noisy held-out labels on "
        f"{r['heldout_accuracy']:.1%}, with the gold order on {r['gold_accuracy']:.1%} of the "
        f"pairs gold can tell apart; gain {r['gain']:.3f}, bias {r['bias']:+.3f}"
    )
rm_noise_ceiling = 1 / (1 + math.exp(-1.0))  # sigmoid(1)
print(
    f"a rater who prefers the better of two responses one gold point apart does so "
    f"{rm_noise_ceiling:.1%} of the time"
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "9fdc339a2506d1d3933ea8fb3a312766", "grade": false, "grade_id": "35_reward_model-13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The held-out loss stays close to $\log 2 = 0.693$ and the agreement with the held-out labels
# near 60 %: a large share of the initial policy's pairs tie on gold (the first cell of this
# section printed it), and a tie is a coin flip no model can predict. Measured against the noiseless gold order, on the pairs
# where gold differs, the model is right almost every time. On the distribution it was trained on,
# this is a good reward model.
#
# ### 3.8 Optimising a learned reward: over-optimisation, measured
#
# Now run the chapter's PPO against the *normalised learned* reward instead of the program, with a
# fixed $\beta$ and no controller, so that the KL is free to grow, and log the gold score of the
# very samples the proxy scored (`GoldLogger`). Gao, Schulman and Hilton (2023) did this at scale,
# with a large "gold" reward model labelling the data for smaller proxies, and found the same shape
# every time: as the policy moves away from its start, measured by $\sqrt{\mathrm{KL}}$, the proxy
# reward keeps rising while the gold reward rises, peaks and falls. To compare the two in one unit,
# gold is normalised the way the proxy is: minus its mean, over its standard deviation, on the very
# samples of the initial policy that fixed the proxy's gain and bias. The figure shows, per $\beta$,
# the mean over the three seeds (one reward model each) with a band from the lowest to the highest
# seed, each smoothed by a running mean over five steps; the right panel is a control explained
# below.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "c514ace33ea807795a87a74f93e97a89", "grade": false, "grade_id": "35_reward_model-14", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
def gold_z(results: dict, run: dict, control: bool = False) -> list[float]:
    """A run's gold in the proxy's units: minus gold's mean, over its std, on the initial policy's
    samples the run's reward model was normalised on (so both start near 0, in the same unit)."""
    rm = results["control_rms" if control else "rms"][str(run["seed"])]
    return [(g - rm["gold_mean"]) / rm["gold_std"] for g in run["gold"]]


def summarise(results: dict) -> dict:
    """Per beta, over seeds: peak gold and where it happened, final gold and proxy, final KL;
    ``control``: the same for the monotone-gold runs. ``*_z``: gold in the proxy's units."""
    out = {}
    groups = dict(results["runs"], control=results["control"])
    for beta, runs in groups.items():
        control = beta == "control"
        z = [gold_z(results, r, control) for r in runs]
        peak = [max(range(len(r["gold"])), key=r["gold"].__getitem__) for r in runs]
        out[beta] = dict(
            gold_start=statistics.fmean(r["gold"][0] for r in runs),
            gold_peak=statistics.fmean(r["gold"][i] for r, i in zip(runs, peak, strict=True)),
            kl_at_peak=statistics.fmean(r["kl"][i] for r, i in zip(runs, peak, strict=True)),
            gold_final=statistics.fmean(statistics.fmean(r["gold"][-5:]) for r in runs),
            proxy_start=statistics.fmean(r["proxy"][0] for r in runs),
            proxy_final=statistics.fmean(statistics.fmean(r["proxy"][-5:]) for r in runs),
            kl_final=statistics.fmean(statistics.fmean(r["kl"][-5:]) for r in runs),
            length_final=statistics.fmean(statistics.fmean(r["length"][-5:]) for r in runs),
            gold_start_z=statistics.fmean(g[0] for g in z),
            gold_final_z=statistics.fmean(statistics.fmean(g[-5:]) for g in z),
        )
    rms = results["rms"].values()
    out["rm"] = dict(
        heldout_accuracy=statistics.fmean(r["heldout_accuracy"] for r in rms),
        gold_accuracy=statistics.fmean(r["gold_accuracy"] for r in rms),
    )
    return out


def gold_at_equal_kl(
    results: dict, d_values=(0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5), width: float = 0.25
) -> dict:
    """Per beta, the mean gold (proxy units) of every step, all seeds, whose sqrt(KL) lies within
    ``width`` of each ``d``; None where fewer than three steps do. Equal rows mean the betas move
    along one gold-versus-KL curve and differ only in how far along it they stop."""
    out = {}
    for beta, runs in results["runs"].items():
        pts = [
            (math.sqrt(max(k, 0.0)), g)
            for r in runs
            for k, g in zip(r["kl"], gold_z(results, r), strict=True)
        ]
        row = {}
        for d in d_values:
            near = [g for x, g in pts if abs(x - d) < width]
            row[d] = statistics.fmean(near) if len(near) >= 3 else None
        out[beta] = row
    return out


def _band(runs: list[dict], values: list[list[float]], window: int = 5):
    """Per step over seeds: mean sqrt(KL), and the mean, min and max of ``values``, each smoothed
    by a centred running mean over ``window`` steps (step means are noisy)."""
    steps = range(len(runs[0]["kl"]))
    x = [statistics.fmean(math.sqrt(max(r["kl"][t], 0.0)) for r in runs) for t in steps]
    cols = list(zip(*values, strict=True))  # per step: one value per seed
    curves = [
        x,
        [statistics.fmean(c) for c in cols],
        [min(c) for c in cols],
        [max(c) for c in cols],
    ]
    h = window // 2
    return [[statistics.fmean(v[max(0, t - h) : t + h + 1]) for t in steps] for v in curves]


def plot_overoptimisation(results: dict):
    """Gold (solid) and proxy (dashed), both in the proxy's units, against sqrt(KL): per beta the
    mean over seeds with a min-max band (5-step running means); right: the monotone-gold control."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8), sharey=True)
    panels = [(axes[0], results["runs"], False), (axes[1], {"control": results["control"]}, True)]
    for ax, groups, control in panels:
        for i, (beta, runs) in enumerate(groups.items()):
            color = "C1" if control else ("C0", "C3", "C2")[i % 3]
            label = f"beta {results['config']['control_beta']}" if control else f"beta {beta}"
            gold = [gold_z(results, r, control) for r in runs]
            x, mean, lo, hi = _band(runs, gold)
            ax.plot(x, mean, "-", color=color, lw=1.8, label=f"gold, {label}")
            ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)
            x, mean, lo, hi = _band(runs, [r["proxy"] for r in runs])
            ax.plot(x, mean, "--", color=color, lw=1.2, label=f"proxy, {label}")
            ax.fill_between(x, lo, hi, color=color, alpha=0.08, lw=0)
        ax.axhline(0, color="0.6", lw=0.8)
        ax.set_xlabel("sqrt(KL to the reference)  (nats^0.5, per sequence)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("gold peaks at two `good` (§3.7's raters)", fontsize=9)
    axes[1].set_title("control: gold is the monotone count (§3.6)", fontsize=9)
    axes[0].set_ylabel("reward, in std of the initial policy's samples")
    fig.tight_layout()
    return fig


rm_summary = summarise(rm_results)
rm_rows = [
    "| beta | gold start | gold peak (largest step mean) | gold end | proxy end | KL at peak (nats) "
    "| KL end (nats) | length end (tokens) |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|",
]
rm_peak_z = {}
for beta in rm_cfg["betas"]:
    s = rm_summary[str(beta)]
    rm_peak_z[str(beta)] = statistics.fmean(  # each run's gold at its own peak step, proxy's std
        max(gold_z(rm_results, r)) for r in rm_results["runs"][str(beta)]
    )
    rm_rows.append(
        f"| {beta:g} | {s['gold_start_z']:+.2f} | {rm_peak_z[str(beta)]:+.2f} | {s['gold_final_z']:+.2f} | "
        f"{s['proxy_final']:+.2f} | {s['kl_at_peak']:.2f} | {s['kl_final']:.2f} | {s['length_final']:.2f} |"
    )
display(
    Markdown("Rewards in standard deviations of the initial policy's samples (the proxy's unit):")
)
display(Markdown("\n".join(rm_rows)))
rm_low, rm_high = str(min(rm_cfg["betas"])), str(max(rm_cfg["betas"]))
print(
    f"beta {rm_low}: gold falls from its peak {rm_peak_z[rm_low]:+.1f} std to "
    f"{rm_summary[rm_low]['gold_final_z']:+.1f} std while the proxy ends at "
    f"{rm_summary[rm_low]['proxy_final']:+.1f} std"
)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "aea3b85ecbdf472ec059bd0681ff3e80", "grade": false, "grade_id": "35_reward_model-15", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
show(
    plot_overoptimisation(rm_results),
    alt="Two panels against the square root of the KL to the reference, rewards in standard "
    "deviations of the initial policy's samples, mean of three seeds with min-max bands. Left: for "
    "three fixed betas the proxy (dashed) rises steadily, while gold (solid) rises to a peak at a "
    "square-root KL near 2 and then falls below zero for the two smaller betas, which travel "
    "furthest; the largest beta stops near the peak. Right, the control with a monotone gold: gold "
    "and proxy rise together and stay together.",
)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "a69608116571986559eb5fc9c22801f5", "grade": false, "grade_id": "35_reward_model-16", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
rm_equal = gold_at_equal_kl(rm_results)
rm_d = [
    d for d in next(iter(rm_equal.values())) if all(row[d] is not None for row in rm_equal.values())
]
display(
    Markdown(
        "\n".join(
            [
                "| beta | " + " | ".join(f"sqrt(KL) = {d:g}" for d in rm_d) + " |",
                "|---:" * (len(rm_d) + 1) + "|",
            ]
            + [
                f"| {beta} | " + " | ".join(f"{row[d]:+.2f}" for d in rm_d) + " |"
                for beta, row in rm_equal.items()
            ]
        )
    )
)
rm_spread = max(
    max(row[d] for row in rm_equal.values()) - min(row[d] for row in rm_equal.values())
    for d in rm_d
)
print(
    f"gold (proxy units) at equal KL, where all three betas get there: largest gap between betas "
    f"{rm_spread:.2f} std"
)
rm_top = {d: max(rm_equal, key=lambda b: rm_equal[b][d]) for d in rm_d}
rm_lead = [
    sorted(row[d] for row in rm_equal.values())[-1]
    - sorted(row[d] for row in rm_equal.values())[-2]
    for d in rm_d
]
print(
    f"highest gold at each sqrt(KL): beta {', '.join(sorted(set(rm_top.values())))}, ahead of the "
    f"next beta by {min(rm_lead):.2f} to {max(rm_lead):.2f} std"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "ec87290d6c4d090da59e656c59bd0b34", "grade": false, "grade_id": "35_reward_model-17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# What the runs show (the cells above print the numbers):
#
# - **The proxy is not the goal.** With the smallest $\beta$ the policy learns to write `good` in
#   every position. The proxy calls that the best response it has seen, several standard deviations
#   above the initial policy, while the gold score ends well below where it *started*. The reward
#   model was never wrong about the data it saw; it was asked about responses far outside it, where
#   "more `good` is better" was an extrapolation.
# - **Gold peaks at a small KL.** In every run gold first rises, peaking at a few nats; where the
#   KL keeps growing past that, gold falls while the proxy still climbs. Gao et al. fit the gold score of RL runs with $d(\alpha - \beta \log d)$, where
#   $d = \sqrt{\mathrm{KL}}$ (and best-of-$n$ with $d(\alpha - \beta d)$). The peak in the table is the
#   largest of 60 noisy step means, so it sits a little above the smoothed curve of the figure.
# - **The reversal is built in.** The toy's gold falls because the toy was written that way: past
#   two `good` tokens each one costs gold, in a region the initial policy almost never samples, so
#   the reward model has no data there and extrapolates "more is better". Its error is an
#   extrapolation error by construction. In Gao et al.'s setting nothing was built to reverse: a
#   fixed gold model labelled the data, and gold fell because the proxy's errors, wherever the
#   policy found them, were optimised too.
# - **What the KL fee does here, and what it does not.** The largest $\beta$ stops at a small KL
#   and keeps most of the gold gain. That makes the fee a budget on how far the policy may move.
#   It does not make the optimisation better per nat spent: Gao et al. found that adding a KL
#   penalty did not raise the gold score reached at a given KL, and that its effect was like
#   stopping the run earlier on the same curve, and they note that this KL result depended on their
#   hyperparameters. The toy's last table reads gold at equal $\sqrt{\mathrm{KL}}$ for each $\beta$.
#   Taken exactly, the largest $\beta$ is ahead at every $\sqrt{\mathrm{KL}}$ where all three get
#   there, by a tenth of a standard deviation or so (the cell prints the range), so the toy leans
#   slightly towards a fee that helps per nat. Three seeds, one reward model each, cannot tell a
#   lead that small from noise. What it can tell: where the runs *end* differs by several standard
#   deviations (the first table), far more than the rows of the last one: $\beta$ chiefly chose how
#   far along the curve each run went.
# - **Length rides along.** Every run also pushes its responses to the maximum length (the last
#   column; the initial policy's mean length is printed below). On the toy that is partly
#   legitimate: on the initial policy's samples, longer responses have more room for the `good`
#   tokens gold pays for, so length and gold are correlated in the very data the reward model learns
#   from (the cell below measures the correlation). A reward model cannot tell a feature that
#   *causes* preference from one that merely travels with it. Singhal et al. (2023) measured this
#   confound in real RLHF: on standard preference datasets much of PPO's reward gain comes from
#   longer outputs, and optimising for length alone recovers most of it.
#

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "64d86db312ab6e1e9206d7e6c599cc7e", "grade": false, "grade_id": "35_reward_model-18", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
rm_init = sample(
    build_models(seed=0).ref,
    make_prompts(1024, torch.Generator().manual_seed(5)),
    8,
    END_ID,
    generator=torch.Generator().manual_seed(6),
)
rm_len = rm_init.response_mask.sum(1)  # (1024,)
rm_gold = gold_reward(rm_init.tokens, rm_init.response_mask)  # (1024,)
rm_corr = torch.corrcoef(torch.stack([rm_len, rm_gold]))[0, 1]
rm_len0 = statistics.fmean(r["length"][0] for runs in rm_results["runs"].values() for r in runs)
print(
    f"initial policy: mean response length {rm_len0:.2f} tokens (first PPO step, all runs); "
    f"correlation of length and gold over 1,024 samples: {float(rm_corr):.2f}"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "1d047facaa3f0aaec6f195c4c808624b", "grade": false, "grade_id": "35_reward_model-19", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **The control: a gold that does not reverse.** If over-optimisation were something PPO does to any
# learned reward, it would show up with any gold. The cache therefore holds a second set of runs
# (`refresh` in `mlbook_solutions.reward_model`): for each seed a reward model trained the same way
# on labels from `monotone_gold`, §3.6's count of `good` tokens, where more praise is always
# better, then PPO against it at the smallest $\beta$, the setting that over-optimised hardest above.
# The right panel of the figure shows the result, and the cell below prints it.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "0af4766f03c6e1de68c639e505fda633", "grade": false, "grade_id": "35_reward_model-20", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
rm_ctrl = rm_summary["control"]
rm_ctrl_corr = statistics.fmean(
    float(torch.corrcoef(torch.tensor([gold_z(rm_results, r, True), r["proxy"]]))[0, 1])
    for r in rm_results["control"]
)
print(
    f"control, beta {rm_cfg['control_beta']}: gold {rm_ctrl['gold_start_z']:+.1f} -> {rm_ctrl['gold_final_z']:+.1f} "
    f"std, proxy {rm_ctrl['proxy_start']:+.1f} -> {rm_ctrl['proxy_final']:+.1f} std, KL at the end "
    f"{rm_ctrl['kl_final']:.1f} nats; per-step correlation of gold and proxy {rm_ctrl_corr:.2f}"
)
print(
    f"peaked gold, same beta: gold {rm_summary[rm_low]['gold_start_z']:+.1f} -> "
    f"{rm_summary[rm_low]['gold_final_z']:+.1f} std"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "0dc25459c1b542983afe282338039ec5", "grade": false, "grade_id": "35_reward_model-21", "locked": true, "schema_version": 3, "solution": false, "task": false}
# With a monotone gold the same PPO, the same $\beta$ and a reward model fitted on the same kind of
# pairs travel just as far in KL, and gold climbs with the proxy the whole way. The policy's
# pressure was the same in both experiments; what differed is whether the proxy was wrong where the
# policy went. Over-optimisation needs both, and on the toy the second was put there on purpose.
# The control is also an easy case for the reward model: its gold is a single feature, the count of
# `good`, which is exactly what the model learns to count, so its extrapolation happens to be right.
# A real reward model sums many features learned from limited data, and a policy finds the ones
# that extrapolate wrongly; a clean control on the toy says nothing about that.
#
# The remedies §4.3 lists for over-optimisation follow from this picture: more KL (or an earlier
# stop), which limits how far the policy travels; reward models trained on fresh samples of the
# current policy, which remove the unseen region; ensembles whose disagreement flags extrapolation
# (Coste et al., 2023, found that optimising an ensemble's worst case or an uncertainty-penalised
# mean largely prevents over-optimisation; Eisenstein et al., 2023, that members which share an
# error agree on it, so an ensemble mitigates reward hacking but does not remove it); and explicit
# length control. Two later designs make one reward model do the work of several. WARM (Ramé et
# al., 2024, arXiv:2401.12187) fine-tunes several reward models from a shared initialisation and
# averages their *weights* rather than their outputs, which costs one model at inference and is more
# robust under distribution shift and to inconsistent labels than a single model. ODIN (Chen et al.,
# 2024, arXiv:2402.07319) trains a reward model with two heads, one made to track length and one
# made uncorrelated with it, and uses only the second during RL, so the policy earns nothing by
# length alone (the mechanism §3.6 shows).

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "a2c669cb4ca1fe40fb96cc164f34da96", "grade": false, "grade_id": "40_systems-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Systems view: memory, time, and what breaks
#
# On the toy, §3's loop takes a few seconds; the cell below divides the time its run printed by its
# number of steps. At production scale the same loop is limited by two budgets that the algorithm
# description hides: **memory**, because one PPO step keeps four networks resident, and
# **wall-clock**, because every step starts by sampling fresh responses one token at a time. This
# section prices both, measures the split on the toy (with your own `ppo_update`), and then lists
# the failure modes you will meet and how to tell them apart.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "1828c20024b1bd41f86804758f9f87d6", "grade": false, "grade_id": "40_systems-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
print(
    f"§3.6: {len(history)} PPO steps in {train_seconds:.1f} s, {train_seconds / len(history):.3f} s per step on this machine"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "39b2521f05d11020220bcb51041fe198", "grade": false, "grade_id": "40_systems-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 4.1 Memory: four models, two of them trained
#
# Count static state per parameter, before activations and KV cache. A model trained with
# mixed-precision Adam keeps bf16 weights for the forward pass (2 bytes), an fp32 master copy that the
# optimiser updates (4), Adam's first and second moments in fp32 (4 + 4), and bf16 gradients (2):
# **16 bytes per parameter**. A frozen model only needs its bf16 weights: **2 bytes per parameter**.
# PPO-RLHF trains the policy and the critic and runs the reference and the reward model forward only:
#
# $$\underbrace{16}_{\text{policy}} + \underbrace{16}_{\text{critic}} + \underbrace{2}_{\text{reference}}
#   + \underbrace{2}_{\text{reward model}} = 36 \text{ bytes per policy parameter}$$
#
# when all four models have the same size.
#
# Three caveats an interviewer may probe. Many stacks keep gradients in fp32 (18 B/param for a
# trained model), so 16 is a floor, not a constant. The four models need not share a size:
# InstructGPT paired 175B policies with a 6B reward model and a value function initialised from it,
# so its critic was cheap. And the table leaves out activations (training) and the KV cache
# (generation), which at long response lengths can rival the weights.
#
# First the toy, with its real parameter counts: the critic has its own trunk and a scalar head
# instead of the LM head, and the "reward model" is `good_count_reward`, a Python function with no
# weights.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "6e187bebca10d0727f21ec0a20b31ef0", "grade": false, "grade_id": "40_systems-3", "locked": true, "schema_version": 3, "solution": false, "task": false}
from IPython.display import Markdown, display

from mlbook.posttrain.systems import (
    format_memory_table,
    human_bytes,
    rlhf_memory_table,
    rlhf_over_pretraining,
)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "7a85bff3119fa8847fbb70c64439ae64", "grade": false, "grade_id": "40_systems-4", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "demo"]
n_policy = sum(p.numel() for p in policy.parameters())
n_critic = sum(p.numel() for p in critic.parameters())
toy_rows = rlhf_memory_table(n_policy, critic_params=n_critic, reward_params=0)
print(f"toy policy: {n_policy:,} parameters, critic: {n_critic:,} parameters")
display(Markdown(format_memory_table(toy_rows)))

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "7ce4ac654d1a7a9d7162fdc238db68e8", "grade": false, "grade_id": "40_systems-5", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now a 7B policy with a critic, reference and reward model of the same size, the usual
# back-of-envelope setting (decimal units, $1\,\text{GB} = 10^9$ bytes):

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "b5746d62a9aeb9d9a1989427c523e815", "grade": false, "grade_id": "40_systems-6", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
rows_7b = rlhf_memory_table(7e9)
display(Markdown(format_memory_table(rows_7b)))
total_7b = rows_7b[-1]
print(
    f"7B: {total_7b.bytes_per_param:.0f} bytes/param -> {human_bytes(total_7b.total_bytes)} of static state"
)
print(f"pretraining the same 7B model: 16 bytes/param -> {human_bytes(16 * 7e9)}")
print(f"PPO-RLHF / pretraining = 36 / 16 = {rlhf_over_pretraining(7e9):.2f}x")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "082475438dafe052c0bcb951ceec334c", "grade": false, "grade_id": "40_systems-7", "locked": true, "schema_version": 3, "solution": false, "task": false}
# So PPO-RLHF needs $36/16 = 2.25\times$ the static memory of pretraining the same model, and no
# single 80 GB accelerator holds it. The standard ways out:
#
# - **Shard it.** ZeRO stage 3 (DeepSpeed; Rajbhandari et al., 2020, arXiv:1910.02054) or FSDP
#   (PyTorch) partitions weights, gradients and
#   optimiser state of each trained model across the $N$ data-parallel ranks and gathers a layer's
#   weights just before it runs, so static memory per GPU is about $36P/N$ bytes: 252 GB over 8
#   GPUs is about 32 GB each. The frozen pair can be sharded the same way, offloaded to CPU between
#   phases, or placed on their own GPUs (OpenRLHF places the four models on separate GPU groups with
#   Ray by default, and `--train.colocate_all` puts them all, the inference engine included, on the
#   same GPUs, which then take turns).
# - **LoRA.** Train low-rank adapters on a frozen base. The reference is then the base model with the
#   adapters switched off, so it costs nothing extra, and Adam state exists only for the adapters.
#   A critic can be a second adapter (plus a value head) on the same base.
# - **Drop the critic.** GRPO replaces $V(s_t)$ with the mean reward of a group of samples for the
#   same prompt, and divides by the group's reward standard deviation; with a rule-based verifier
#   instead of a reward model only the policy (16) and the
#   reference (2) remain.
#
# The cell below prices these variants for 7B. The LoRA row assumes adapters with 1 % of the base's
# parameters; the exact share depends on the rank and which matrices get adapters.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "2f9dcd439d2863bc0119fc78e8f82a94", "grade": false, "grade_id": "40_systems-8", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
P, lora_share = 7e9, 0.01
variants = {
    "PPO, four full models": 16 + 16 + 2 + 2,
    "GRPO with a reward model (no critic)": 16 + 2 + 2,
    "GRPO with a verifier (policy + reference)": 16 + 2,
    "PPO with LoRA policy and critic on one frozen base": 2
    + 2 * 16 * lora_share
    + 2,  # base, two adapters, RM
}
for name, bytes_per_param in variants.items():
    print(f"{name:<52} {bytes_per_param:5.2f} B/param -> {human_bytes(bytes_per_param * P):>7}")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3fe282d44e1b78e7e545cee00f107482", "grade": false, "grade_id": "40_systems-9", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 4.2 Time: where the seconds of a step go
#
# A PPO step has four phases. This section times them with one definition, the `StepClock` of
# `mlbook.posttrain.systems`:
#
# - **generation**: the sampler's loop, from the prompts to the last sampled token (every decode
#   step, the random draws, the bookkeeping);
# - **forward**: the teacher-forced no-grad passes over the finished batch that record
#   $\log\pi_{\text{old}}$, $\log\pi_{\text{ref}}$ and $V(s_t)$;
# - **reward**: scoring the responses (a reward model, or here a Python function);
# - **update**: every epoch of `ppo_update`, optimiser steps included.
#
# Production reports put most of a step into generation: OpenRLHF's README, for one, says RLHF
# training spends 80 % of its time in the sample-generation stage [OpenRLHF]. Three properties of
# decoding explain why it *can* dominate:
#
# - **It is sequential.** Token $t+1$ cannot start before token $t$ is sampled, so a 1,000-token
#   response is 1,000 dependent forward passes; the training passes see all tokens at once.
# - **It is memory-bound.** Each decode step reads every weight (and the KV cache) from HBM to do
#   about $2P$ FLOPs per sequence in the batch, i.e. roughly $B$ FLOPs per byte for a batch of $B$
#   sequences. An accelerator needs far more than that to be compute-bound (the cell below computes
#   the ratio for an H100), and the KV cache caps $B$ long before that.
# - **It has a tail.** Responses end at different lengths; a static batch waits for its longest
#   sequence while the finished rows idle.
#
# "Can" is not "does". Instead of taking the 80 % on trust, the rest of this section measures the
# split on the toy, builds a model that predicts it from two measured properties of this machine,
# checks the prediction against the measurement, and then asks the same model about a 7B policy.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "155a298612ecec80b0579dc7a23c5c89", "grade": false, "grade_id": "40_systems-10", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
h100_bf16_flops, h100_hbm_bytes_per_s = 989e12, 3.35e12  # H100 SXM: dense bf16, HBM3 [H100]
ridge = h100_bf16_flops / h100_hbm_bytes_per_s
floor_ms = 1e3 * 2 * 7e9 / h100_hbm_bytes_per_s  # read 14 GB of bf16 weights once per step
print(f"FLOPs per byte needed to be compute-bound on an H100: {ridge:.0f}")
print(f"decode does about B FLOPs per weight byte read: memory-bound for B < {ridge:.0f}")
print(f"7B, one GPU: each decode step takes >= {floor_ms:.1f} ms just to stream the weights,")
print(f"so a 1,000-token response needs >= {floor_ms:.1f} s of strictly sequential steps")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "80ab99208b3b0d8a35e33d0b2d4f2c39", "grade": false, "grade_id": "40_systems-11", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now measure the toy. `time_ppo_step` runs one step on copies of your trained `policy` and `critic`
# (a fresh optimiser each time, so nothing in the notebook changes) and reports the median of each
# phase over three repeats. The functions it times are arguments: §3's `collect_rollouts`, the
# reward function, and `ppo_update` (built on your functions) with §3's settings.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "57b0dd3b3647a44ec55092eb09700ba4", "grade": false, "grade_id": "40_systems-12", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
from functools import partial

from mlbook.posttrain.systems import format_time_split, time_ppo_step

update = partial(ppo_update, beta=0.3, cfg=CHAPTER_RUN)  # §3's settings
step_fns = dict(rollout=collect_rollouts, reward_fn=good_count_reward, update=update)
split = time_ppo_step(policy, ref, critic, prompts, max_new_tokens=8, repeats=3, **step_fns)
n_resp = split["response_tokens"]
print(f"one PPO step on the toy: {len(prompts)} prompts, {n_resp:.0f} response tokens")
print(format_time_split(split))

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "107ca4645c8f523e1d838ca3af824bd0", "grade": false, "grade_id": "40_systems-13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# At eight tokens the update dominates. Before changing the response length, fix the sampler.
#
# **The KV cache.** The toy's `sample` has so far been *naive*: every step runs the model over the
# whole prefix and keeps only the last position's logits. Step $t$ therefore costs about $t$ token
# passes, and a response of $n$ tokens about $n^2/2$. Yet in a causal model the keys and values of
# earlier positions never change when a token is appended. A KV cache keeps them, one
# $(B, H, t, d/H)$ pair per layer: the prompt runs once (the *prefill*), then each step feeds only
# the newest token, stores its key and value, and lets its query attend over the cache. Every
# production sampler works this way. `sample(..., use_cache=True)` is the toy's version; with the
# same generator it draws the same tokens, and its log-probs agree with the naive ones to float
# rounding, which the cell checks on the trained policy.
#
# *How* the cache grows matters as much as having one. Appending with `torch.cat` allocates a new
# tensor one position longer and copies the whole cache into it at every step, so the copies alone
# cost $O(n^2)$ bytes again. `KVCache` instead allocates each layer's buffers once, for every
# position the call can reach ($P + n$), writes each new key and value into the next free column,
# and hands attention a view of the filled part. The sampler's own tokens, mask and log-probs are
# preallocated the same way. (Paged attention in vLLM goes one step further and allocates the cache
# in fixed-size blocks on demand, so that rows of different lengths waste no memory; Kwon et al.,
# 2023.)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "9c7e2a0696dbf48b76cf42a10cd61d6d", "grade": false, "grade_id": "40_systems-14", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
from mlbook.posttrain.toy_lm import sample

naive, cached = (
    sample(policy, prompts, 8, END_ID, generator=torch.Generator().manual_seed(0), use_cache=c)
    for c in (False, True)
)
gap = (naive.logprobs - cached.logprobs).abs().max()
print(f"same tokens: {torch.equal(naive.tokens, cached.tokens)}; largest log-prob gap: {gap:.1e}")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "74001cce9491158b98e74d872f84f7c4", "grade": false, "grade_id": "40_systems-15", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **How fast can a cache make sampling?** Two bounds, one from counting and one from the clock. The
# naive sampler's step $t$ processes all $t$ positions, the cached one a single position, so for a
# prompt of $P$ tokens and $n$ new ones the naive sampler does $\sum_{t=P}^{P+n-1} t / n = P + (n-1)/2$
# times the token passes. That would be the speed-up if time were proportional to work. It is not on
# the toy: each decode step also pays a fixed cost (Python, operator dispatch, the sampling itself)
# that no cache removes. The honest bound is therefore measured: a sampler whose every step is a
# forward pass over **one** token and nothing else (it attends to no past, so its samples are
# meaningless) is as fast as any cached sampler can be. The cell times the naive sampler, the cached
# one and that floor at batch 64 and 64 new tokens (a short warm-up, then the median of three), and
# prints both bounds and how close the cache comes to the measured one. `make bench` repeats this
# with more repeats, and at batch 16 and 128 too.
#
# Because a cached step is a few dozen small operations, what each operation costs outside its
# arithmetic decides the result, and `sample` trims it where that changes nothing in the output: the
# loop runs under `torch.inference_mode()`, which records nothing for autograd (cheaper per
# operation than `no_grad`); the new key and value are written with one copy per layer, into one
# buffer that holds both; and a token is drawn with the race `torch.multinomial` itself runs for one
# draw (divide each probability by its own Exp(1) variable, take the largest), the same draws for
# the same generator without the input checks multinomial repeats at every step. One check that
# the log-probs are finite, after the loop, replaces them.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "98d3d7920914c16f86f71439214af028", "grade": false, "grade_id": "40_systems-16", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "demo"]
kv_P, kv_n = prompts.shape[1], 64
kv_work_bound = sum(range(kv_P, kv_P + kv_n)) / kv_n
print(
    f"prompt {kv_P}, {kv_n} new tokens: the naive sampler does {kv_work_bound:.1f}x the token passes"
)

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "7c73730981f9b3abb9d8937963a8a4a7", "grade": false, "grade_id": "40_systems-17", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
from mlbook.posttrain.systems import time_samplers, times_phrase
from mlbook.posttrain.toy_lm import ToyLMConfig, build_models

kv_models = build_models(seed=0, batch=64, cfg=ToyLMConfig(max_len=kv_P + kv_n))
kv = time_samplers(kv_models.policy, kv_models.prompts, kv_n, repeats=3)
print(
    f"naive {1e3 * kv['naive']:.0f} ms, cached {1e3 * kv['cached']:.0f} ms, one-token floor "
    f"{1e3 * kv['floor']:.0f} ms (medians of 3 after a short warm-up)"
)
print(
    f"the cache samples {times_phrase(kv['naive'] / kv['cached'])} than the naive sampler; bound from the one-token floor: "
    f"{kv['naive'] / kv['floor']:.1f}x; the cache reaches {kv['floor'] / kv['cached']:.0%} of it"
)
kv_cfg = kv_models.policy.cfg
kv_bytes = 2 * kv_cfg.n_layers * kv_models.prompts.shape[0] * (kv_P + kv_n) * kv_cfg.d_model * 4
print(f"the full cache: {kv_bytes / 2**20:.1f} MiB of fp32 keys and values")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "93319ac86643ff267c6d3c8982c7c7f5", "grade": false, "grade_id": "40_systems-18", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The gap between the cache and the floor is exactly the work the floor skips: storing each new key
# and value, and letting the query attend over every cached position instead of one. Both grow
# with the batch; the cell above printed how many bytes of keys and values the full cache holds,
# read again by every late step, and on a small CPU that is a sizeable part of a step. How far apart the
# two bounds and the cache sit depends on the machine: a faster core shrinks the fixed cost of each
# operation and raises the bound, a larger batch gives the naive sampler more work to repeat (`make
# bench` prints batch 16 and 128). Neither bound describes a real LLM, whose decode steps are
# dominated by streaming the weights, as the 7B estimate earlier in this section showed.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "e96f6b45018aa3f90cfe865644e31cc1", "grade": false, "grade_id": "40_systems-19", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **The sweep.** The trained policy's context holds 32 positions, so the sweep builds fresh models
# with a longer one, `ToyLMConfig(max_len=72)` (untrained weights cost the same time as trained
# ones), and switches stopping off (`eos_id=None`), so every response has exactly the length asked
# for. One untimed pass first pays the one-off costs (allocations, first calls), then each length
# and sampler is timed three times on 32 prompts and the median kept. That is still a small sample
# on a machine that may be shared: `make bench` runs lengths 8 to 128 on 64 prompts.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "4f397807a95128582099c47b8158b849", "grade": false, "grade_id": "40_systems-20", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
from mlbook.posttrain.systems import format_sweep, share_verdict, sweep_time_split
from mlbook.posttrain.toy_lm import ToyLMConfig, build_models

sweep_cfg = ToyLMConfig(max_len=72)
sw_models = build_models(seed=0, batch=32, cfg=sweep_cfg)  # policy, ref, critic, prompts, gen
sw_prompts = sw_models.prompts
lengths = (8, 32, 64)
sweep_time_split(*sw_models[:4], lengths[:1], repeats=1, warmup=0, **step_fns)  # warm-up, discarded
rows = sweep_time_split(*sw_models[:4], lengths, repeats=3, warmup=0, **step_fns)  # medians of 3
display(Markdown(format_sweep(rows, markdown=True)))
gen_s = {(r["new_tokens"], r["sampler"]): r["seconds"]["generation"] for r in rows}
print(
    "the KV cache generates "
    + ", ".join(f"{times_phrase(gen_s[n, 'naive'] / gen_s[n, 'cached'])} at {n}" for n in lengths)
    + " new tokens"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "0334235903d6c06d47a361dea988dd2d", "grade": false, "grade_id": "40_systems-21", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **A roofline model.** Why these numbers? Price every pass of the step with the roofline
# (Williams et al., 2009): a matmul takes the longer of its arithmetic at the machine's FLOP rate and
# reading its operands (weights, cached keys and values) at its memory bandwidth; the elementwise
# kernels (LayerNorm, GELU, residual adds) only stream activations, at the bandwidth. A decode step
# with a cache processes one new position per row over a growing context; a naive step re-runs the
# whole prefix; the update is three forwards' worth (forward and backward) per epoch for the policy
# and the critic, plus Adam. `mlbook.posttrain.roofline` counts the FLOPs and bytes of each pass.
#
# A roofline alone would predict a small fraction of the toy's measured time, because it ignores
# what a CPU running PyTorch eagerly pays per operation: Python and operator dispatch, the same
# whatever the tensor size. The model therefore adds a **fixed latency** per phase. Everything is
# calibrated on this machine and nothing on the sweep's measurements: the FLOP rate from a
# 512x512 matmul, the bandwidth from copying 64 MB, and the latencies from two steps with a single
# prompt (4 and 16 tokens), where the arithmetic is negligible, each timed as the median of three
# after an untimed warm-up step. The cell prints the constants and then the
# prediction beside the measurement.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "c6f556e3ac7a14c0eb105b7a133d5cbd", "grade": false, "grade_id": "40_systems-22", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo", "raises-exception"]
import io

from IPython.display import Image

from mlbook.posttrain.roofline import Shape, measure_machine
from mlbook.posttrain.systems import calibrate_latency, predicted_split

machine = measure_machine()
toy_shape = Shape(sweep_cfg.n_layers, sweep_cfg.d_model, sweep_cfg.vocab_size)
sw_policy, sw_ref, sw_critic = sw_models[:3]
latency = calibrate_latency(
    sw_policy,
    sw_ref,
    sw_critic,
    sw_prompts[:1],
    toy_shape,
    machine,
    epochs=4,
    repeats=3,
    warmup=1,
    **step_fns,
)  # a warm-up step, then the median of three, for each of the four calibration steps
print(
    f"this machine: {machine.flop_rate / 1e9:.0f} GFLOP/s (fp32 matmul), {machine.bandwidth / 1e9:.1f} GB/s "
    f"(copy), compute-bound above {machine.ridge:.1f} FLOPs/byte"
)
print(
    "latency: "
    + "; ".join(
        f"{name} sampler {1e3 * lat.decode_step:.2f} ms per decode step, "
        f"{1e3 * lat.update:.0f} ms per update"
        for name, lat in latency.items()
    )
)
for r in rows:
    r["predicted"] = predicted_split(r, toy_shape, machine, 4, latency)
display(Markdown(format_sweep(rows, [r["predicted"] for r in rows], markdown=True)))
share_ratio = {
    sampler: [
        r["predicted"]["fractions"]["generation"] / r["fractions"]["generation"]
        for r in rows
        if r["sampler"] == sampler
    ]
    for sampler in ("naive", "cached")
}
for sampler, ratios in share_ratio.items():
    print(f"{sampler} sampler: the model's generation share {share_verdict(ratios)}")
pred_gen = {(r["new_tokens"], r["sampler"]): r["predicted"]["seconds"]["generation"] for r in rows}
print(
    "the model predicts the cache "
    + ", ".join(
        f"{times_phrase(pred_gen[n, 'naive'] / pred_gen[n, 'cached'])} at {n}" for n in lengths
    )
    + " new tokens"
)
step_ratio = [r["predicted"]["total_s"] / r["total_s"] for r in rows]
fixed = [r["predicted"]["latency_share"] for r in rows]
print(
    f"predicted / measured step time: {min(step_ratio):.2f} to {max(step_ratio):.2f}; fixed latency is "
    f"{min(fixed):.0%} to {max(fixed):.0%} of the predicted step; the toy's weights: "
    f"{toy_shape.params * toy_shape.bytes_per_value / 1e6:.2f} MB"
)

fig, ax = plt.subplots(figsize=(6, 3.4))
for sampler, color in (("naive", "tab:red"), ("cached", "tab:blue")):
    mine = [r for r in rows if r["sampler"] == sampler]
    n = [r["new_tokens"] for r in mine]
    measured = [r["fractions"]["generation"] for r in mine]
    model = [r["predicted"]["fractions"]["generation"] for r in mine]
    ax.plot(n, measured, "o-", c=color, label=f"{sampler}: measured")
    ax.plot(n, model, "--", c=color, label=f"{sampler}: roofline model")
ax.set_xlabel("response length (new tokens)")
ax.set_ylabel("generation share of a step")
ax.set_ylim(0, 1)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
buf = io.BytesIO()
fig.savefig(buf, format="png", dpi=100)
plt.close(fig)
alt = (
    "Line chart: share of a toy PPO step spent generating, against response length 8 to 64 "
    "tokens, for the naive and the KV-cached sampler, measured (solid) and predicted by the "
    "roofline model (dashed). The naive sampler's share climbs steeply with length; the cached "
    "sampler's stays lower."
)
display(Image(buf.getvalue(), metadata={"alt": alt}))

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "1014444f259637a0c1a11fcfd9839eb8", "grade": false, "grade_id": "40_systems-23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# What the toy shows, and what it cannot:
#
# - **The cache changes the growth law.** Without it generation grows roughly quadratically with
#   the response length and soon rivals the update; with it each step costs about the same and
#   generation grows linearly. How much the cache saves depends on the length: at 8 tokens a
#   naive step re-reads a prefix of at most a dozen positions, so there is little to save, and the
#   saving grows with every token added. The model's speed-ups grow with the length by
#   construction; the measured ones, printed by the sweep cell, are medians of three on whatever
#   this machine is doing, and at 8 tokens the measurement can even come out below 1 (the cell
#   then says "slower").
# - **How well the model predicts the split is a measurement, not a given.** The cell states, per
#   sampler, whether the predicted generation share matches the measured one to within 20 %, sits
#   above it, sits below it, or does neither consistently, and it prints the same comparison for
#   the whole step's time. Across machines and runs these verdicts change: the
#   calibration is four short timed steps on a one-prompt batch, and the sweep's own timings move
#   with the load on the machine. Two mechanisms pull in opposite directions, which is why no
#   sentence here fixes the direction. The matmuls are 32 wide, far too thin to reach the FLOP rate
#   of a 512x512 matmul, so the roofline prices arithmetic below what it costs (a roofline is a
#   ceiling); that makes the update, the phase with the most arithmetic, look cheaper than it is.
#   The fixed latency, on the other hand, is fitted on a batch of one, and what an operator costs
#   outside its arithmetic grows a little with the batch, which makes generation, the phase with
#   the most operators, look cheaper too.
# - **The toy is latency-bound, not memory-bound.** The fixed latency is a large part of every
#   predicted step (the cell prints the range). The toy therefore cannot show the mechanism that
#   makes production decoding slow, streaming gigabytes of weights per token: its weights fit in
#   a CPU cache (the cell prints their size). For that, point the same model at a real size.
#
# **A 7B policy on an H100.** Take a Llama-2-7B-shaped model in bf16 (32 layers, width 4096, gated
# MLP of width 11008, 32,000-token vocabulary), a critic, reference and reward model of the same
# shape, 512-token prompts and 512-token responses, one PPO epoch, and the H100's datasheet rates
# (989 TFLOP/s dense bf16, 3.35 TB/s). No latency term: this is the ideal machine. The batch is the
# free parameter that matters, because it sets the FLOPs done per weight byte read in decoding, and
# the KV cache limits it.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "6f9f5a55b8351c16474c839379ab9364", "grade": false, "grade_id": "40_systems-24", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
from mlbook.posttrain.roofline import Machine, predict_step, shares

h100 = Machine("H100 SXM (datasheet)", h100_bf16_flops, h100_hbm_bytes_per_s)
llama7b = Shape(
    n_layers=32, d_model=4096, vocab=32_000, d_ff=11_008, bytes_per_value=2, mlp_matrices=3
)
P7, n7 = 512, 512  # prompt and response tokens
kv_gb = 2 * llama7b.n_layers * llama7b.d_model * 2 * (P7 + n7) / 1e9  # keys + values, bf16
print(f"{llama7b.params / 1e9:.2f}B parameters; KV cache {kv_gb:.2f} GB per {P7 + n7}-token row")


def predict_7b(batch, epochs=1):
    """Seconds per phase: policy, reference, critic forwards; a reward model; KV-cached decoding."""
    return predict_step(
        llama7b, h100, batch, P7, n7, epochs, cached=True, n_scoring=3, reward_passes=1
    )


print(f"{'batch':>5} {'KV GB':>6} {'gen s':>6} {'fwd s':>6} {'RM s':>5} {'update s':>8} {'gen':>5}")
share_7b = {}
for B in (8, 32, 64, 128):
    sec = predict_7b(B)
    share_7b[B] = shares(sec)["generation"]
    print(
        f"{B:>5} {B * kv_gb:>6.1f} {sec['generation']:>6.2f} {sec['forward']:>6.2f} "
        f"{sec['reward']:>5.2f} {sec['update']:>8.2f} {share_7b[B]:>5.0%}"
    )
openrlhf_share = 0.80  # OpenRLHF README: "80% of the time on the sample generation stage"
print(f"published (OpenRLHF): {openrlhf_share:.0%}; this model at batch 64: {share_7b[64]:.0%}")
print(f"with 4 PPO epochs instead of 1, batch 64: {shares(predict_7b(64, 4))['generation']:.0%}")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "5a9839a5f30a5db35334ce24e12e0328", "grade": false, "grade_id": "40_systems-25", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The model and the published figure disagree: even at a small decode batch the ideal H100 spends
# less of the step generating than the 80 % reported, and at the batch sizes where the KV cache
# still fits comfortably it predicts well under half. The reasons are what the model leaves out,
# and each one points the same way:
#
# - **A roofline is a ceiling, and the phases sit at different distances from it.** Large training
#   matmuls reach a good fraction of peak FLOPs; decoding rarely reaches its bandwidth ceiling,
#   because each step launches hundreds of small kernels (the toy's latency term, smaller but not
#   zero on a GPU) and, in training frameworks, uses an unfused attention and no CUDA graphs. That
#   multiplies generation's time, not the update's, and is exactly what inference engines fix.
# - **The decode batch is smaller than it looks.** The policy's training state, the other models
#   and the activations compete for the same memory, so the KV cache and with it $B$ shrink; the
#   table shows generation's share rising as $B$ falls. With fully sharded training (ZeRO-3, or
#   FSDP, the one Llama 2's report names) the weights must also be gathered before decoding.
# - **Lengths vary.** A static batch runs until its longest response ends, so the model's uniform
#   512 tokens understate generation; long reasoning traces make it worse.
# - **The figure comes without its setting.** OpenRLHF states the share without the model size,
#   lengths, hardware or epochs behind it, so the comparison is about which phase dominates and
#   roughly by how much, not about digits.
#
# The toy and the 7B model agree on the lesson that carries over: generation's share is set by how
# many FLOPs each weight byte serves (the batch) and by how long responses are, and a sampler that
# re-reads its whole prefix, the naive one here, turns a linear cost into a quadratic one.
#
# Sources for this section: [OpenRLHF] the OpenRLHF README (github.com/OpenRLHF/OpenRLHF, the
# "vLLM Inference Acceleration + AutoTP" item of its feature list; older READMEs put the same
# sentence under "High performance"), from the authors of Hu et al. (2024), *OpenRLHF: An Easy-to-use, Scalable and
# High-performance RLHF Framework*, arXiv:2405.11143; [H100] NVIDIA H100 Tensor Core GPU datasheet,
# SXM5 column (dense BF16 is half the listed with-sparsity figure); Williams, Waterman and Patterson
# (2009), *Roofline: an insightful visual performance model for multicore architectures*, CACM 52(4).
#
# Production stacks therefore move rollouts to an inference engine (vLLM, whose PagedAttention
# (Kwon et al., 2023, arXiv:2309.06180) pages the KV cache, or SGLang; both batch continuously),
# copy the new weights into it after every update, and often overlap
# generation for step $k+1$ with training on step $k$ (Noukhovitch et al., 2024, arXiv:2410.18252,
# study this asynchronous RLHF). That overlap makes the data one update stale. PPO's "old policy"
# does two jobs, and stale data can be handled in two ways that differ in which job each copy does:
#
# 1. **One old policy.** Record $\log\pi_{\text{old}}$ under the weights that actually sampled (§3's
#    `sampler=` argument). The ratio $\pi_\theta/\pi_{\text{old}}$ then both corrects for the lag and
#    anchors the clip, so the lag already uses up part of the band before the first step.
# 2. **Decoupled.** Recompute the log-probs with the policy as it is when the update starts, the
#    *proximal* policy, and clip around those; multiply each token's term by a separate behaviour
#    weight $\pi_{\text{prox}}/\pi_{\text{behav}}$, which carries the correction (the decoupled
#    objective of Hilton, Cobbe and Schulman, 2022, arXiv:2110.00641). The clip then bounds only the
#    step this update takes. Truncating that weight to a range is a separate, older device: V-trace
#    (Espeholt et al., 2018, arXiv:1802.01561) truncates importance weights to bound their variance,
#    and OpenRLHF's correction below clamps them the same way; it is not part of Hilton et al.'s
#    objective. `PPOConfig(behaviour_clip=(lo, hi))` switches `ppo_update` to this form, and
#    exercise 5 measures both designs on the toy, with the sampler one and four updates behind.
#
# The second design is what the fully asynchronous systems of 2025 are built on. AReaL (Fu et al.,
# 2025, arXiv:2505.24298) lets its rollout workers generate without waiting for the trainer, which
# trains on whatever batch is ready; it trains with the decoupled objective, using the policy from
# before the current update as the proximal one, and it sets a maximum staleness, the number of
# policy versions the sampler may run behind, trading throughput against how off-policy the data
# may get. PipelineRL (Piché et al., 2025, arXiv:2509.19128) goes further: new weights
# are loaded into the inference engine *while* sequences are being generated, so one response can be
# written by several consecutive policies, and the data stays close to on-policy without the engine
# ever idling for a weight update. In both, the record of which weights produced each token, and the
# behaviour weight computed from it, is what keeps the update correct.
#
# What is *not* fine is the middle ground: recomputing the log-probs and dropping the weight, which
# quietly turns the update into an uncorrected off-policy step (§4.3's table). A second, subtler gap
# remains even in synchronous training: at the same weights an inference engine's kernels do not
# reproduce the trainer's numbers exactly. Different kernels, reduction orders, lower precision in
# the engine (bf16 sampling for an fp32 or mixed-precision trainer) and, in mixture-of-experts
# models, a different expert routing for the same token make $\pi_{\text{engine}}$ and
# $\pi_{\text{train}}$ two distributions, so "on-policy" data is slightly off-policy. Yao et al.
# (2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl)
# measured this gap in production stacks and proposed the truncated importance-sampling (TIS) fix:
# multiply each token's loss by $\pi_{\text{train}}/\pi_{\text{engine}}$, clamped. OpenRLHF (v0.11.0)
# recomputes $\log\pi_{\text{old}}$ in the trainer and, with `--algo.advantage.is_correction_enable`,
# applies one of three forms chosen by `--algo.advantage.is_correction_type`, all with the band
# `--algo.advantage.is_correction_threshold` $= [0.5, 5]$ by default (`openrlhf/models/loss.py`):
# `tis` clamps the per-token ratio into the band; `icepop` keeps the ratio where it lies inside the
# band and sets the token's loss to zero outside it (IcePop, from the Ring-1T report, Ling Team,
# 2025, arXiv:2510.18855); `seq-mask-tis` drops whole responses whose geometric-mean ratio leaves the
# band and weights the rest per token. It logs the gap as `vllm_kl`; the same code serves its
# asynchronous mode. The cell below builds the smallest such mismatch. A small model with peaked
# next-token distributions (fixed seed, weights drawn in float64) plays the policy; the engine is a
# copy whose weights and every layer's output are rounded to bf16, or to fp16, as a low-precision
# kernel writes its results; the engine samples and the trainer scores the same tokens in float64.
# Emulating the rounding in float64 rather than calling the CPU's own bf16 kernels keeps every
# number in the table the same on every CPU.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "9241ab639b741ce87e45067954c2b588", "grade": false, "grade_id": "40_systems-26", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "demo"]
from mlbook.posttrain.systems import precision_mismatch
from mlbook.posttrain.toy_lm import TinyCausalLM, ToyLMConfig, default_dtype, make_prompts

with default_dtype(torch.float64):  # float32 normal_ draws differ between instruction sets
    torch.manual_seed(0)
    mm_model = TinyCausalLM(ToyLMConfig(init_std=0.3))  # peaked next-token distributions
mm_prompts = make_prompts(64, torch.Generator().manual_seed(0))  # (64, 2)
mm_rows = [
    "| engine | response tokens | mean, max abs log-prob gap | vllm_kl | tokens outside [0.5, 5] "
    "| per-response geometric-mean ratio |",
    "|---|---|---|---|---|---|",
]
mm_by_dtype = {}
for mm_name, mm_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    mm = precision_mismatch(
        mm_model,
        mm_prompts,
        8,
        engine_dtype=mm_dtype,
        generator=torch.Generator().manual_seed(0),
        emulate=True,
    )
    mm_by_dtype[mm_name] = mm
    mm_rows.append(
        f"| {mm_name}, scored in float64 | {mm['tokens']:.0f} | {mm['mean_abs']:.1e}, {mm['max_abs']:.1e} "
        f"| {mm['kl']:+.1e} | {mm['outside_band']:.1%} "
        f"| {mm['seq_ratio_min']:.4f} to {mm['seq_ratio_max']:.4f} |"
    )
display(Markdown("\n".join(mm_rows)))
print(
    "mean gap, bf16 engine / fp16 engine: "
    f"{mm_by_dtype['bf16']['mean_abs'] / mm_by_dtype['fp16']['mean_abs']:.0f}x"
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "deddae4004dbcb537375f83195bd9730", "grade": false, "grade_id": "40_systems-27", "locked": true, "schema_version": 3, "solution": false, "task": false}
# On the toy the gap is real but small (the table prints it): bf16 has an 8-bit significand, two to
# three decimal digits, each log-prob moves by far less than the band allows, and no token comes near the band's
# edges, so on eight-token responses every correction above is a no-op. The same effect grows into
# a training instability at scale: thousands of tokens per response (a sequence-level ratio
# multiplies thousands of per-token ones), vocabularies of 100k tokens whose tail probabilities
# bf16 rounds hardest, and expert routing that can flip between engine and trainer.
# fp16 spends the same 16 bits on an 11-bit significand and a narrower exponent range; the table's
# second row shows what that buys at equal weights, and Qi et al. (2025, arXiv:2510.26788) found that
# running both engine and trainer in fp16 instead of bf16 shrinks the mismatch enough to remove much
# of the instability that the corrections above were built to tame (the narrower range then needs
# loss scaling). For mixture-of-experts models the router is a mismatch of its own: the engine and
# the trainer can send a token to different experts, and routing replay records the engine's
# choices during sampling and reuses them in the trainer's forward pass (Rollout Routing Replay,
# arXiv:2510.11370). Llama 2's
# report describes one more cost of sampling inside the trainer: with FSDP, sampling was very slow
# until the full weights were gathered onto each node once before generation and freed afterwards.
#
# ### 4.3 Failure modes: symptom, cause, fix
#
# Read the diagnostic column first: most symptoms have two or three causes, and the cheap check
# that separates them is what an experienced practitioner reaches for.
#
# | Symptom | Likely cause | How to confirm | Fix |
# |---|---|---|---|
# | Reward climbs, samples get worse (longer, formulaic, sycophantic) | Over-optimisation: the policy exploits the reward model off its training distribution | Fresh human or strong-judge labels on current samples; length drift; disagreement within an RM ensemble (Coste et al., 2023; Eisenstein et al., 2023: it helps, but members that share an error agree on it) | Lower KL target / raise $\beta$; stop earlier; refresh the RM on current samples; optimise an RM ensemble's worst case or uncertainty-penalised mean (Coste et al., 2023); length penalty or length-controlled RM |
# | KL to the reference explodes in the first tens of steps | Step too large: LR too high, $\beta$ too small, too many PPO epochs or minibatches | Approx-KL $\mathbb E[r-1-\log r]$ between old and new policy per epoch; clip fraction high from epoch 1 | Lower LR; 1-2 epochs; adaptive KL controller; early-stop the epochs on approx-KL |
# | Reward flat **and** clip fraction $\approx 0$ | The policy barely moves: LR too low, advantages near zero, or the signal never reaches the tokens | Histogram of advantages; is the score landing on a response token (see the off-by-one row)?; gradient norm | Raise LR; check masks and score placement; normalise the RM's scale once (a fixed gain/bias on SFT samples) rather than per-batch reward whitening, which in Huang et al. (2024) won fewer comparisons and wrote shorter completions (about even once length is controlled) |
# | Value loss dwarfs the policy loss, training unstable | Critic far from the returns: random or poorly matched init, large reward scale | Explained variance of $V$ vs returns; value-loss share of the total | Initialise the critic from the RM; warm it up with the policy frozen; clip values; lower `vf_coef`; separate optimiser or gradient clip for the critic |
# | Entropy collapses, many prompts get the same answer | The policy-gradient step itself drains entropy: raising already-likely tokens that scored well lowers entropy by the covariance of $\log\pi$ and $\hat A$ (Cui et al., 2025; §5); a weak KL lets it run, a reward that favours one template speeds it | Per-token entropy over training; distinct-$n$ of samples; that covariance per batch | Tighten the anchor: raise $\beta$ or *lower* the KL target (a higher target loosens it); clip-higher (DAPO: a larger upper clip, so unlikely tokens can grow); Clip-Cov or KL-Cov on the few highest-covariance tokens (arXiv:2505.22617); at most a *small* entropy bonus (a large one spreads mass over a 100k-token vocabulary) |
# | Loss taken on prompt tokens or after EOS | Missing or misaligned response mask (the mask must be shifted with the log-probs) | Appending padding to a batch changes the loss | Mask everything outside the response in every loss, the KL and the whitening statistics |
# | KL to the reference drifts with asynchronous rollouts although every first-epoch ratio is exactly 1 | Off-policy drift hidden by bookkeeping: samples from stale weights, $\log\pi_{\text{old}}$ recomputed with the current ones, and *no behaviour weight* to carry the correction | Is there a $\pi_{\text{prox}}/\pi_{\text{behav}}$ factor in the loss? Compare the recomputed log-probs with those recorded at sampling; their gap is the missing weight (exercise 5 prints it) | Either record $\log\pi_{\text{old}}$ under the weights that sampled, or keep the recomputation and add the truncated behaviour weight (decoupled PPO, §4.2); cap staleness either way |
# | KL to the reference persistently and clearly negative (a small negative batch mean is noise: only the expectation of $k_1$ is $\ge 0$) | Impure sampling: top-$k$/top-$p$, a suppressed EOS or other logit processors, a temperature used in one place only, or greedy decoding (DeepSpeed-Chat decodes greedily for Llama models) make the sampled distribution differ from the one you score | Compare the log-probs recorded while sampling with recomputed ones; does the mean stay below zero for many steps, beyond its batch-to-batch spread? | Sample from the exact distribution you score (plain temperature sampling), or score the processed distribution |
# | KL and ratios slightly off everywhere | Temperature applied while sampling but not when computing log-probs | Same comparison, off by a constant factor in the logits | Divide the logits by the same temperature in every log-prob computation |
# | Ratio $\neq 1$ on the first minibatch of the first epoch | Non-deterministic forward: dropout left on, different padding or position ids between rollout and update | $\max\vert\log\pi_\theta - \log\pi_{\text{old}}\vert$ before any step (§3's `ppo_update` raises on it) | Disable dropout; identical padding side, attention mask and position ids in both passes |
# | Reward has no effect or the wrong sign on some rows | Score off by one: placed on a PAD position that the masks then zero out, instead of the last response token (TRL's deliberate slot after EOS is another matter, see §5) | Print the column where the score lands next to the decoded tokens | Index the last position where the response mask is 1 |
# | Model never learns to stop; lengths run to the maximum | `pad_token == eos_token`: masking padding also masks the real EOS, so stopping is never rewarded or penalised | Is EOS inside the response mask? | A distinct pad id, or build the mask from positions rather than token ids |
# | 1-GPU and 8-GPU runs disagree; $\beta$ differs across ranks | Statistics computed per rank: advantage whitening, the controller's KL, token-mean losses | Log $\beta$ and the KL on every rank | All-reduce (sum, sum of squares, count) and the KL before use; normalise losses by the global token count |
#
# **Clip fraction is not one quantity.** §3's `ppo_clip_loss` (like CleanRL) counts tokens with
# $|r_t - 1| > \epsilon$. TRL and OpenRLHF count tokens where the *clipped branch is the one the
# $\min$ picks*, i.e. only ratios past the bound the advantage favours; tokens that moved the
# "wrong" way are unclipped and not counted. Their number is never larger than ours, and on the
# chapter's own run it is clearly smaller (§3.6 prints both, step by step and on average), so
# compare a clip fraction only with one computed the same way.
#
# ### 4.4 When to use what
#
# | Method | Needs | Models held during training | Strengths | Weaknesses | Pick it when |
# |---|---|---|---|---|---|
# | PPO (this chapter) | A scalar reward model, prompts | 4: policy, critic (trained); reference, RM (frozen) | On-policy, token-level credit through the critic; tuned with care, it beat DPO across dialogue and code benchmarks (Xu et al., 2024), while against critic-free RLOO and GRPO the evidence is mixed (Ahmadian et al., 2024, report RLOO ahead; §4.5's toy ties) | Most memory and infrastructure; many knobs; critic can destabilise | You have a good RM, the budget for four models, and the proxy reward still has headroom |
# | DPO | Preference pairs | 2: policy (trained), reference (frozen; log-probs can be precomputed) | Supervised-style loss, stable, cheap; no sampling during training | Offline: learns only from the pairs it is given; can drift from the data; iterate with fresh on-policy pairs to recover much of the gap (Tajwar et al., 2024, arXiv:2404.14367) | Pairs only, limited compute, or very large models (Llama 3's choice) |
# | GRPO / RLVR | A verifiable reward (tests, exact answers) or an RM; several samples per prompt | 2-3: policy (trained), reference, optional RM | No critic; the group mean is the baseline; suits long reasoning traces with a sparse end reward | $k$ samples per prompt multiplies generation; sequence-level credit only | Rewards can be checked by a program and responses are long |
# | Rejection sampling + SFT (best-of-$N$) | An RM; an SFT pipeline | 1 trained at a time; the RM only scores | Trivial to run on any SFT stack; KL to the sampler at most $\log N - (N-1)/N$ (an upper bound, Beirami et al., 2024); explores broadly | Only reinforces whole winning samples; gains plateau | First round of any RLHF effort, or as the warm start before PPO (Llama 2) |

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "c75556fa64803eaeeac03286fc0a7c5a", "grade": false, "grade_id": "45_critic_free-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 4.5 Without a critic: RLOO and GRPO next to GAE, measured
#
# In §3 the critic has one job: a baseline $V(s_t)$ that lowers the variance of the advantage
# without biasing it. It costs a second trained network (16 bytes per parameter in §4.1's
# accounting) and a second forward and backward pass per epoch. When every prompt gets several
# samples, the other samples of the same prompt provide a baseline for free, and two methods built
# on that idea are now common:
#
# - **RLOO** (REINFORCE leave-one-out; Ahmadian et al., 2024): draw $k$ responses per prompt, and
#   give response $i$ the advantage $A_i = R_i - \frac{1}{k-1}\sum_{j \ne i} R_j$. The baseline does
#   not contain $R_i$, so it stays unbiased; $A_i$ applies to every token of the response. The
#   authors report that REINFORCE-style methods, RLOO among them, outperform PPO (and DPO) on their
#   RLHF benchmarks while dropping the critic.
# - **GRPO** (Shao et al., 2024, DeepSeekMath): the same groups, with the group's mean subtracted
#   **and its standard deviation divided out**, $A_i = (R_i - \operatorname{mean}_j R_j)/\operatorname{std}_j R_j$,
#   so every prompt contributes advantages of unit scale whether its rewards spread widely or
#   barely. DeepSeekMath puts the KL to the reference in the loss (the $k_3$ estimator) rather
#   than in the reward.
#
# The comparison below has six arms. Every arm draws 64 responses per step (GAE: 64 prompts; the
# others: 16 prompts, $k = 4$ each) and runs for 40 steps on three seeds; the sweep is cached like
# §3.8's. The first three change only the advantage, and their names say what they are:
#
# - **PPO: critic + GAE** is §3's algorithm with a fixed $\beta = 0.3$.
# - **PPO-clip, RLOO advantage** and **PPO-clip, group-normalised advantage** put RLOO's and GRPO's
#   advantages into *PPO's* update: the same per-token KL fee in the reward, four clipped epochs
#   per batch, one token mean over the whole batch, and the advantages whitened over the batch's
#   response tokens exactly as the GAE arm's are, so all three start from advantages of the same
#   scale. Neither is the algorithm its paper describes. Ahmadian et al.'s RLOO is REINFORCE: one
#   unclipped gradient step per batch. And with a token mean over the batch, GRPO's length bias
#   (below) cannot appear.
#
# Three more arms use the published objectives, with everything else (samples, epochs, clip,
# learning rate, $\beta$) kept at the chapter's settings, which are not DeepSeekMath's:
#
# - **GRPO's objective, chapter's settings** (the objective of Shao et al., 2024): the
#   group-normalised advantage of the score alone,
#   the KL to the reference as a $k_3$ term *in the loss* with coefficient $\beta$, and each
#   response's token terms averaged within the response before averaging over responses. That
#   per-response mean gives every token of a long response less weight than a token of a short
#   one, in the gradient that rewards and in the one that punishes. DeepSeekMath ran it with a KL
#   coefficient of 0.04 and a single policy update per batch of samples, so that the ratio stays 1
#   and the clip never acts; this arm keeps the chapter's $\beta = 0.3$ and four clipped epochs. It
#   is the objective as published, not the run as published.
# - **The same, no division by the group std**: an ablation that changes one thing, the advantage
#   becomes the score minus its group mean, so the table can show which part of the objective sets
#   the arm's KL.
# - **Dr. GRPO** (Liu et al., 2025, arXiv:2503.20783) removes the two terms its authors found
#   biased: no division by the group's standard deviation, and no division by the response's length
#   (the token terms are summed and divided by a constant, the batch size times the longest
#   allowed response). The $k_3$ term stays, so that only those two terms change; against the
#   ablation above it differs in the length normalisation alone.
#
# One asymmetry remains, and it favours the critic-free arms a little: the GAE arm trains policy and
# critic with one Adam optimiser and clips the gradient norm at 1 over *both* networks' gradients
# together, so a large value-loss gradient shrinks the policy's step too; the other arms clip the
# policy's gradient alone. Every arm records its mean response length per step.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "ccfc5545af03543bcc8bfa65a261c1d4", "grade": false, "grade_id": "45_critic_free-1", "locked": true, "schema_version": 3, "solution": false, "task": false}
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


def sequence_returns(scores: torch.Tensor, roll: dict, beta: float) -> torch.Tensor:
    """Score minus the KL fee summed over the response: (B,). Equal to the sum of the chapter's
    shaped rewards over the response (gamma = 1)."""
    validate_mask(roll["mask"])
    log_ratio = (roll["logp_old"] - roll["logp_ref"]) * roll["mask"]  # (B, T-1)
    return scores.to(log_ratio.dtype) - beta * log_ratio.sum(dim=1)  # (B,)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "009f01294f547e04527ae284f1adfc7e", "grade": false, "grade_id": "45_critic_free-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# One group of four responses to the same prompt, to see what each baseline does with it:

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "cf3ea898186bfcd49b336d2694f31a6e", "grade": false, "grade_id": "45_critic_free-3", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
cf_group = torch.tensor([3.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # returns of k = 4 samples
print("returns:                  ", cf_group.tolist())
print("RLOO advantages:          ", [round(a, 3) for a in rloo_advantages(cf_group, 4).tolist()])
print("GRPO advantages:          ", [round(a, 3) for a in grpo_advantages(cf_group, 4).tolist()])
print(
    "RLOO / (R - group mean):  ",
    round(float(rloo_advantages(cf_group, 4)[0] / (3.0 - cf_group.mean())), 4),
    "= k / (k - 1)",
)
print(
    "a group of equal returns: ",
    grpo_advantages(torch.ones(4, dtype=torch.float64), 4).tolist(),
    "(no signal, no update)",
)


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "bb6109b732a62079eecb0ee1ce8bc6b0", "grade": false, "grade_id": "45_critic_free-4", "locked": true, "schema_version": 3, "solution": false, "task": false}
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


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "525b41420b37127e1819dc5cd504f4a9", "grade": false, "grade_id": "45_critic_free-5", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
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


ARMS = ("gae", "rloo", "grpo", "grpo_published", "grpo_published_no_std", "dr_grpo")


LABELS = {
    "gae": "PPO: critic + GAE",
    "rloo": "PPO-clip, RLOO advantage",
    "grpo": "PPO-clip, group-normalised advantage",
    "grpo_published": "GRPO's objective, chapter's settings",
    "grpo_published_no_std": "the same, no division by the group std",
    "dr_grpo": "Dr. GRPO",
}


cf_results = load_cached("critic_free")
cf_beta = cf_results["config"]["beta"]
cf_summary = summarise(cf_results)
display(Markdown(format_table(cf_summary, cf_beta)))
cf_ppo = ("gae", "rloo", "grpo")  # the three arms that share PPO's update
cf_obj = [cf_summary[a]["objective"] for a in cf_ppo]
print(
    f"regularised objective, last 10 steps: {min(cf_obj):.2f} to {max(cf_obj):.2f} across the three "
    f"PPO-update arms; GRPO's objective {cf_summary['grpo_published']['objective']:.2f}, "
    f"without the std division {cf_summary['grpo_published_no_std']['objective']:.2f}, "
    f"Dr. GRPO {cf_summary['dr_grpo']['objective']:.2f}"
)
print(
    f"the critic is {cf_summary['gae']['critic_bytes'] / 1e3:.0f} kB of weights plus "
    f"{cf_summary['gae']['critic_train_bytes'] / 1e3:.0f} kB of gradients and Adam moments "
    f"(float32: 4 + 4 + 8 bytes per parameter)"
)
cf_speed = cf_summary["gae"]["seconds"] / statistics.fmean(
    cf_summary[a]["seconds"] for a in ("rloo", "grpo")
)
print(
    f"on the machine that wrote the cache, a GAE run took {cf_speed:.1f}x the CPU time of a critic-free one"
)
print(
    f"7B critic (16 B/param, §4.1): {human_bytes(16 * 7e9)} of static memory that RLOO and GRPO do not need"
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "2c1d2c9d3a406392bf18f39da9012f45", "grade": false, "grade_id": "45_critic_free-6", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Where does credit assignment show? The toy's reward is a sum of per-token indicators, one for
# each `good`, which is exactly what a learned $V(s_t)$ can credit token by token, so the question
# is fair. The next cell reads two more measurements from the same cache. During each GAE run, on a
# batch of 16 prompts with 4 samples each (drawn with a generator of its own, so training is
# untouched), it computed every estimator's per-token advantage, GAE's from the critic as it stood
# and RLOO's and GRPO's one per response, and correlated each with the indicator that the token is
# `good`. And a second sweep runs the three PPO-update arms with 8 samples a step instead of 64,
# where a critic's per-token credit might be worth more, recording the step at which each run's
# reward, averaged over 5 steps, first reaches the threshold in the table's header.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "5c136780f4f94759d8595189ac85aa9e", "grade": false, "grade_id": "45_critic_free-7", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
def steps_to_threshold(reward: list[float], threshold: float, window: int = 5) -> int | None:
    """The first step (1-based) at which the mean reward of the last ``window`` steps reaches
    ``threshold``; None if it never does."""
    for t in range(window, len(reward) + 1):
        if statistics.fmean(reward[t - window : t]) >= threshold:
            return t
    return None


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


cf_credit = credit_summary(cf_results)
display(Markdown(format_credit_table(cf_credit, cf_results["credit_config"])))

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "dd959f8b3ace894ef8043741e7dcbaeb", "grade": false, "grade_id": "45_critic_free-8", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["demo"]
show(
    plot_arms(cf_results),
    alt="Three panels over 40 steps, mean of three seeds with min-max bands, for six arms: reward, "
    "KL to the reference and mean response length. The three arms with PPO's update (critic and "
    "GAE, RLOO advantage, group-normalised advantage) rise together from about 0.5 to about 5 good "
    "tokens within 15 steps and overlap, at a KL near 10 nats; GRPO's objective at the chapter's "
    "settings rises more slowly to about 3.3 at about half the KL; the same objective without the "
    "division by the group std, and Dr. GRPO, lie close to the first three. Every arm's response "
    "length climbs from about 6 to nearly the maximum of 8 tokens.",
)


# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "f56baf0444efcee76478a064efc69b56", "grade": false, "grade_id": "45_critic_free-9", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Where each wins, on this measurement (the table and the cell above give the numbers):
#
# - **The three PPO-update arms: a tie, and why.** With the same samples, the same KL fee and
#   advantages of the same scale, they end at the same reward, KL and regularised objective, within
#   the spread over seeds, and none is ahead over the first ten steps on every seed. It is not that
#   there is no credit to find. After the first update GAE's advantage is the one most correlated
#   with `good` tokens, by a few hundredths. But every arm climbs to the same $\beta$-regularised
#   optimum within about 15 steps: responses are at most 8 tokens long, and 64 samples a step give
#   a sequence-level baseline plenty to average over. Near that optimum one more `good` token earns
#   about what its KL fee costs, and GAE's per-token advantage, which charges each token its own
#   fee, says so first: by 9 updates its correlation with `good` is gone while the sequence-level
#   advantages still carry theirs, and by the end all three are at or a little below zero. There
#   is then nothing
#   left that better credit could buy.
# - **Fewer samples a step: the critic is the slower arm.** With 8 samples a step instead of 64,
#   the GAE arm needs more steps to reach the threshold than either critic-free arm on every seed
#   (the credit table's steps column), and all three end at about the same reward. A critic that
#   must itself be learned from those few samples costs more at the start than its per-token
#   credit repays on eight-token responses.
# - **GRPO's objective at the chapter's settings: the std division sets its KL.** It ends with less
#   reward at about half the KL of the PPO-update arms, and a lower value of the regularised
#   objective the table scores every arm on. The ablation says where the gap comes from. Remove
#   only the division by the group's standard deviation, keeping the $k_3$ term and the
#   per-response mean, and the arm ends at the KL and objective of Dr. GRPO, close to the
#   PPO-update arms; Dr. GRPO then also drops the per-response mean and changes little more. So it
#   is not the $k_3$ term, which all three of these arms share, nor the length normalisation: it
#   is the division, which rescales every group's advantages while the weight $\beta$ of the KL
#   term stays fixed, and so changes the balance between the two. With DeepSeekMath's own
#   $\beta = 0.04$ and a single update per batch the balance would be a different one again.
# - **Length: no bias to see here.** Every arm's responses grow towards the 8-token maximum,
#   because more tokens leave room for more `good`; the per-response mean of GRPO's objective
#   does not lengthen them further (the table's length columns). Liu et al.'s length bias needs
#   room to show: it lets long *wrong* responses cost less per token, which matters when responses
#   run to thousands of tokens and most of them fail, not on eight-token responses whose reward
#   grows with their length.
# - **Cost: the critic-free arms, clearly.** Without the critic a run is much cheaper in CPU time
#   (no critic forward, backward or optimiser step; the cell prints the ratio, from the machine that
#   wrote the cache) and the critic's weights, gradients and Adam state are gone; at 7B that is the
#   112 GB the cell prints.
#
# What the toy cannot settle is how the estimators compare on long responses with informative
# intermediate tokens, where a good critic can assign credit inside a response and a sequence-level
# advantage cannot; GRPO's per-group normalisation also changes how much each prompt counts, a choice
# this task with equal-difficulty prompts does not test. Published comparisons need the same care
# as this one: Xu et al. (2024) found that PPO, tuned carefully, beats DPO across dialogue and code
# benchmarks, while Ahmadian et al. (2024) report RLOO ahead of PPO on theirs, so a weak result for
# any method may be a weakly tuned baseline.
#
# **Beyond RLOO and GRPO.** Three more critic-free designs are common in 2026 code:
#
# - *REINFORCE++* (Hu, 2025, arXiv:2501.03262) keeps PPO's tricks (clipped ratio, KL fee per
#   token) and normalises advantages over the whole batch rather than per prompt; its baseline
#   variant for groups subtracts the group's mean and then whitens over the batch. That is the
#   advantage of this section's *PPO-clip, RLOO advantage* arm (RLOO's $k/(k-1)$ factor disappears
#   in the whitening); the group-normalised arm differs from it only by the division by each
#   group's standard deviation.
# - *CISPO* (MiniMax, 2025, arXiv:2506.13585) clips the importance weight $\pi_\theta/\pi_{\text{old}}$
#   instead of the update: the clipped weight is held constant (no gradient through it) and
#   multiplies a REINFORCE term $A\log\pi_\theta$, so a token outside the band still contributes a
#   bounded gradient where PPO's clip would drop it. The authors found that PPO's clip removed the
#   gradient of rare tokens that matter for long chains of thought.
# - *Dynamic sampling* (DAPO, Yu et al., 2025, arXiv:2503.14476): a group whose responses all get the
#   same reward has zero advantage everywhere (the first cell of this section prints that case),
#   so DAPO samples more prompts than it needs and keeps only groups whose rewards differ, until
#   the batch is full, so every sample in it carries a gradient.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "5a08b243572f2705eb63e4cdecc0d5e8", "grade": false, "grade_id": "50_production-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. In production
#
# Four public recipes show how far the §3 algorithm travels and where teams departed from it. Each
# paragraph says what was done, the numbers that matter, and the lesson for a design review.
#
# **OpenAI, InstructGPT: PPO plus a pretraining term** (Ouyang et al., 2022, arXiv:2203.02155).
# Policies of 1.3B, 6B and 175B parameters, fine-tuned first on demonstrations (SFT), were optimised
# with PPO against a 6B reward model, with the per-token KL penalty of §2 measured against the SFT
# model at $\beta = 0.02$; the value function started from the reward model. Plain PPO regressed on
# several public NLP benchmarks, a cost the authors called the *alignment tax*. Their fix, **PPO-ptx**,
# adds the log-likelihood of pretraining text to the objective,
#
# $$\max_\theta\; \mathbb E_{x,\, y\sim\pi_\theta}\Big[r_\phi(x,y) - \beta \log\frac{\pi_\theta(y|x)}{\pi_{\text{SFT}}(y|x)}\Big]
#   + \gamma_{\text{ptx}}\, \mathbb E_{x\sim\mathcal D_{\text{pretrain}}}\big[\log\pi_\theta(x)\big],$$
#
# where $\gamma_{\text{ptx}}$ (written $\gamma$ in the paper; unrelated to the discount) weights a
# supervised loss on pretraining data, which recovered most of the regressions. Note that this term
# anchors the policy to the *pretraining data distribution*, not to the SFT model: it complements
# the KL penalty rather than duplicating it. The headline result is a systems argument: labelers
# preferred the outputs of the 1.3B PPO-ptx model to those of the 175B GPT-3, a model with over 100
# times more parameters. In this repository the hook is `ppo_update(..., extra_loss=...)`.
#
# **Meta, Llama 2-Chat: rejection sampling first, PPO last** (Touvron et al., 2023,
# arXiv:2307.09288). RLHF ran in five rounds (V1-V5), each with a reward model retrained on fresh
# preference data. Rounds V1 to V4 used only rejection-sampling fine-tuning: draw $K$ responses per
# prompt, keep the one the reward model ranks highest, fine-tune on those winners (done with the
# 70B model; smaller models were fine-tuned on its selected outputs). In V5 PPO was run *on top of*
# the rejection-sampling checkpoint, on fresh samples: not, as is sometimes said, on the best
# samples. The paper names the difference *breadth* and *depth*: rejection sampling draws $K$ samples
# per prompt, all from the policy the round started with, while PPO draws one per prompt, from the
# policy as the previous gradient step left it. The PPO reward used **two reward models**, safety and
# helpfulness: the safety score was used for prompts tagged as risky or when it fell below a
# threshold, otherwise the helpfulness score, and the chosen score was whitened (mapped back
# through the logit, then standardised) before subtracting a KL penalty to the pre-RLHF policy with
# $\beta = 0.01$ for 7B and 13B (0.005 for the larger models). Each PPO iteration on 70B took about
# 330 s, and sampling under FSDP was slow until weights were gathered onto each node before
# generation: generation dominating again.
#
# **Anthropic, Constitutional AI: PPO against an AI-labelled preference model** (Bai et al., 2022,
# arXiv:2212.08073). The RL stage is ordinary RLHF-PPO; what changes is where the harmlessness
# labels come from. A feedback model compares pairs of samples against principles from a written
# constitution (optionally reasoning step by step), and the preference model is trained on those
# AI-labelled harmlessness comparisons mixed with human-labelled helpfulness comparisons
# ("RL from AI feedback"). The resulting policies were reported as more harmless and markedly less
# evasive than the human-feedback baseline at similar helpfulness. Lesson: the PPO machinery is
# indifferent to who labelled the preferences; the label pipeline is what scales.
#
# **Meta, Llama 3: DPO instead of PPO** (Grattafiori et al., 2024, arXiv:2407.21783). Post-training
# repeated rounds of reward modelling, rejection sampling, SFT and **DPO**. The authors report that
# they tried on-policy methods such as PPO but that DPO needed less compute for models at this scale
# (up to 405B) and did better, particularly on instruction-following benchmarks. Two details matter
# for anyone copying the recipe: the reward model did not disappear (it selects the rejection-sampling
# winners), and DPO got two stabilisers, masking formatting tokens out of the loss and adding an NLL
# term on the chosen response. Lesson: at the largest scale the four-model memory bill and the
# generation cost of §4 are what the team weighed, and a cheaper offline method inside an
# on-policy loop of fresh samples and fresh reward models was judged the better trade.
#
# **Since 2025: verifiable rewards.** The recipes a reader now meets first are built around rewards
# that a program checks rather than a model predicts. Tülu 3 (Lambert et al., 2024,
# arXiv:2411.15124) named the stage *reinforcement learning with verifiable rewards* (RLVR): after
# SFT and DPO, PPO optimises a reward that is paid only when the answer to a maths problem is
# correct or an instruction's checkable constraint is met, with the usual KL fee to the reference.
# DeepSeek-R1 (DeepSeek-AI, 2025, arXiv:2501.12948) runs GRPO at scale on rule-based rewards, for
# correct answers and for the required output format, and says why it did not use a learned reward
# model for reasoning: in large-scale RL a neural reward model invites reward hacking, and
# retraining it adds cost and complexity. Its R1-Zero variant applies that RL directly to the base
# model with no supervised stage before it, and long chains of thought emerge from the reward alone;
# the released R1 adds a small cold-start SFT set for readability and a final RL stage that mixes
# rule-based and learned rewards. The PPO machinery of this chapter carries over unchanged; what
# moved is the reward (§3.8's over-optimisation is why) and, with long responses, the knobs at the
# end of this section.
#
# **Scaling RL compute.** Khatri et al. (2025, arXiv:2510.13786, "ScaleRL") ran RL for LLMs over
# hundreds of thousands of GPU-hours and fitted each recipe's validation pass rate against compute
# with a sigmoid, which has two parameters a design review cares about: the asymptote the curve
# saturates at, and how much compute it takes to get halfway there. They report that a few
# choices moved the asymptote, among them the loss (the CISPO objective below came out ahead of
# DAPO's) and computing the language-model head in fp32 (the §4.2 mismatch again), while many
# others, such as how the loss is aggregated or the advantage normalised, mostly changed how fast
# the asymptote is reached. Their combined recipe uses asynchronous PipelineRL-style generation
# (§4.2), the CISPO loss and the fp32 head. The practical lesson: a recipe that wins a short run may
# only be faster, and comparing at one compute budget cannot tell the two apart.
#
# ### Practical notes: the same algorithm, different code
#
# Open implementations agree on the equations of §2 and disagree on the details, and the details
# change results (Huang et al., 2024, arXiv:2403.17031, reproduce OpenAI's summarisation results only
# after matching dozens of them). What differs between TRL, OpenRLHF and OpenAI's original
# lm-human-preferences (LMHP, Ziegler et al., 2019, arXiv:1909.08593):
#
# | Detail | TRL | OpenRLHF | LMHP | This chapter |
# |---|---|---|---|---|
# | KL term in the reward | $k_1 = \log\pi - \log\pi_{\text{ref}}$ per token, $k_3$ optional | $k_1$ by default ($k_2$, $k_3$ options), clamped to $\pm 10$ | $k_1$ | $k_1$ |
# | Where the score lands | last response token (legacy trainer); from 0.12 the slot after EOS, which stays in the value loss | last position of the action mask; score clipped to $\pm 10$ | column $-1$ of the fixed-length response, also when it was truncated before that | last response token (<code>&lt;&#124;end&#124;&gt;</code> if emitted) |
# | No EOS emitted | optional penalty | length-penalty hooks | score replaced by $-1$ | score kept |
# | Tokens after the stop token | masked out of every loss | masked | kept: sampling runs to the fixed length past the stop token, and only the reward model's copy is truncated; log-probs, KL fee, GAE and both losses see the raw tokens | masked |
# | Advantage whitening | masked, per local batch, unbiased variance | global masked mean, population variance | per minibatch, over every column (no mask), biased variance | masked, global across ranks, population variance |
# | Reward whitening | optional, off | none | on (Huang et al.: lower preference rates and shorter completions, see below) | none |
# | Value loss | clipped at 0.2 around $V_{\text{old}}$, `vf_coef` 0.1 | clipped at 0.5, own optimiser | clipped at 0.2, `vf_coef` 0.1 | clipped at 0.2, `vf_coef` 0.5 (CleanRL's) |
# | Adaptive KL controller | legacy (up to 0.11): $\beta_0 = 0.2$, target 6, horizon 10,000 **samples**; from 0.12 none, fixed `kl_coef` | same class when a target is set; fixed by default | $\beta_0 = 0.15$, target 6, horizon $10^4$ episodes (launch configs) | horizon in **updates** |
#
# **Controller units.** The controller in lm-human-preferences' released code (the paper writes a fixed
# gain $K_\beta = 0.1$ instead, §2.4) is
# $\beta \leftarrow \beta\,\big(1 + \mathrm{clip}(\mathrm{KL}/\kappa - 1, -0.2, 0.2)\cdot n/h\big)$, where
# $n$ is the number of samples consumed by the update and the horizon $h$ is counted in samples.
# The form $\beta \leftarrow \beta(1 + e/h)$ that this chapter's run uses (§2.4) is the special case $n = 1$ with $h$ counted in
# updates, so a horizon of $10^4$ samples at $B$ samples per update is $10^4/B$ updates, not $10^4$. The
# target $\kappa$ also has a unit: LMHP and TRL compare it with the per-sequence KL (sum of log-ratios
# over the response, averaged over samples); a per-token mean, as OpenRLHF logs, is smaller by the
# response length. The cell below checks that the two forms give the same $\beta$ trajectory.
#
# **Reward whitening, read closely.** lm-human-preferences whitens the rewards of every batch (scale
# only, the mean is kept). Huang et al. (2024) found that runs with it won fewer preference
# comparisons *and* wrote shorter completions; once the comparison controls for length, the two
# settings come out about the same. So "whitening hurt" is mostly "whitening made the summaries
# shorter", the same length-reward entanglement that §3.6 shows in miniature.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "b01934661e3c529ef8e80c8b00c0973f", "grade": false, "grade_id": "50_production-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
def controller_step(beta, kl, target, n_steps, horizon):
    """One adaptive-KL update: beta * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)."""
    return beta * (1 + min(0.2, max(-0.2, kl / target - 1)) * n_steps / horizon)


batch, horizon_samples, target = 64, 10_000, 6.0
kls = [2.0, 5.0, 9.0, 12.0, 7.0, 6.5]  # a made-up KL trace (nats per sequence)
beta_samples = beta_updates = 0.2
for kl in kls:
    beta_samples = controller_step(
        beta_samples, kl, target, n_steps=batch, horizon=horizon_samples
    )  # original units
    beta_updates = controller_step(
        beta_updates, kl, target, n_steps=1, horizon=horizon_samples / batch
    )  # chapter units
print(
    f"horizon {horizon_samples} samples at {batch} samples/update = {horizon_samples / batch:.1f} updates"
)
print(
    f"beta after {len(kls)} updates: {beta_samples:.6f} (samples) vs {beta_updates:.6f} (updates)"
)
wrong = 0.2
for kl in kls:
    wrong = controller_step(
        wrong, kl, target, n_steps=1, horizon=horizon_samples
    )  # horizon in samples, n_steps=1
print(
    f"mixing the units (horizon in samples, n_steps=1): beta = {wrong:.6f}, a controller {batch}x too slow"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "e8cca71b082fcdc7a29544bb5d3364e1", "grade": false, "grade_id": "50_production-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Three more habits of production code worth copying:
#
# - **Choose the KL estimator for where it is used.** Inside the reward (no gradient flows through
#   it) the plain log-ratio $k_1$ is an unbiased per-sample estimate of the KL, negative values
#   included; GAE then turns it into the score-function gradient of the KL. Used as a *loss*, as
#   GRPO (Shao et al., 2024) does with $k_3 = (\rho - 1) - \log\rho$ where
#   $\rho = \pi_{\text{ref}}/\pi_\theta$, an estimator's value being unbiased says nothing about its
#   gradient, and the gradient is what the optimiser gets. The cell after this list works it out.
# - **Make every statistic global.** Advantage whitening, the controller's KL and token-mean losses
#   must be reduced over all data-parallel ranks (sum, sum of squares, token count), or a 1-GPU and an
#   8-GPU run train different models.
# - **Monitor drift, do not trust the clip.** Log an approximate KL between the sampling policy and
#   the updated one and stop the epochs of a step when it passes a threshold, as `ppo_update` does
#   with $k_3 = \mathbb E[r - 1 - \log r]$. Read other codebases' versions closely. CleanRL tests
#   $k_3$ against `target_kl` (off by default) at the end of each epoch. The legacy TRL trainer's
#   `early_stopping` is off by default too, and when on it compares the mean log-ratio $k_1$, which
#   can be negative, with $1.5\times$ `target_kl`. It checks once per epoch, after every minibatch
#   of the epoch has taken its optimiser step, and reads the $k_1$ of the epoch's last minibatch
#   only (computed in that minibatch's forward pass, before its step), so an epoch that overshoots
#   is finished before the stop takes effect (`trl/trainer/ppo_trainer.py` in 0.11.4). What TRL and lm-human-preferences log as `approxkl` is yet another estimator,
#   $k_2 = \tfrac12\mathbb E[(\log r)^2]$ (Schulman, 2020); §3.6 prints $k_2$ next to $k_3$ on this
#   chapter's run.
#
# **KL as a loss: the value is not the gradient.** Tang and Munos (2025) point out that
# differentiating a sampled KL estimate, with the samples held fixed as autograd does, does not give
# the gradient of the KL. On a single categorical distribution everything can be summed exactly, so
# the cell below takes $\pi_\theta = \mathrm{softmax}(\theta)$ over six tokens and a fixed reference,
# and computes the *expected* gradient of three per-sample losses: $k_1$ and $k_3$ as losses, and
# $k_1$ as a reward (a detached weight on $\log\pi_\theta$, which is what putting it in $R_t$ does).
# A fourth line takes $k_2 = \tfrac12(\log\pi_\theta - \log\pi_{\text{ref}})^2$ as the loss: its
# gradient per sample is $(\log\pi_\theta - \log\pi_{\text{ref}})\nabla\log\pi_\theta$, the same
# as $k_1$'s in the reward. The cell compares all four with the exact gradients of the two KL
# directions.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "4fc4b9d79c44476c8c15ef2c13ff23bd", "grade": false, "grade_id": "50_production-3", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output"]
g6 = torch.Generator().manual_seed(0)
theta = torch.randn(6, generator=g6, dtype=torch.float64, requires_grad=True)  # policy logits
logp_ref6 = torch.log_softmax(torch.randn(6, generator=g6, dtype=torch.float64), dim=0)


def expected_grad(per_sample):
    """sum_x pi(x) * grad per_sample(x): the mean gradient over samples x ~ pi, each held fixed."""
    logp = torch.log_softmax(theta, dim=0)  # (6,)
    return torch.autograd.grad((logp.exp().detach() * per_sample(logp)).sum(), theta)[0]


def exact_grad(kl):
    return torch.autograd.grad(kl(torch.log_softmax(theta, dim=0)), theta)[0]


reverse_kl = exact_grad(
    lambda lp: (lp.exp() * (lp - logp_ref6)).sum()
)  # KL(pi || ref), the objective
forward_kl = exact_grad(lambda lp: (logp_ref6.exp() * (logp_ref6 - lp)).sum())  # KL(ref || pi)
grads = {
    "k1 as a loss": expected_grad(lambda lp: lp - logp_ref6),
    "k2 as a loss": expected_grad(lambda lp: 0.5 * (lp - logp_ref6) ** 2),
    "k3 as a loss": expected_grad(lambda lp: (logp_ref6 - lp).exp() - 1 - (logp_ref6 - lp)),
    "k1 as a reward": expected_grad(lambda lp: (lp - logp_ref6).detach() * lp),
}
print("gradient of KL(pi || ref):", [round(g, 4) + 0.0 for g in reverse_kl.tolist()])
for name, g in grads.items():
    print(
        f"{name:>15}: {[round(x, 4) + 0.0 for x in g.tolist()]}   "
        f"= grad KL(pi || ref): {torch.allclose(g, reverse_kl)}, = grad KL(ref || pi): {torch.allclose(g, forward_kl)}"
    )
assert torch.allclose(grads["k1 as a loss"], torch.zeros(6, dtype=torch.float64))
assert torch.allclose(grads["k3 as a loss"], forward_kl) and torch.allclose(
    grads["k1 as a reward"], reverse_kl
)
assert torch.allclose(grads["k2 as a loss"], reverse_kl)  # on-policy: the same as k1 in the reward

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "9d3b9f5bf6d620e1616dd729905ad5c1", "grade": false, "grade_id": "50_production-4", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Three different answers among four estimators. $k_1$ used as a loss has zero expected gradient, because
# $\mathbb E_\pi[\nabla\log\pi] = 0$: it regularises nothing. $k_3$ used as a loss has gradient
# $(1 - \pi_{\text{ref}}/\pi_\theta)\nabla\log\pi_\theta$, whose expectation is the gradient of the
# *other* direction, $\mathrm{KL}(\pi_{\text{ref}}\|\pi_\theta)$: a sensible regulariser, but not the
# reverse KL the objective of §2.1 names, and the two part ways as the policy moves away from the
# reference. Only $k_1$ in the reward, weighting $\nabla\log\pi_\theta$ like any other reward, gives
# the gradient of $\mathrm{KL}(\pi_\theta\|\pi_{\text{ref}})$, which is why this chapter (like
# lm-human-preferences, TRL and OpenRLHF by default) puts the fee there, and $k_2$ used as a loss
# gives the same expected gradient, so it is the estimator to pick when the KL must sit in the loss.
# As an estimate of the reverse KL, $k_3$-as-loss is therefore a biased, first-order stand-in: its
# gradient matches the reverse KL's only while $\pi_{\text{ref}}/\pi_\theta$ stays close to 1. Both
# statements assume the samples come from $\pi_\theta$ itself. In PPO's later epochs, or with a
# stale sampler, they come from $\pi_{\text{old}}$, and a KL loss then needs the importance weight
# $\pi_\theta/\pi_{\text{old}}$ on each token to keep its gradient right; Liu et al. (2025,
# arXiv:2510.01555) work through which estimator-and-placement combinations give the correct
# gradient on and off policy. Over a sequence there is a
# second catch that a single distribution cannot show: a per-token KL loss ignores how the current
# token changes the distribution of the later ones, so it is a partial gradient at best (Tang and
# Munos, 2025).
#
# **The score one slot after EOS.** TRL's PPO trainer from version 0.12 adds the score at the
# position *after* the stop token on purpose, and keeps that position in the critic's loss (not in
# the policy's). That is a design choice, not the off-by-one of §4.3, where the score lands on a
# position the masks then zero out. How much does it change? With the slot inside GAE, the stop
# token's advantage becomes $R_T + \gamma V_{\text{slot}} - V_T + \gamma\lambda(r_\phi - V_{\text{slot}})$
# instead of $R_T + r_\phi - V_T$: at $\gamma = 1$ they differ by $(1-\lambda)(V_{\text{slot}} - r_\phi)$,
# and earlier tokens by that times $\lambda^{T-t}$. Nothing at $\lambda = 1$, and nothing once the
# critic has learned to predict the score at the slot, which is what keeping the slot in the value
# loss trains it to do. The cell checks the formula with your `gae` on one response.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "016a0ce8eee74d2d0316dd24d32777ee", "grade": false, "grade_id": "50_production-5", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
R_kl = torch.tensor(
    [[0.02, -0.01, 0.03, 0.0]]
)  # KL terms of a 3-token response; column 3 is the slot after EOS
v = torch.tensor([[0.4, 0.5, 0.7, 0.6]])  # critic values; V_slot = 0.6
r_phi, lam = 1.0, 0.95
on_eos, after_eos = R_kl.clone(), R_kl.clone()
on_eos[0, 2] += r_phi  # this chapter: the score on the last response token
after_eos[0, 3] += r_phi  # TRL >= 0.12: the score on the slot after it
a_chapter, _ = gae(on_eos, v, torch.tensor([[1.0, 1.0, 1.0, 0.0]]), gamma=1.0, lam=lam)
a_slot, _ = gae(after_eos, v, torch.ones(1, 4), gamma=1.0, lam=lam)  # the slot is part of GAE
gap = a_slot[0, :3] - a_chapter[0, :3]
print("advantages, score on EOS:  ", [round(x, 4) + 0.0 for x in a_chapter[0, :3].tolist()])
print("advantages, score after EOS:", [round(x, 4) + 0.0 for x in a_slot[0, :3].tolist()])
predicted = [(1 - lam) * (v[0, 3].item() - r_phi) * lam ** (2 - t) for t in range(3)]
print(
    "difference:",
    [round(x, 4) + 0.0 for x in gap.tolist()],
    " (1 - lam)(V_slot - r) lam^(T-t):",
    [round(x, 4) + 0.0 for x in predicted],
)
assert torch.allclose(gap, torch.tensor(predicted), atol=1e-6), (
    "the gap does not follow (1 - lam)(V_slot - r) lam^(T-t): this cell uses your `gae` from §3, "
    "so check that its ✓ check cell passes first"
)

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "c4beeed2c52e4de211bb94aa6c0e8300", "grade": false, "grade_id": "50_production-6", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **The defaults you will meet.** Reading a paper's or a colleague's settings, you need to know what
# they left at the library's default. The cell below lists those defaults for three stacks, read
# from their code at the versions named in the header, next to DeepSpeed-Chat (Yao et al., 2023,
# arXiv:2308.01320; its `DeepSpeedPPOTrainer` hard-codes them) and this chapter's `CHAPTER_RUN`. TRL
# is a historical column: its PPO trainer moved to `trl.experimental.ppo` in v0.26 (PR #4482) and was
# removed altogether in 1.13.0 (PR #7020), so 1.12.0 is the last release that has it. verl is the
# stack a student starting in 2026 is most likely to meet; its column is read from v0.7.0's
# generated trainer config, `verl/trainer/config/_generated_ppo_trainer.yaml`, and the dual clip from
# `compute_policy_loss_vanilla` in `verl/trainer/ppo/core_algos.py`.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "d69554454943dab1d7598fd7b634e6e6", "grade": false, "grade_id": "50_production-7", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "demo"]
library_defaults = {  # setting: (TRL 1.12.0, OpenRLHF 0.11.0, verl 0.7.0, DeepSpeed-Chat), read from their code
    "beta (KL coefficient)": (
        "0.05, fixed (`kl_coef`)",
        "0.01 (`--algo.kl.init_coef`); adaptive only with `--algo.kl.target`",
        "no KL at all: `use_kl_in_reward` and `use_kl_loss` are false (0.001 when switched on)",
        "0.1, fixed",
    ),
    "value-loss weight c_v": (
        "0.1 (`vf_coef`)",
        "none: the critic has its own optimiser",
        "none: the critic is its own worker with its own optimiser",
        "none: the critic has its own engine",
    ),
    "GAE lambda": ("0.95 (`lam`)", "1 (`--algo.advantage.lambd`)", "1.0 (`algorithm.lam`)", "0.95"),
    "gamma": ("1.0", "1", "1.0", "1.0"),
    "policy clip eps": (
        "0.2 (`cliprange`)",
        "0.2 (`--actor.eps_clip`)",
        "0.2 (`clip_ratio`)",
        "0.2",
    ),
    "dual clip (A < 0)": (
        "none",
        "off (`--actor.dual_clip`)",
        "on, c = 3 (`clip_ratio_c`)",
        "none",
    ),
    "value clip": (
        "0.2 (`cliprange_value`)",
        "0.5 (`--critic.value_clip`)",
        "0.5 (`critic.cliprange_value`)",
        "0.2",
    ),
    "reward clip": ("none", "[-10, 10] (`--reward.clip_range`)", "none", "[-5, 5]"),
    "KL estimator": (
        "k1 in the reward (`kl_estimator`; k3 optional)",
        "k1 in the reward (`--algo.kl.estimator`; k2, k3)",
        "k1 in the reward (`kl_penalty`), k3 as a loss (`kl_loss_type: low_var_kl`), both off",
        "k1 in the reward",
    ),
    "loss aggregation": (
        "masked mean over the minibatch's tokens",
        "token mean over the global batch",
        "token mean (`loss_agg_mode`)",
        "masked token mean",
    ),
    "PPO epochs per batch": (
        "4 (`num_ppo_epochs`)",
        "1 (`--train.max_epochs`)",
        "1 (`ppo_epochs`)",
        "1 (`--ppo_epochs`)",
    ),
    "optimiser steps per rollout batch": (
        "4 (4 epochs x `num_mini_batches` 1)",
        "8 (`--rollout.batch_size` 1024 / `--train.batch_size` 128, one epoch)",
        "4 (`data.train_batch_size` 1024 / `ppo_mini_batch_size` 256, one epoch)",
        "1 (a generation batch of 16 per device, training minibatches of 16, one epoch)",
    ),
}
c = CHAPTER_RUN
chapter = [
    f"{c.beta} at the start, adaptive (target {c.kl_target})",
    f"{c.vf_coef}",
    f"{c.lam}",
    f"{c.gamma}",
    f"{c.clip_eps}",
    "none",
    f"{c.clip_eps} (the policy's)",
    "none",
    "k1 in the reward",
    "masked token mean",
    f"{c.ppo_epochs}",
    f"{c.ppo_epochs} (one full-batch step per epoch)",
]
rows = [
    "| setting | TRL 1.12.0, the last release with PPO (`trl.experimental.ppo.PPOConfig`) "
    "| OpenRLHF 0.11.0 (`cli/train_ppo_ray.py`) | verl 0.7.0 (generated trainer config) "
    "| DeepSpeed-Chat (`dschat/rlhf/ppo_trainer.py`) | this chapter (`CHAPTER_RUN`) |",
    "|---|---|---|---|---|---|",
]
for (name, (trl, openrlhf, verl, dschat)), ours in zip(
    library_defaults.items(), chapter, strict=True
):
    rows.append(f"| {name} | {trl} | {openrlhf} | {verl} | {dschat} | {ours} |")
display(Markdown("\n".join(rows)))

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "ab9e1a27709d70b684c41feebd416b2a", "grade": false, "grade_id": "50_production-8", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Four things stand out. On $\lambda$ and the value clip the stacks form two camps (TRL and
# DeepSpeed-Chat: $\lambda = 0.95$, value clip 0.2; OpenRLHF and verl: $\lambda = 1$, value clip
# 0.5), and on the reward clip they go three ways (none, $\pm 5$, $\pm 10$), so a result reported
# "with default settings" says little until you know which library. $\beta$ differs
# by a factor of ten where there is one, verl's default run has no KL term at all, and none of the
# stacks adapts $\beta$ by default, while this chapter does (§2.4). The language-model stacks weight
# the critic less than the control-task default this chapter borrowed from CleanRL, or give it a
# separate optimiser altogether (§2.3). And the newer stacks run one epoch over each batch where TRL
# and this chapter run four, but one epoch is not one step: OpenRLHF's defaults split the rollout
# batch into 8 optimiser steps and verl's into 4 (the table's last row), and from the second of
# those steps on the policy has moved since the batch was sampled, so the ratio leaves 1 and the
# clip binds exactly as it does in a later epoch. The dual clip guards the tokens whose ratio is
# already far off: after many minibatch steps, when the sampler ran a few updates behind (§4.2's
# asynchronous rollouts), or when the inference engine's numbers differ from the trainer's
# (§4.2's mismatch).
#
# **Long responses: the knobs of 2025-26.** Reasoning models sample thousands of tokens per
# response against a sparse, verifiable reward, and the PPO family grew knobs for that regime. Each
# is one flag in current stacks; none is used by the toy.
#
# - *Clip-higher.* Give the ratio band different edges, $[1-\epsilon_{\text{low}}, 1+\epsilon_{\text{high}}]$
#   with $\epsilon_{\text{high}} > \epsilon_{\text{low}}$ (0.28 against 0.2 in DAPO, Yu et al., 2025,
#   arXiv:2503.14476), so unlikely tokens with a positive advantage can grow further and the entropy
#   does not collapse; OpenRLHF exposes it as `--actor.eps_clip_low_high`.
# - *Entropy by covariance.* Cui et al. (2025, arXiv:2505.22617) trace the collapse of the policy's
#   entropy to one quantity: under a softmax policy, a step lowers the entropy in proportion to the
#   covariance between a token's log-probability and its advantage, so confident tokens that are
#   also rewarded drain it fastest. Their Clip-Cov and KL-Cov pick out the few tokens with the
#   highest covariance and cut their gradient or add a KL term on them alone, a narrower tool than
#   clip-higher, which widens the band for every token.
# - *Dual clip.* For $A < 0$ the unclipped side of the surrogate is unbounded as $r \to \infty$; dual-clip
#   PPO (Ye et al., 2020, arXiv:1912.09729) caps that loss at $c \cdot |A|$ for a constant $c > 1$
#   (OpenRLHF's `--actor.dual_clip`).
# - *Token- or sequence-level aggregation.* This chapter averages the loss over all response tokens
#   of the batch, so every token weighs the same and a long response counts more than a short one.
#   GRPO as first published averages within each response and then over responses, which gives each
#   token of a long response *less* weight; DAPO argues for the token mean on long chains of thought,
#   and Liu et al. (2025, arXiv:2503.20783, "Dr. GRPO") show that the per-response mean, like GRPO's
#   division by the group's reward standard deviation, biases which responses the update favours.
#   OpenRLHF's policy loss takes the token mean by default and a per-sequence mean for its GSPO
#   variant (`--actor.policy_loss_type gspo`).
# - *Overlong and length penalties.* A response cut at the maximum length has no real ending to score;
#   DAPO masks such samples out of the loss or ramps a penalty over a buffer before the limit
#   (OpenRLHF: `--reward.overlong_buffer_len`, `--reward.overlong_penalty_factor`,
#   `--reward.stop_properly_penalty_coef`), the long-response cousin of LMHP's $-1$ for a missing
#   stop token.
# - *Value pretraining and a decoupled $\lambda$.* Yuan et al. (2025, arXiv:2503.01491) trace PPO's
#   collapse on long chains of thought to the critic: a value model initialised from the reward
#   model is biased at the start, and with $\lambda < 1$ the end-of-response reward decays before it
#   reaches early tokens. Their fix pretrains the critic on samples of the frozen initial policy, and
#   uses $\lambda = 1$ for the critic's targets while the policy's advantages keep a smaller $\lambda$.
#   OpenRLHF's `--critic.freezing_steps` is the same warm-up in simpler form. VAPO (Yue et al.,
#   2025, arXiv:2504.05118) is the value-based answer to long chains of thought built on top of
#   both: keeping value pretraining and the decoupled $\lambda$, it makes the policy's $\lambda$
#   depend on the response's length $\ell$, $\lambda_{\text{policy}} = 1 - 1/(\alpha\ell)$, so that
#   a long response's advantages reach further back than a short one's, and adds clip-higher, the
#   token-level loss, group sampling and a language-model (negative log-likelihood) loss on the
#   responses that were judged correct.
# - *A sequence-level ratio.* GSPO (Zheng et al., 2025, arXiv:2507.18071) replaces the per-token
#   ratio with the response's length-normalised likelihood ratio (the geometric mean of its token
#   ratios) and clips whole responses, which its authors found more stable for mixture-of-experts
#   models; it is OpenRLHF's `--actor.policy_loss_type gspo`.
# - *The reference KL is optional.* With a verifiable reward there is no reward model to exploit off
#   its data, and several recipes drop the KL fee altogether (DAPO does); OpenRLHF then skips the
#   reference model entirely when `--algo.kl.init_coef` is 0, saving its memory (§4.1's 2 bytes per
#   parameter). Three results argue for keeping some anchor. ProRL (Liu et al., 2025,
#   arXiv:2505.24864) trains for far longer than usual and keeps a KL penalty, resetting the
#   reference to the current policy from time to time so that the penalty stabilises without
#   freezing progress. RL's Razor (Shenfeld et al., 2025, arXiv:2509.04259) finds that how much a
#   fine-tuned model forgets of its earlier abilities is predicted by how far it moved, measured as
#   the KL from the base model on the new task's inputs, and that on-policy RL forgets less than
#   supervised fine-tuning because it moves less. And Yue et al. (2025, arXiv:2504.13837) find that
#   RL with verifiable rewards raises pass@1 while the base model, given enough samples, solves more
#   problems at large $k$: the RL policy concentrates on answers its base model could already reach.
#   Dropping the anchor removes the one term that prices that narrowing.
#
# **Details that differ between codebases**, one line each, none of them used by this chapter's toy:
#
# - *Minibatches.* CleanRL splits each rollout batch into minibatches (4 by default) and reshuffles
#   them every epoch, so an epoch takes several optimiser steps in a fresh order. The language-model
#   defaults are closer to this chapter than that suggests: lm-human-preferences (`nminibatches = 1`
#   in `train_policy.py`), the rewritten TRL trainer (`num_mini_batches = 1`) and the legacy one
#   (`mini_batch_size` = `batch_size` = 128) all default to one minibatch per epoch, as `ppo_update`
#   does; larger runs raise the number to fit memory.
# - *Learning-rate decay.* CleanRL's `anneal_lr`, on by default, decays the learning rate linearly
#   to zero over training; here it stays constant.
# - *Adam's $\epsilon$.* CleanRL sets it to $10^{-5}$ instead of PyTorch's $10^{-8}$, and Huang, Liu
#   and von Werra (2023) found that PyTorch's and TensorFlow's Adam place $\epsilon$ differently, which
#   made the PyTorch port update more aggressively early in RLHF training.
# - *The value head starts at zero.* lm-human-preferences initialises the value head's weights to
#   zero, so every $V(s_t)$ starts at exactly 0; the toy's `TinyCritic` head keeps PyTorch's default
#   random initialisation.
# - *TRL's guard rails* (legacy trainer): `score_clip` clips the reward model's score before it
#   enters the reward (off by default), and `ratio_threshold` (10 by default) zeroes the loss of any
#   minibatch whose mean ratio exceeds it, skipping the step rather than letting one outlier batch
#   cause a loss spike.
#
# Library churn is real. TRL's rewritten PPO trainer left the top-level package for
# `trl.experimental.ppo` in v0.26 (PR #4482; the old import path kept a deprecation stub until 1.0),
# and PR #7020 removed PPO from TRL altogether, so 1.12.0 is the last release with it; OpenRLHF renamed its command-line
# flags into dotted groups (`--algo.kl.init_coef`, `--algo.advantage.is_correction_enable`). Pin
# the version you build on, and read its defaults from the code rather than from a blog post.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "1e6f57196226cca2a3e73b37055322e2", "grade": false, "grade_id": "60_interview-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. Interview questions
#
# Try each question aloud before opening the answer. A strong answer states the mechanism, the
# equation that pins it down, and the practical consequence; the follow-ups are where a staff-level
# interview actually happens.
#
# **Q1. Walk me through how the KL-to-reference term is implemented in PPO-RLHF. Why put it in the
# reward instead of the loss?**
#
# <details><summary>Answer</summary>
#
# It enters the **reward**, token by token:
#
# $$R_t = -\beta\,[\log\pi_{\text{old}}(a_t|s_t) - \log\pi_{\text{ref}}(a_t|s_t)] + \mathbb 1[t = T]\, r_\phi(x, y).$$
#
# The reason is the chain rule of the autoregressive model: the sequence-level
# $\mathrm{KL}(\pi_\theta(\cdot|x)\,\|\,\pi_{\text{ref}}(\cdot|x))$ equals the expected *sum* of per-token log-ratios along
# a sampled response, so the penalised objective $\mathbb E[r_\phi] - \beta\,\mathrm{KL}$ is an ordinary return with
# a dense per-token cost. Written that way, GAE and the critic assign credit for the KL exactly as
# they do for the score, and the penalty is priced at the token that caused it. The log-ratio is
# evaluated with the sampling policy and treated as a constant, so gradients flow only through the
# clipped surrogate.
#
# The alternative, a KL term in the loss (as GRPO does), needs an estimator whose *gradient* is
# right, which is a different requirement from an unbiased *value*: $k_3$ has the second but not the
# first. Differentiated as a loss, its expected gradient is that of $\mathrm{KL}(\pi_{\text{ref}}\|\pi_\theta)$,
# the other direction, and $k_1$'s is zero (Tang and Munos, 2025; §5 computes both). If the KL must
# sit in the loss, use $k_2 = \tfrac12(\log\pi_\theta - \log\pi_{\text{ref}})^2$: on samples from
# $\pi_\theta$ its expected gradient is that of $\mathrm{KL}(\pi_\theta\|\pi_{\text{ref}})$, the same as $k_1$
# in the reward, token by token; on samples from an older policy it needs the importance weight
# $\pi_\theta/\pi_{\text{old}}$ too (Liu et al., 2025, arXiv:2510.01555). Over a whole response the two
# part ways. $k_1$ in the reward travels through the return, so a token pays for the KL of every
# token after it as well (its choice shaped what followed); a per-token $k_2$ loss bills each token
# for its own term only, which is the partial gradient of §5 (Tang and Munos, 2025, arXiv:2506.09477).
#
# *Follow-up: a token's term can be negative. Is that a bug?* No. $\log\pi_\theta(a) - \log\pi_{\text{ref}}(a)$ is a
# single-sample estimate; its expectation under $\pi_\theta$ is the non-negative KL, and individual
# tokens that the reference likes more than the policy earn a small refund. Even a batch *average*
# can dip below zero: only the expectation of $k_1$ is guaranteed non-negative, and when the true KL
# is small a batch mean of a few hundredths below zero is sampling noise (the legacy TRL trainer only
# warns below $-1$ nat). What deserves a search is a KL that stays clearly negative step after step:
# the samples did not come from the distribution you scored (top-$k$/top-$p$, a suppressed EOS, a
# temperature applied in one place only, greedy decoding), so the estimator's premise fails.
# Clamping or squaring the per-token term to "fix" negatives biases the estimate.
#
# </details>
#
# **Q2. Starting from the importance-weighted policy gradient, derive PPO's clipped objective. Does
# it enforce a trust region?**
#
# <details><summary>Answer</summary>
#
# Start from the importance-weighted objective $L^{\text{PG}}(\theta) = \mathbb E_t[r_t(\theta) A_t]$ with
# $r_t = \pi_\theta(a_t|s_t)/\pi_{\text{old}}(a_t|s_t)$, whose gradient at $\theta_{\text{old}}$ is the policy gradient.
# Maximised over several epochs it is unbounded: wherever $A_t > 0$ the optimiser can inflate $r_t$
# without limit, trusting advantages estimated under $\pi_{\text{old}}$ far from where they were measured.
# PPO takes $\min\big(r_t A_t,\ \operatorname{clip}(r_t, 1-\epsilon, 1+\epsilon) A_t\big)$ per token:
#
# - $A_t > 0$: the term is $r_t A_t$ up to $r_t = 1 + \epsilon$ and the constant $(1+\epsilon)A_t$ beyond;
# - $A_t < 0$: the term is $r_t A_t$ down to $r_t = 1 - \epsilon$ and the constant $(1-\epsilon)A_t$ below.
#
# So it equals $L^{\text{PG}}$ to first order at $\theta_{\text{old}}$, never exceeds it, and the gradient of a
# token vanishes once its ratio has moved $\epsilon$ in the direction its advantage rewards; moves
# in the harmful direction are never clipped, so they can always be undone. It is a cheap,
# first-order stand-in for the constraint of TRPO (Schulman et al., 2015), $\mathrm{KL}(\pi_{\text{old}}\|\pi_\theta) \le \delta$.
#
# It is **not** a trust region, and saying so is the staff-level part. The clip removes a token's
# *incentive* to move further, not the possibility: tokens share parameters, so updates driven by
# unclipped tokens keep moving clipped ones, and with several epochs and a large learning rate
# ratios routinely land far outside $[1-\epsilon, 1+\epsilon]$. Engstrom et al. (2020,
# arXiv:2005.12729) showed that much of PPO's trust-region behaviour comes from implementation
# details around the clip (learning-rate schedule, gradient clipping, normalisation). Hence the
# guard rails that practical code adds: 1-2 epochs, an approximate-KL monitor
# $\mathbb E[r - 1 - \log r]$ with early stopping, and gradient-norm clipping.
#
# </details>
#
# **Q3. Budget the accelerator memory of a PPO-RLHF run. If it does not fit, what goes first?**
#
# <details><summary>Answer</summary>
#
# Four networks. The policy and the critic are trained with mixed-precision Adam: bf16 weights (2
# bytes/param), fp32 master weights (4), two fp32 moments (8) and bf16 gradients (2), 16 bytes/param
# each. The reference and the reward model are frozen bf16 weights, 2 bytes/param each. With all
# four at $P$ parameters that is $36P$ bytes, 252 GB at 7B, versus $16P$ to pretrain the same model
# ($2.25\times$), before activations and the KV cache that generation needs for every concurrent
# sequence.
#
# Order of cuts, cheapest in quality first: (1) **shard** the trained pair with ZeRO-3/FSDP and
# offload or separately place the frozen pair: this changes nothing about the algorithm; (2) **LoRA**
# for policy (and critic as a second adapter): the reference becomes the base weights with adapters
# off, and optimiser state shrinks to the adapters; (3) **drop the critic** (GRPO or RLOO baselines
# from several samples per prompt), trading memory for more generation; (4) quantise the frozen
# models, accepting a slightly noisier reward and KL.
#
# *Follow-up: the reward model is larger than the policy. What changes?* Scoring stops being a
# rounding error: it is a full forward pass of the biggest network over every sampled sequence. Run
# it on its own GPUs or inference engine, batch it with generation, and consider distilling the RM.
# A smaller critic initialised from the RM (as InstructGPT did) saves memory too.
#
# </details>
#
# **Q4. Sampling the rollouts takes most of a PPO step at scale. Explain why, and what production stacks do about it.**
#
# <details><summary>Answer</summary>
#
# Decoding is sequential (token $t+1$ needs token $t$) and memory-bound: each step streams all
# weights and the KV cache from HBM to do roughly $2P$ FLOPs per sequence, about $B$ FLOPs per byte at
# batch size $B$, while an H100 needs around 300 FLOPs per byte to be compute-bound, and the KV cache
# limits $B$. Responses also finish at different lengths, so static batches idle behind their
# longest row. Training on the same tokens is one parallel, compute-bound pass. OpenRLHF's README
# puts generation at 80 % of RLHF training time; §4.2's roofline shows why no single number holds:
# the share rises as the decode batch shrinks and the responses grow.
#
# The mitigations: an inference engine for rollouts (paged KV cache, continuous batching, sometimes
# quantised weights); weight synchronisation from trainer to engine after each update; and
# pipelining, generating step $k+1$ while training on step $k$. Pipelining makes the data one
# update stale, and there are two correct answers. Either $\log\pi_{\text{old}}$ is the log-probability
# under the weights that sampled, so one ratio both corrects and clips; or the update is
# *decoupled*: clip around log-probs recomputed with the policy at the start of the update (the
# proximal policy) and carry the correction in a separate weight
# $\pi_{\text{prox}}/\pi_{\text{behav}}$ (Hilton et al., 2022), truncated as V-trace truncates its
# importance weights (Espeholt et al., 2018). The wrong answer is recomputing without
# the weight. Engines and trainers also disagree numerically at the same weights (Yao et al., 2025),
# which is why a stack like OpenRLHF recomputes in the trainer and applies such a truncated weight
# (TIS), a token mask (IcePop) or a sequence mask between the engine's log-probs and its own.
#
# *Follow-up: why not just use a bigger batch to make decoding compute-bound?* The KV cache: at
# thousands of tokens per response, a few hundred concurrent sequences already fill the memory the
# weights left over, which is why paged attention and GQA/MQA matter as much as raw FLOPs.
#
# </details>
#
# **Q5. Best-of-$N$ sampling with fine-tuning on the winners versus PPO: how do you choose?**
#
# <details><summary>Answer</summary>
#
# Rejection sampling (best-of-$N$): sample $N$ responses, keep the one the RM scores highest, and
# fine-tune on the winners. It needs only an SFT stack and an RM, no critic, no per-token machinery;
# its KL to the sampling policy is bounded, $\mathrm{KL} \le \log N - (N-1)/N$ (an upper bound,
# not the value: Beirami et al., 2024, arXiv:2401.01879); and taking the max over $N$
# samples explores broadly. But it can only raise the likelihood of whole responses that already
# appeared, so gains saturate. PPO changes individual token probabilities using a learned critic
# and can move the policy beyond anything in its current top-$N$, at the price of four models, more
# knobs and more instability.
#
# In practice: start with rejection sampling (it also produces a stronger starting checkpoint),
# and move to PPO or GRPO when its gains flatten and the infrastructure exists. Llama 2-Chat did
# exactly this: four rounds of rejection sampling, then PPO in the fifth, starting from the
# rejection-sampling checkpoint.
#
# </details>
#
# **Q6. Your dashboard shows the RM score still climbing and the KL well under its target, yet
# human raters see no improvement. Diagnose it.**
#
# <details><summary>Answer</summary>
#
# Reward over-optimisation. The RM was trained on samples from earlier policies; the current policy
# has moved into regions where the RM's errors are systematic (length, confident tone, flattery,
# formatting), and it is climbing those errors. The KL budget does not prevent this because KL
# measures *how much* the distribution moved, not whether it moved along the dimensions the RM gets
# right; a few nats spent on length can buy a lot of proxy reward.
#
# Diagnose: label a fresh batch of current samples (humans or a strong judge) and compare with the
# RM; plot response length and the reward against KL; check disagreement across an RM ensemble
# (Coste et al., 2023, arXiv:2310.02743, found that optimising an ensemble's worst case or an
# uncertainty-penalised mean largely removes over-optimisation in best-of-$n$ and PPO; Eisenstein
# et al., 2023, arXiv:2312.09244, that ensembles help but do not remove reward hacking when all
# members share the same error, and that pretraining-seed diversity helps more than fine-tuning
# seeds).
# Fix: retrain the RM on pairs from the current policy, stop at the checkpoint where human
# preference peaked, tighten the KL target, and add explicit controls (length penalty or a
# length-debiased RM; ensemble-min rewards).
#
# </details>
#
# **Q7. (Controller) Your adaptive KL controller uses a horizon of 10,000 and a target of 6. The team
# moves from 1 GPU to 8 and from batch 64 to batch 512, and $\beta$ starts behaving differently. Why?**
#
# <details><summary>Answer</summary>
#
# The controller is $\beta \leftarrow \beta\,(1 + \operatorname{clip}(\mathrm{KL}/\kappa - 1, -0.2, 0.2)\,n/h)$. Three things can
# change under that move:
#
# 1. **Units of the horizon.** If $h = 10{,}000$ is counted in samples, $n$ must be the samples in
#    the update, summed over ranks ($512 \times 8$ if 512 is per rank). Passing the local batch, or
#    $n = 1$, makes the controller 8 or 4,096 times slower than intended. If instead $h$ is counted in
#    updates ($n = 1$, as in this chapter), the same horizon means a much longer time in samples
#    when the batch grows.
# 2. **Which KL.** The target 6 is a per-sequence KL (summed over tokens, averaged over samples). Feed
#    it a per-token mean and the controller sees a KL a response-length factor too small and keeps
#    lowering $\beta$.
# 3. **Per-rank statistics.** Each rank computing its own KL and updating its own $\beta$ produces
#    ranks that disagree; the KL must be all-reduced (sum of sequence KLs, number of sequences) so every
#    rank takes the same step.
#
# A test that pins all three: run 1 process with batch $B$ and 2 processes with $B/2$ each on the same
# data; $\beta$, the whitened advantages and the losses must match.
#
# </details>
#
# **Q8. (Masking) Name the masking and alignment bugs you would test for in a PPO-RLHF codebase, and
# the one test that catches most of them.**
#
# <details><summary>Answer</summary>
#
# - **Shift by one.** Log-probs at index $t$ score `tokens[:, t+1]`, so the response mask over
#   tokens must be shifted (`mask[:, 1:]`) before it touches any per-token tensor.
# - **Prompt and padding in the loss.** The surrogate, the value loss, the entropy, the KL and the
#   whitening statistics must all use the response mask; an unmasked mean over padding silently
#   reweights long and short responses.
# - **Score position.** The score belongs on the last response token (EOS if emitted); the classic
#   off-by-one puts it on the following PAD, where the mask zeroes it.
# - **pad == eos.** Masking "all pad ids" then masks the real EOS, so the model is never rewarded for
#   stopping. Use a distinct pad id or build masks from positions.
# - **Values after the end.** GAE's bootstrap $V(s_{t+1})$ must be zero past the last response token,
#   or values computed on padding leak into the advantages.
# - **Left vs right padding.** Rollout and update must use the same padding side, attention mask
#   and position ids, or the first-epoch ratio is not 1.
#
# The one test: **padding invariance**. Append extra PAD columns to a batch (and, separately, pad
# the prompts further on the left) and assert that rewards, advantages, losses, clip fraction and
# gradients are unchanged, together with an assertion that the first epoch starts at ratio 1. Most
# of the bugs above fail it.
#
# </details>

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3cedf549541d5bc1a3f455b5670c2c90", "grade": false, "grade_id": "70_exercises-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7. Exercises
#
# Five exercises, from a hand computation to two small experiments. They are extra credit: every grade id
# below starts with `ex`, and grading reports them apart from the six core tests. Exercises 1 and 2
# come with a visible check you can rerun as often as you like; 4 and 5 also have an autograded test
# (part of it hidden); the written parts are read by a person.
#
# Exercises 3 to 5 ask you to *measure* something. In the solved notebook those measurements call helpers
# from `mlbook_solutions.exercises`, which drive the same `collect_rollouts`, `ppo_update` and `train_ppo`
# you met in §3 through `PPOConfig` and their arguments (`sampler=`, `extra_loss=`, `evaluate=`). The
# two training sweeps (5 seeds, three or four arms each, a couple of minutes of CPU) are read from a cache
# that `python -m mlbook_solutions.exercises --refresh` regenerates; everything else runs live. Training
# is chaotic, so a refresh on another CPU moves the digits (a different float32 kernel is enough); the
# answers below therefore quote only what held on every refresh we ran, and the cells print the rest.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "02d01518f06fed43685fd5753a1384f7", "grade": false, "grade_id": "70_exercises-1", "locked": true, "schema_version": 3, "solution": false, "task": false}
import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlbook.posttrain.toy_lm import DemoBatch, demonstration_batch, sft_loss, token_log_probs

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "18519bc759f879f4afc90df0b3287678", "grade": false, "grade_id": "70_exercises-2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise 1 ★: a larger β on the §1 example
#
# Recompute the shaped rewards of the four-token example of §1 (log-probs under the policy
# $(-1.0, -0.5, -2.0, -0.1)$, under the reference $(-1.2, -0.5, -1.0, -0.1)$, score $1.5$ on the last token),
# once with $\beta = 0.1$ and once with $\beta = 0.2$, using **your** `shaped_rewards`. Store them in
# `ex1_rewards_01` and `ex1_rewards_02`, each of shape (1, 4). Then explain below why the sample's total
# return went *up* when the KL penalty got stronger.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "342095e0b87ea700786aee9053a419b3", "grade": false, "grade_id": "ex1_shaped_rewards", "locked": false, "schema_version": 3, "solution": true, "task": false} tags=["raises-exception"]
ex1_logp_policy = torch.tensor([[-1.0, -0.5, -2.0, -0.1]])
ex1_logp_ref = torch.tensor([[-1.2, -0.5, -1.0, -0.1]])
ex1_score, ex1_mask = (
    torch.tensor([1.5]),
    torch.ones(1, 4),
)  # one response of four tokens, no prompt, no padding
# YOUR CODE HERE
raise NotImplementedError("replace this line with your implementation")

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "e614e73e50f8f404221bb724d95aa52e", "grade": false, "grade_id": "70_exercises-4", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Check for exercise 1 (not graded: rerun it until it passes).
assert torch.allclose(ex1_rewards_02, torch.tensor([[-0.04, 0.0, 0.2, 1.5]]), atol=1e-6), (
    f"at beta = 0.2 the shaped rewards should be (-0.04, 0, +0.2, +1.5), got {ex1_rewards_02.tolist()}"
)
assert torch.allclose(ex1_rewards_01, torch.tensor([[-0.02, 0.0, 0.1, 1.5]]), atol=1e-6), (
    f"at beta = 0.1 the shaped rewards should be (-0.02, 0, +0.1, +1.5), got {ex1_rewards_01.tolist()}"
)
ex1_log_ratio = float((ex1_logp_policy - ex1_logp_ref).sum())
print("beta = 0.2 rewards:", [round(x, 4) + 0.0 for x in ex1_rewards_02[0].tolist()])
print(
    f"return at beta = 0.1: {float(ex1_rewards_01.sum()):.2f}   at beta = 0.2: {float(ex1_rewards_02.sum()):.2f}"
)
print(f"summed log-ratio log pi - log pi_ref over the sample: {ex1_log_ratio:+.2f}")


# %% [markdown] deletable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "markdown", "checksum": "7bb7cd92e92a54b81d260bd529feb1d0", "grade": true, "grade_id": "ex1_larger_beta", "locked": false, "points": 0, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "183fa8f9efa11a957080333410e8156f", "grade": false, "grade_id": "70_exercises-6", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise 2 ★★: λ = γ = 1 gives the Monte-Carlo return
#
# With $\gamma = \lambda = 1$, `advantages + values` from `gae` should equal the reward-to-go
# $G_t = \sum_{s \ge t} R_s$ at every response position, whatever the critic predicts. Write
# `reward_to_go(rewards, response_mask)` (no Python loop over positions: think `flip` and `cumsum`), then
# run the check, which compares your `gae` with it on a batch whose rows have prompts and padding of
# different lengths and a critic that predicts non-zero values on the padding. Finally, say in two lines
# why the identity holds.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "45e9eaca86ccc5c1b3f0b759b121c418", "grade": false, "grade_id": "ex2_reward_to_go", "locked": false, "schema_version": 3, "solution": true, "task": false}
def reward_to_go(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum of R_s for s >= t over the response, 0 off it: (B, T-1), (B, T-1) -> (B, T-1)."""
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "243a249d2ce0c74acd36adac804b7fb9", "grade": false, "grade_id": "70_exercises-8", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Check for exercise 2 (not graded): your reward_to_go against a plain loop, then your gae against it.
ex2_mask = torch.tensor(
    [[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0, 0]],
    dtype=torch.float64,
)
ex2_gen = torch.Generator().manual_seed(7)
ex2_rewards = (
    torch.rand(ex2_mask.shape, generator=ex2_gen, dtype=torch.float64) * 2 - 1
) * ex2_mask
ex2_values = (
    torch.rand(ex2_mask.shape, generator=ex2_gen, dtype=torch.float64) * 4 - 2
)  # non-zero on padding too
ex2_loop = torch.zeros_like(ex2_rewards)
for ex2_b in range(ex2_mask.shape[0]):
    ex2_running = 0.0
    for ex2_t in reversed(range(ex2_mask.shape[1])):
        ex2_running += float(ex2_rewards[ex2_b, ex2_t] * ex2_mask[ex2_b, ex2_t])
        ex2_loop[ex2_b, ex2_t] = ex2_running * float(ex2_mask[ex2_b, ex2_t])
ex2_mine = reward_to_go(ex2_rewards, ex2_mask)
assert torch.allclose(ex2_mine * ex2_mask, ex2_loop, atol=1e-10), (
    "reward_to_go differs from the loop on the response"
)
ex2_adv, ex2_ret = gae(ex2_rewards, ex2_values, ex2_mask, gamma=1.0, lam=1.0)
ex2_gap = float(((ex2_adv + ex2_values - ex2_loop) * ex2_mask).abs().max())
assert ex2_gap < 1e-6, (
    f"advantages + values differs from the reward-to-go by {ex2_gap:.3g} on the response"
)
print(f"largest |advantages + values - reward-to-go| on response tokens: {ex2_gap:.1e}")
print(
    "row 0 (3 prompt tokens, 3 response tokens, 2 of padding): G =",
    [round(x, 3) + 0.0 for x in ex2_loop[0].tolist()],
)

# %% [markdown] deletable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "markdown", "checksum": "2d0d1c90f8428c4e15ddb334090ecc40", "grade": true, "grade_id": "ex2_telescoping", "locked": false, "points": 0, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "1550e9c5429d36d3c81122da222dbb05", "grade": false, "grade_id": "70_exercises-10", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise 3 ★★: what whitening does and does not change
#
# `ppo_update` whitens the advantages over the batch by default: it subtracts their mean and divides by
# their standard deviation. (a) Argue that this leaves the direction of the expected policy gradient
# unchanged, and name a situation where it does change where the update ends up. (b) Measure it: on one
# rollout batch, run the same multi-epoch `ppo_update` with `whiten=True` and with `whiten=False`, starting
# both from identical copies of the policy, critic and optimizer, and count after each epoch how many
# response tokens have a ratio outside $[1-\epsilon, 1+\epsilon]$. (Hint: `ppo_update` returns one `EpochStats`
# per epoch, measured at the start of that epoch before its step; its `clip_frac` times the number of response
# tokens is the count. Add one more count after `ppo_update` returns.)

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "9cf9856a134bb600c6edbe4706634fe1", "grade": false, "grade_id": "ex3_demo", "locked": false, "schema_version": 3, "solution": true, "task": false} tags=["demo", "raises-exception"]
# YOUR CODE HERE
raise NotImplementedError("replace this line with your implementation")


# %% [markdown] deletable=false mlbook={"extra_credit": 2} nbgrader={"cell_type": "markdown", "checksum": "e69a6216b66a3f4c120a34827430eb56", "grade": true, "grade_id": "ex3_whitening_argument", "locked": false, "points": 0, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "860a05608e65460b8f312d6b668b9d78", "grade": false, "grade_id": "70_exercises-13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise 4 ★★★: an SFT anchor during PPO
#
# InstructGPT adds pretraining gradients to the PPO loss ("PPO-ptx") so that the policy does not lose what
# it could do before RL. The toy has no pretraining corpus, so this exercise builds the same kind of term
# on the data it does have, the SFT demonstrations. That is a different anchor: PPO-ptx holds the policy
# to the *pretraining* distribution (§5), this term holds it to the supervised behaviour, closer to mixing
# SFT batches into RL. The code keeps the name `ptx_coef` for the coefficient's role. Implement it: `make_ptx_loss(batch, ptx_coef)` returns a function `extra_loss(policy)` giving `ptx_coef` times the
# SFT loss of `policy` on the fixed demonstration batch (`demonstration_batch()`, scored with `sft_loss`),
# as a scalar tensor that carries gradient. `train_ppo(..., extra_loss=...)` passes
# it on to `ppo_update`, which adds it to every epoch's loss. Then show with curves, over several seeds,
# that the reward still rises while the SFT loss on the demonstrations stays within 10 % of its starting
# value, and that without the term it drifts much further.
#
# Start the run from a model that already fits the demonstrations (fine-tune the reference on them first,
# as InstructGPT starts PPO from its SFT model). From the untrained toy LM the SFT term would simply go on
# teaching the demonstrations, and the SFT loss would fall far below its start.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "b573682090a5e83b89c67fb35446d142", "grade": false, "grade_id": "ex4_ptx", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_ptx_loss(batch: DemoBatch, ptx_coef: float) -> Callable[[nn.Module], torch.Tensor]:
    """``extra_loss(policy) -> ptx_coef * sft_loss(policy(batch.input_ids), batch.labels)``."""

    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "code", "checksum": "4683b11220b875789da8d9a9d574cfc3", "grade": true, "grade_id": "ex4_ptx_test", "locked": true, "points": 0, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Graded (1 point, extra credit): the value and the gradient of your term against a loop over positions,
# on models the test builds, and that it evaluates the policy it is given.
import torch

from mlbook.posttrain.toy_lm import TinyCausalLM, ToyLMConfig, demonstration_batch

torch.manual_seed(0)
_lm = TinyCausalLM(ToyLMConfig(init_std=0.3))  # peaked, far from uniform
_term = make_ptx_loss(demonstration_batch(), 0.5)
assert callable(_term), "make_ptx_loss must return a function of the policy"
_value = _term(_lm)
assert isinstance(_value, torch.Tensor) and _value.numel() == 1, (
    "extra_loss(policy) must return a scalar tensor"
)
assert _value.requires_grad, (
    "the ptx term must carry gradient to the policy (no detach, no torch.no_grad)"
)

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "607ac72adfcfcb36c883f30c2b3ba55c", "grade": false, "grade_id": "ex4_demo", "locked": false, "schema_version": 3, "solution": true, "task": false} tags=["nbval-check-output", "demo", "raises-exception"]
# YOUR CODE HERE
raise NotImplementedError("replace this line with your implementation")


# %% [markdown] deletable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "markdown", "checksum": "b596908cca3ceb9c09b0422e163631ef", "grade": true, "grade_id": "ex4_ptx_findings", "locked": false, "points": 0, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "b4ca000512dee4afcebb47fe87a930b7", "grade": false, "grade_id": "70_exercises-18", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise 5 ★★★: asynchronous rollouts
#
# Large systems generate the next batch while the current one trains, so the sampler's weights lag one
# update behind the policy being trained. `train_ppo(sampler=StaleByOneUpdate())` (from
# `mlbook.posttrain.samplers`) does exactly that, and
# `collect_rollouts(sampler=...)` records `logp_old` from the model that actually sampled.
#
# Write `importance_ratios(policy, sampler, tokens, response_mask)`: the ratio
# $\pi_\theta(y_t)/\pi_{\text{sampler}}(y_t)$ of every sampled token, (B, T-1) like `token_log_probs`, equal to
# 1 off the response. Then (a) show over several seeds that the clip fraction rises when the sampler is one
# update stale, and (b) show numerically what goes wrong if `logp_old` is recorded from the *current*
# policy instead of the sampler and nothing else changes, and explain why that is wrong.
#
# (c) Recomputing is not wrong in itself: PPO's old policy does two jobs, and they can be separated (§4.2).
# `PPOConfig(behaviour_clip=(lo, hi))` makes `ppo_update` clip around the policy as it is when the update
# starts (the *proximal* policy) and multiply each token's term by the behaviour weight
# $\pi_{\text{prox}}/\pi_{\text{sampler}}$, clamped to $[lo, hi]$. Run it with OpenRLHF's default
# $[0.5, 5]$ next to the two arms of (a) and next to recomputation without the weight (a clamp to
# $[1, 1]$), and say what the weight buys on this toy.
#
# (d) Asynchronous systems let the lag grow past one update: AReaL caps it at a configured number of
# policy versions, PipelineRL keeps it close to zero (§4.2). `StaleBy(4)` (same module) samples with
# the weights of four updates ago. Run the three stale arms again with it and say what changes: which
# arm still learns steadily, and whether the behaviour weight now makes a difference.

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "22d4060f10009b5b32de55977b7075c8", "grade": false, "grade_id": "ex5_stale", "locked": false, "schema_version": 3, "solution": true, "task": false}
def importance_ratios(
    policy: nn.Module, sampler: nn.Module, tokens: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """pi_policy / pi_sampler per sampled token: (B, T), (B, T-1) -> (B, T-1); 1 off the response"""
    # YOUR CODE HERE
    raise NotImplementedError("replace this line with your implementation")


# %% deletable=false editable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "code", "checksum": "93511eab4c466cb84c97f52b406312d5", "grade": true, "grade_id": "ex5_stale_test", "locked": true, "points": 0, "schema_version": 3, "solution": false, "task": false} tags=["nbval-check-output", "raises-exception"]
# Graded (1 point, extra credit): your ratios against a loop over tokens, on a sampler and a policy that
# has moved on since. The visible part: shape, a model against itself, and 1 off the response.
import copy

from mlbook.posttrain.toy_lm import END_ID, TinyCausalLM, ToyLMConfig, make_prompts, sample

torch.manual_seed(0)
_sampler = TinyCausalLM(ToyLMConfig(init_std=0.3))
_gen = torch.Generator().manual_seed(0)
_tokens, _full_mask, _ = sample(_sampler, make_prompts(16, _gen), 6, END_ID, generator=_gen)
_mask = _full_mask[:, 1:]
_same = torch.as_tensor(
    importance_ratios(_sampler, copy.deepcopy(_sampler), _tokens, _mask)
).double()
assert _same.shape == _mask.shape, (
    f"ratios must be (B, T-1) like the mask, got {tuple(_same.shape)}"
)
assert torch.allclose(_same[_mask.bool()], torch.ones(()).double(), atol=1e-6), (
    "a model against itself has ratio 1"
)
_other = TinyCausalLM(
    ToyLMConfig(init_std=0.3)
)  # a different model: ratios move off 1 on the response
_moved = torch.as_tensor(importance_ratios(_other, _sampler, _tokens, _mask)).double()
assert (_moved[~_mask.bool()] == 1).all(), (
    "ratios must be exactly 1 off the response (prompt and padding positions): mask them"
)

# %% deletable=false nbgrader={"cell_type": "code", "checksum": "6b191c15139603852c290080bdca76ca", "grade": false, "grade_id": "ex5_demo", "locked": false, "schema_version": 3, "solution": true, "task": false} tags=["nbval-check-output", "demo", "raises-exception"]
# YOUR CODE HERE
raise NotImplementedError("replace this line with your implementation")

# %% [markdown] deletable=false mlbook={"extra_credit": 1} nbgrader={"cell_type": "markdown", "checksum": "11db6f37717f01432e2f9c717c84c4aa", "grade": true, "grade_id": "ex5_why_sampler_logp", "locked": false, "points": 0, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "3be4bb4a79d6fffeac07f770d2b2112f", "grade": false, "grade_id": "75_check_your_work-0", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["student-instructions"]
# ## Check your work
#
# Run the cell below after the rest (Run All, or run everything above first). It runs the visible
# part of every graded cell again against your functions and prints one line per check. It reads
# this notebook's file and writes nothing. The hidden tests are not in your copy: they run when the
# notebook is graded, and written answers are graded by a person. Each line names the function or
# section it checks.

# %% deletable=false editable=false nbgrader={"cell_type": "code", "checksum": "0aa5932bf0e2caffd25132fe36cb7788", "grade": false, "grade_id": "75_check_your_work-1", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["student-instructions"]
from mlbook.selfcheck import check

_checked = check("rlhf_ppo.ipynb")

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "0a936c3469c5340e511a49ddc331ef2f", "grade": false, "grade_id": "75_check_your_work-2", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["student-instructions", "self-paced"]
# **Hand in.** Save (Ctrl+S), then in a terminal in your work folder run
# `python -m mlbook.handin rlhf_ppo.ipynb` (with the checkout: `mlbook handin`), or in a new cell
# `from mlbook.handin import handin; handin()`. It checks that the saved file is what this kernel
# ran, is named `rlhf_ppo.ipynb` and is readable, runs these checks, and writes the one file to
# upload, `to-upload/rlhf_ppo.ipynb`. Nothing else is written.

# %% [markdown] deletable=false editable=false nbgrader={"cell_type": "markdown", "checksum": "916faf1bd7a3e280a8402011c07a6c32", "grade": false, "grade_id": "80_references-0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## References
#
# The prose cites these by author and year; arXiv numbers identify each paper.
#
# **Algorithms**
#
# - *Trust Region Policy Optimization.* Schulman, J., Levine, S., Moritz, P., Jordan, M., Abbeel, P.
#   (2015). ICML. arXiv:1502.05477.
# - *High-Dimensional Continuous Control Using Generalized Advantage Estimation.* Schulman, J.,
#   Moritz, P., Levine, S., Jordan, M., Abbeel, P. (2016). ICLR. arXiv:1506.02438. (GAE, §2.3.)
# - *Proximal Policy Optimization Algorithms.* Schulman, J., Wolski, F., Dhariwal, P., Radford, A.,
#   Klimov, O. (2017). arXiv:1707.06347. (The clipped surrogate, §2.2.)
# - *Approximating KL Divergence.* Schulman, J. (2020). Blog post, joschu.net/blog/kl-approx.html.
#   (The estimators $k_1$, $k_2$, $k_3$ of §2.2, §3.6 and §5.)
# - *Direct Preference Optimization: Your Language Model is Secretly a Reward Model.* Rafailov, R.,
#   et al. (2023). NeurIPS. arXiv:2305.18290. (DPO, §4.4.)
# - *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models.* Shao, Z.,
#   et al. (2024). arXiv:2402.03300. (GRPO, §4 and §5.)
#
# **RLHF with PPO on language models**
#
# - *Fine-Tuning Language Models from Human Preferences.* Ziegler, D. M., Stiennon, N., Wu, J.,
#   Brown, T. B., Radford, A., Amodei, D., Christiano, P., Irving, G. (2019). arXiv:1909.08593. Code:
#   github.com/openai/lm-human-preferences. (The per-token KL reward and the adaptive controller,
#   §2.)
# - *Learning to Summarize from Human Feedback.* Stiennon, N., et al. (2020). NeurIPS.
#   arXiv:2009.01325.
# - *Training Language Models to Follow Instructions with Human Feedback.* Ouyang, L., et al. (2022).
#   NeurIPS. arXiv:2203.02155. (InstructGPT and PPO-ptx, §5; exercise 4 builds a term of the same shape on SFT data.)
# - *Constitutional AI: Harmlessness from AI Feedback.* Bai, Y., et al. (2022). arXiv:2212.08073.
#   (§5.)
# - *Llama 2: Open Foundation and Fine-Tuned Chat Models.* Touvron, H., et al. (2023).
#   arXiv:2307.09288. (§4.2 and §5.)
# - *The Llama 3 Herd of Models.* Grattafiori, A., et al. (2024). arXiv:2407.21783. (§5.)
#
# **Implementation studies**
#
# - *Implementation Matters in Deep Policy Gradients: A Case Study on PPO and TRPO.* Engstrom, L.,
#   Ilyas, A., Santurkar, S., Tsipras, D., Janoos, F., Rudolph, L., Madry, A. (2020). ICLR.
#   arXiv:2005.12729. (§6, Q2.)
# - *The 37 Implementation Details of Proximal Policy Optimization.* Huang, S., Dossa, R. F. J.,
#   Raffin, A., Kanervisto, A., Wang, W. (2022). ICLR Blog Track.
# - *The N Implementation Details of RLHF with PPO.* Huang, S., Liu, T., von Werra, L. (2023).
#   Hugging Face blog; ICLR 2024 Blog Track. (Adam's $\epsilon$, the zero value head, §5.)
# - *The N+ Implementation Details of RLHF with PPO*, subtitled "A Case Study on TL;DR
#   Summarization". Huang, S., Noukhovitch, M., Hosseini, A., Rasul, K., Wang, W., Tunstall, L.
#   (2024). COLM 2024. arXiv:2403.17031.
#   (Reward whitening, `vf_coef` 0.1 and the production table, §2.3, §4.3 and §5.)
#
# **Libraries**
#
# - *CleanRL: High-quality Single-file Implementations of Deep Reinforcement Learning Algorithms.*
#   Huang, S., et al. (2022). JMLR 23(274). github.com/vwxyzjn/cleanrl.
# - *TRL: Transformers Reinforcement Learning.* von Werra, L., Belkada, Y., Tunstall, L., Beeching, E.,
#   Thrush, T., Lambert, N., Huang, S., Rasul, K., Gallouédec, Q. (2020). github.com/huggingface/trl
#   (title and authors as in its `CITATION.cff`). (Legacy `PPOTrainer` up to 0.11; the rewritten
#   trainer from 0.12, moved to `trl.experimental.ppo` in v0.26 (PR #4482), removed in 1.13.0 by
#   PR #7020; the defaults of §5 are read from 1.12.0's `PPOConfig`, the last release with PPO.)
# - *verl: Volcano Engine Reinforcement Learning for LLMs.* github.com/volcengine/verl; the paper is
#   Sheng, G., et al. (2025). *HybridFlow: A Flexible and Efficient RLHF Framework.* EuroSys.
#   arXiv:2409.19256. (Defaults of §5 read from v0.7.0's
#   `verl/trainer/config/_generated_ppo_trainer.yaml` and `verl/trainer/ppo/core_algos.py`.)
# - *OpenRLHF: An Easy-to-use, Scalable and High-performance RLHF Framework.* Hu, J., et al. (2024).
#   arXiv:2405.11143. github.com/OpenRLHF/OpenRLHF. (Defaults and flags read from v0.11.0:
#   `openrlhf/cli/train_ppo_ray.py`, `openrlhf/models/loss.py`, `openrlhf/trainer/ppo_trainer.py`;
#   one optimiser step per `--train.batch_size` samples by gradient accumulation in
#   `openrlhf/trainer/ray/ppo_actor.py`.)
#
# **Stale rollouts, KL as a loss, long responses** (§2, §4.2, §5, exercise 5)
#
# - *Batch Size-Invariance for Policy Optimization.* Hilton, J., Cobbe, K., Schulman, J. (2022).
#   NeurIPS. arXiv:2110.00641. (Decoupled PPO: proximal and behaviour policies, §4.2 and exercise 5.)
# - *Asynchronous RLHF: Faster and More Efficient Off-Policy RL for Language Models.* Noukhovitch, M.,
#   et al. (2024). arXiv:2410.18252. (§4.2.)
# - *On a Few Pitfalls in KL Divergence Gradient Estimation for RL.* Tang, Y., Munos, R. (2025).
#   arXiv:2506.09477. (KL estimators used as losses, §5 and §6 Q1.)
# - *DAPO: An Open-Source LLM Reinforcement Learning System at Scale.* Yu, Q., et al. (2025).
#   arXiv:2503.14476. (Clip-higher, token-level loss, overlong shaping, no KL term, §5.)
# - *Mastering Complex Control in MOBA Games with Deep Reinforcement Learning.* Ye, D., et al. (2020).
#   AAAI. arXiv:1912.09729. (Dual-clip PPO, §5.)
# - *Understanding R1-Zero-Like Training: A Critical Perspective.* Liu, Z., et al. (2025).
#   arXiv:2503.20783. (Dr. GRPO: biases of per-response averaging and of the group std, §5.)
# - *What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret.* Yuan, Y., Yue, Y.,
#   Zhu, R., Fan, T., Yan, L. (2025). arXiv:2503.01491. (Value pretraining and decoupled GAE, §5.)
# - *VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks.* Yue, Y., et al.
#   (2025). arXiv:2504.05118. (Length-adaptive GAE on top of value pretraining, §5.)
# - *Group Sequence Policy Optimization.* Zheng, C., et al. (2025). arXiv:2507.18071. (A sequence-level
#   ratio and clip, §5.)
# - *IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner Architectures.*
#   Espeholt, L., et al. (2018). ICML. arXiv:1802.01561. (V-trace: truncated importance weights, §4.2.)
# - *Your Efficient RL Framework Secretly Brings You Off-Policy RL Training.* Yao, F., et al. (2025). Blog post,
#   fengyao.notion.site/off-policy-rl. (The
#   training-inference mismatch and truncated importance sampling, §4.2.)
# - *Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model.* Ling Team
#   (2025). arXiv:2510.18855. (Ring-1T; IcePop's token mask, §4.2.)
#
# **The 2025-26 practice** (fifth edition: §3.8, §4.2, §4.5, §5)
#
# - *AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning.* Fu, W.,
#   et al. (2025). arXiv:2505.24298. (Asynchronous RL with the decoupled objective and a staleness
#   bound, §4.2.)
# - *PipelineRL: Faster On-policy Reinforcement Learning for Long Sequence Generation.* Piché, A., et
#   al. (2025). arXiv:2509.19128. (In-flight weight updates, §4.2.)
# - *Defeating the Training-Inference Mismatch via FP16.* Qi, P., et al. (2025). arXiv:2510.26788.
#   (§4.2's fp16 row.)
# - *Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers.* (2025).
#   arXiv:2510.11370. (Rollout routing replay, §4.2.)
# - Liu et al. (2025). arXiv:2510.01555. (KL estimators in the reward and in the loss, on and off
#   policy; $k_2$ as a loss, §5.)
# - *Preference Fine-Tuning of LLMs Should Leverage Suboptimal, On-Policy Data.* Tajwar, F., et al.
#   (2024). ICML. arXiv:2404.14367. (On-policy pairs for DPO, §4.4.)
# - *REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models.* Hu, J. (2025).
#   arXiv:2501.03262. (Batch-normalised advantages and the group-baseline form, §4.5.)
# - *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention.* MiniMax (2025).
#   arXiv:2506.13585. (CISPO, §4.5 and §5.)
# - *The Art of Scaling Reinforcement Learning Compute for LLMs.* Khatri, D., et al. (2025).
#   arXiv:2510.13786. (ScaleRL: sigmoidal compute-reward curves, §5.)
# - *DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning.*
#   DeepSeek-AI (2025). arXiv:2501.12948. (GRPO at scale, rule-based rewards, R1-Zero, §5.)
# - *Tülu 3: Pushing Frontiers in Open Language Model Post-Training.* Lambert, N., et al. (2024).
#   arXiv:2411.15124. (RLVR with PPO, §5.)
# - *The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models.* Cui, G., et al.
#   (2025). arXiv:2505.22617. (Entropy collapse, Clip-Cov and KL-Cov, §5.)
# - *ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large Language Models.*
#   Liu, M., et al. (2025). arXiv:2505.24864. (KL control with reference resets, §5.)
# - *RL's Razor: Why Online Reinforcement Learning Forgets Less.* Shenfeld, I., Pari, J., Agrawal, P.
#   (2025). arXiv:2509.04259. (Forgetting predicted by the KL moved, §5.)
# - *Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base
#   Model?* Yue, Y., et al. (2025). arXiv:2504.13837. (pass@k of RL-trained and base models, §5.)
# - *WARM: On the Benefits of Weight Averaged Reward Models.* Ramé, A., et al. (2024).
#   arXiv:2401.12187. (§3.8.)
# - *ODIN: Disentangled Reward Mitigates Hacking in RLHF.* Chen, L., et al. (2024). arXiv:2402.07319.
#   (§3.8.)
#
# **Systems** (§4)
#
# - *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models.* Rajbhandari, S., Rasley, J.,
#   Ruwase, O., He, Y. (2020). SC20. arXiv:1910.02054. (Sharding, §4.1.)
# - *DeepSpeed-Chat: Easy, Fast and Affordable RLHF Training of ChatGPT-like Models at All Scales.*
#   Yao, Z., et al. (2023). arXiv:2308.01320. Code: github.com/microsoft/DeepSpeedExamples,
#   `applications/DeepSpeed-Chat/dschat/rlhf/ppo_trainer.py` at commit 3b45859; the batch defaults
#   (16 generated and 16 trained per device, one generation batch, one PPO epoch) in
#   `applications/DeepSpeed-Chat/training/step3_rlhf_finetuning/main.py`. (Defaults and greedy
#   decoding for Llama models, §4.3 and §5.)
# - *Efficient Memory Management for Large Language Model Serving with PagedAttention.* Kwon, W., et
#   al. (2023). SOSP. arXiv:2309.06180. (vLLM, §4.2.)
#
# **Reward models, over-optimisation and critic-free advantages** (§3.7, §3.8, §4.5)
#
# - *Rank Analysis of Incomplete Block Designs: I. The Method of Paired Comparisons.* Bradley, R. A.,
#   Terry, M. E. (1952). Biometrika 39(3/4). (The Bradley-Terry model behind the pairwise loss, §3.7.)
# - *Deep Reinforcement Learning from Human Preferences.* Christiano, P., Leike, J., Brown, T. B.,
#   Martic, M., Legg, S., Amodei, D. (2017). NeurIPS. arXiv:1706.03741. (A reward model fitted to
#   pairwise comparisons, §3.7.)
# - *Scaling Laws for Reward Model Overoptimization.* Gao, L., Schulman, J., Hilton, J. (2023). ICML.
#   arXiv:2210.10760. (Gold and proxy reward against $\sqrt{\mathrm{KL}}$, §3.8.)
# - *A Long Way to Go: Investigating Length Correlations in RLHF.* Singhal, P., Goyal, T., Xu, J.,
#   Durrett, G. (2023). arXiv:2310.03716. (Length as the feature PPO exploits, §3.8.)
# - *Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
#   LLMs.* Ahmadian, A., Cremer, C., Gallé, M., Fadaee, M., Kreutzer, J., Pietquin, O., Üstün, A.,
#   Hooker, S. (2024). ACL. arXiv:2402.14740. (RLOO, §4.5.)
# - *Is DPO Superior to PPO for LLM Alignment? A Comprehensive Study.* Xu, S., Fu, W., Gao, J., Ye, W.,
#   Liu, W., Mei, Z., Wang, G., Yu, C., Wu, Y. (2024). ICML. arXiv:2404.10719. (Well-tuned PPO against
#   DPO, §4.4 and §4.5.)
# - *Reward Model Ensembles Help Mitigate Overoptimization.* Coste, T., Anwar, U., Kirk, R.,
#   Krueger, D. (2023). ICLR 2024. arXiv:2310.02743. (§4.3, §6 Q6.)
# - *Helping or Herding? Reward Model Ensembles Mitigate but do not Eliminate Reward Hacking.*
#   Eisenstein, J., et al. (2023). arXiv:2312.09244. (§4.3, §6 Q6.)
# - *Theoretical Guarantees on the Best-of-n Alignment Policy.* Beirami, A., et al. (2024).
#   arXiv:2401.01879. (The best-of-$N$ KL bound, §4.4 and §6 Q5.)
#
# **What the fifth edition changed, and where.** For readers of the fourth: §1's table now names
# §3.7-3.8, §4.5 and §5's long-response knobs. §3.6 says why the length rises (the reward favours
# it) instead of calling it a hack. §3.8 reports its summary table in one unit, the equal-KL result
# as measured (the largest $\beta$ slightly ahead at every $\sqrt{\mathrm{KL}}$, within what three
# seeds can separate), what the clean control does and does not show, and WARM and ODIN among the
# remedies. §4.2 adds asynchronous systems (AReaL, PipelineRL), an fp16 row to the mismatch table,
# routing replay, and sources for the README figure and for DPO's on-policy pairs (§4.4). §4.5
# explains the PPO/RLOO/GRPO tie with per-token credit measured during training and a sweep at 8
# samples a step, names the GRPO arm for what it is (the published objective at the chapter's
# settings), traces its KL gap to the group-std division with an ablation arm, and adds REINFORCE++,
# CISPO and dynamic sampling. §5 corrects the reading of the defaults table (two camps on $\lambda$
# and the value clip, three on the reward clip; a row of optimiser steps per rollout batch; why one
# epoch does not switch the clip off), adds $k_2$ as a loss to the KL cell and §6 Q1, the
# verifiable-reward recipes (Tülu 3, DeepSeek-R1), ScaleRL, the entropy mechanism, the case for
# keeping a reference KL (ProRL, RL's Razor, Yue et al.) and VAPO's loss on correct responses, drops
# an unsourced anecdote about a per-rank KL, and draws a plainer lesson from Llama 3.
