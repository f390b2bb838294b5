# %% [markdown]
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

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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

# %% needs_answers=true
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

# %% [markdown]
# **The defaults you will meet.** Reading a paper's or a colleague's settings, you need to know what
# they left at the library's default. The cell below lists those defaults for three stacks, read
# from their code at the versions named in the header, next to DeepSpeed-Chat (Yao et al., 2023,
# arXiv:2308.01320; its `DeepSpeedPPOTrainer` hard-codes them) and this chapter's `CHAPTER_RUN`. TRL
# is a historical column: its PPO trainer moved to `trl.experimental.ppo` in v0.26 (PR #4482) and was
# removed altogether in 1.13.0 (PR #7020), so 1.12.0 is the last release that has it. verl is the
# stack a student starting in 2026 is most likely to meet; its column is read from v0.7.0's
# generated trainer config, `verl/trainer/config/_generated_ppo_trainer.yaml`, and the dual clip from
# `compute_policy_loss_vanilla` in `verl/trainer/ppo/core_algos.py`.

# %% tags=["nbval-check-output"] demo=true
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

# %% [markdown]
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
