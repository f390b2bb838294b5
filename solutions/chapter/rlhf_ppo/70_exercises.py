# %% [markdown]
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

# %%
import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlbook.posttrain.toy_lm import DemoBatch, demonstration_batch, sft_loss, token_log_probs

# %% [markdown]
# ### Exercise 1 ★: a larger β on the §1 example
#
# Recompute the shaped rewards of the four-token example of §1 (log-probs under the policy
# $(-1.0, -0.5, -2.0, -0.1)$, under the reference $(-1.2, -0.5, -1.0, -0.1)$, score $1.5$ on the last token),
# once with $\beta = 0.1$ and once with $\beta = 0.2$, using **your** `shaped_rewards`. Store them in
# `ex1_rewards_01` and `ex1_rewards_02`, each of shape (1, 4). Then explain below why the sample's total
# return went *up* when the KL penalty got stronger.

# %% solution="ex1_shaped_rewards"
ex1_logp_policy = torch.tensor([[-1.0, -0.5, -2.0, -0.1]])
ex1_logp_ref = torch.tensor([[-1.2, -0.5, -1.0, -0.1]])
ex1_score, ex1_mask = (
    torch.tensor([1.5]),
    torch.ones(1, 4),
)  # one response of four tokens, no prompt, no padding
### BEGIN SOLUTION
ex1_rewards_01 = shaped_rewards(ex1_score, ex1_logp_policy, ex1_logp_ref, ex1_mask, beta=0.1)
ex1_rewards_02 = shaped_rewards(ex1_score, ex1_logp_policy, ex1_logp_ref, ex1_mask, beta=0.2)
### END SOLUTION

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% [markdown] manual="ex1_larger_beta" points=1
# The KL term changes each token's reward by $-\beta\,(\log\pi - \log\pi_{\text{ref}})$, so over the whole
# sample it adds $-\beta \sum_t (\log\pi_t - \log\pi_{\text{ref},t})$ to the score. For this sample the
# summed log-ratio is $0.2 + 0 - 1.0 + 0 = -0.8$ (printed above): token 3 is much *less* likely under the
# policy than under the reference, and that outweighs token 1. The KL term is therefore a net payment *to*
# the sample, $+0.8\,\beta$, and it grows with $\beta$: the return is $1.5 + 0.8\beta$, which is $1.58$ at
# $\beta = 0.1$ and $1.66$ at $\beta = 0.2$.
#
# This does not contradict the KL penalty. On a single sample the log-ratio can have either sign; only its
# expectation under the policy, the KL divergence, is non-negative. A larger $\beta$ rewards samples the
# policy produces less readily than the reference would, and taxes the ones it overproduces, which is what
# pulls the policy back toward the reference.

# %% [markdown]
# ### Exercise 2 ★★: λ = γ = 1 gives the Monte-Carlo return
#
# With $\gamma = \lambda = 1$, `advantages + values` from `gae` should equal the reward-to-go
# $G_t = \sum_{s \ge t} R_s$ at every response position, whatever the critic predicts. Write
# `reward_to_go(rewards, response_mask)` (no Python loop over positions: think `flip` and `cumsum`), then
# run the check, which compares your `gae` with it on a batch whose rows have prompts and padding of
# different lengths and a critic that predicts non-zero values on the padding. Finally, say in two lines
# why the identity holds.


# %% stub="mlbook_solutions.exercises:reward_to_go" grade_id="ex2_reward_to_go"

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% [markdown] manual="ex2_telescoping" points=1
# With $\gamma = \lambda = 1$ the advantage is the plain sum of TD errors from $t$ to the last response
# token $L$: $A_t = \sum_{s=t}^{L} \delta_s$ with $\delta_s = R_s + V_{s+1} - V_s$. The values cancel in
# pairs, leaving $A_t = \sum_{s=t}^{L} R_s + V_{L+1} - V_t$, and $V_{L+1} = 0$ because nothing follows the
# last response token. So $A_t + V_t = \sum_{s \ge t} R_s = G_t$ for any critic. The one place this can
# break is the end of the response: a `gae` that reads the critic's value at the first padding position
# instead of zero leaves $V_{L+1} \neq 0$ in every row with padding after its response, which is why the
# check gives the critic non-zero values on the padding.

# %% [markdown]
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

# %% solution="ex3_demo" demo=true
### BEGIN SOLUTION
from mlbook_solutions.exercises import exact_baseline_gradient, whitening_clip_counts

ex3_baseline = exact_baseline_gradient(seed=0)
print(
    f"sum_v pi(v) grad log pi(v) at one state: largest entry {ex3_baseline['expectation']:.1e} "
    f"(a single grad log pi(v) reaches {ex3_baseline['single_term']:.2f})"
)
print("\ntokens outside the clip range after k epochs (k = 0..6), same rollout batch, same start:")
for ex3_seed in range(3):
    ex3 = whitening_clip_counts(seed=ex3_seed, batch=64, epochs=6)
    print(
        f"seed {ex3_seed}: {ex3['n_tokens']} response tokens; raw advantages mean {ex3['raw_adv_mean']:+.2f}, "
        f"std {ex3['raw_adv_std']:.2f}, {100 * ex3['raw_adv_positive']:.0f} % positive"
    )
    print(f"   whitened: {ex3['counts']['whitened']}")
    print(f"   raw:      {ex3['counts']['raw']}")
### END SOLUTION

# %% [markdown] manual="ex3_whitening_argument" points=2
# **Centering.** The per-token policy-gradient estimate is $\hat g = \frac1N \sum_t A_t \nabla_\theta \log
# \pi_\theta(a_t \mid s_t)$. Replacing $A_t$ by $A_t - b$ for a constant $b$ changes its expectation by
# $$b\, \mathbb{E}_{a \sim \pi_\theta}\big[\nabla_\theta \log \pi_\theta(a \mid s)\big]
#   = b \sum_a \pi_\theta(a \mid s) \frac{\nabla_\theta \pi_\theta(a \mid s)}{\pi_\theta(a \mid s)}
#   = b\, \nabla_\theta \sum_a \pi_\theta(a \mid s) = b\, \nabla_\theta 1 = 0 .$$
# The first printed line checks this on the toy LM: summed exactly over the 16 tokens, the expectation is
# zero up to float32 round-off, although single terms are of order one. The argument needs the actions to
# be drawn from $\pi_\theta$ itself, which holds at the first PPO epoch (every ratio is 1). The batch mean
# is estimated from the same batch, so it is only approximately a constant; the bias this leaves shrinks
# as $1/N$.
#
# **Scaling.** Dividing by the standard deviation $\sigma > 0$ multiplies $\hat g$ by $1/\sigma$: same
# direction, different length. With plain SGD that is just a different learning rate. Adam divides each
# parameter's step by a running estimate of its gradient's size, so a constant scale is absorbed: the first
# Adam step is the same for every $\sigma$ (up to Adam's $\epsilon$).
#
# **Where it matters.** PPO does not take one gradient step: it takes several on a clipped objective. The
# clip range is fixed in ratio space, $[1-\epsilon, 1+\epsilon]$, while how far each epoch moves the ratios
# depends on the step, and which tokens are pushed up or down depends on the sign of $A_t - b$. Once a
# token leaves the clip range in the direction its advantage wants, its gradient is zero for the remaining
# epochs. So whitening changes which tokens get clipped and when, and therefore where the multi-epoch
# update stops. The same holds for any other term in the loss: scaling the advantages by $1/\sigma$ is
# equivalent to scaling an entropy bonus or a ptx term by $\sigma$, which moves the optimum of the combined
# objective.
#
# **Measured.** The two arms start from the same weights, optimizer state and batch, yet by the third epoch
# they clip different numbers of tokens on all three seeds; on seed 2 the gap reaches 74 tokens (154 against
# 80 after five epochs). Seed 0 parts at once: its raw advantages were all positive (the untrained critic
# underestimates every return), so without centering every sampled token is pushed up, and after one epoch
# 49 tokens were outside the clip range against 24 with whitening. On seeds 1 and 2 the counts coincide for
# the first two epochs and only then part. Equal counts do not mean equal updates (centering flips the sign
# of many advantages, so the two arms move the weights differently from the first step); they mean that the
# same tokens crossed the band first. The counts part as the epochs go on and more tokens reach the clip.

# %% [markdown]
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

# %% stub="mlbook_solutions.exercises:make_ptx_loss" grade_id="ex4_ptx"

# %% test="ex4_ptx_test" needs_answers=true tags=["nbval-check-output"]
# Graded: the value and the gradient of your term against a loop over positions,
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

# %% solution="ex4_demo" tags=["nbval-check-output"] demo=true
### BEGIN SOLUTION
from mlbook_solutions.exercises import (
    PTX,
    demonstration_floor,
    load_results,
    plot_ptx,
    summarise,
)

ex4_results = (
    load_results()
)  # cached sweep; `python -m mlbook_solutions.exercises --refresh` reruns it
ex4_summary = summarise(ex4_results)
print(
    f"{len(PTX['seeds'])} seeds x ptx_coef in {PTX['ptx_coefs']}: {PTX['steps']} PPO steps on {PTX['batch']} prompts, "
    f"from a model fine-tuned {PTX['sft_steps']} steps on the demonstrations (torch {ex4_results['torch']})"
)
ex4_stats = {
    "sft_final_ratio": "SFT loss, end / start",
    "sft_peak_ratio": "SFT loss, highest / start",
    "reward_first": "reward, first step",
    "reward_last5": "reward, last 5 steps",
    "kl_last5": "KL, last 5 steps",
}
ex4_rows = ["| arm | per-seed statistic | mean ± std over seeds | min | max |"]
ex4_rows.append("|---|---|---:|---:|---:|")
for ex4_key, (ex4_m, ex4_s, ex4_lo, ex4_hi) in ex4_summary.items():
    if ex4_key.startswith(("plain", "ptx")):
        ex4_arm, ex4_stat = ex4_key.split("_", 1)  # "ptx0.5", "sft_final_ratio"
        ex4_arm = "no ptx term" if ex4_arm == "plain" else f"ptx_coef = {ex4_arm[3:]}"
        ex4_rows.append(
            f"| {ex4_arm} | {ex4_stats[ex4_stat]} | {ex4_m:.3f} ± {ex4_s:.3f} | {ex4_lo:.3f} | {ex4_hi:.3f} |"
        )
display(Markdown("\n".join(ex4_rows)))
ex4_start = [r["sft"][0] for runs in ex4_results["ptx"].values() for r in runs]
print(
    f"SFT loss at the start of PPO: {min(ex4_start):.4f} to {max(ex4_start):.4f} nats/token; lowest "
    f"any model can reach on these demonstrations: {demonstration_floor():.4f} nats/token"
)
ex4_outside = []
for ex4_key, ex4_runs in ex4_results["ptx"].items():
    ex4_out = sum(abs(v / r["sft"][0] - 1) > 0.10 for r in ex4_runs for v in r["sft"])
    ex4_total = sum(len(r["sft"]) for r in ex4_runs)
    ex4_outside.append(f"{float(ex4_key):g}: {ex4_out} of {ex4_total}")
print("seed-steps with the SFT loss outside start ± 10 %, by ptx_coef: " + "; ".join(ex4_outside))
show(
    plot_ptx(ex4_results),
    alt="Two panels over PPO steps, mean and spread over seeds for each ptx_coef: the mean reward (good tokens), "
    "and the SFT loss on the demonstrations with a grey band at its starting value plus or minus 10 %.",
)
### END SOLUTION

# %% [markdown] manual="ex4_ptx_findings" points=1
# The cache holds 5 seeds of 30 PPO steps on 32 prompts with the chapter's settings. Every run starts from
# a model fine-tuned on the four demonstrations, whose SFT loss is already close to the lowest any model
# can reach on them (both are printed): the demonstrations disagree on their first word (`the` or `a`) and
# on the second. Ratios below are the SFT loss divided by its value at the start of PPO; the cell prints
# their mean, spread and range, which move in the second decimal from one CPU to another.
#
# * **Without the term** the SFT loss drifts far: it ends at more than twice its start on every seed, and
#   several times its start on average. Chasing `good` tokens moves probability away from the
#   demonstrated sentences.
# * **With `ptx_coef = 2`** it ends within 10 % of its start on every seed, and recorded at the start of
#   each step it leaves that band at only a handful of the 150 seed-steps. The reward still rises on
#   every seed: the mean over the last five steps is above the first step's.
# * **`ptx_coef = 1`** sits in between and shows the trade-off: more reward than `ptx_coef = 2` on average,
#   but a looser hold, outside the ±10 % band at ten times as many seed-steps or more. Against plain PPO
#   its reward is within the seed-to-seed spread: which of the two comes out ahead changed from one CPU
#   to another.
#
# So the SFT term keeps the supervised behaviour while the reward still climbs, and a tight hold costs
# reward: with `ptx_coef = 2` the climb is slower than without the term or with `ptx_coef = 1`. The 10 % claim is about where the run ends and, for
# `ptx_coef = 2`, almost every step on the way; it is not a guarantee for every step of every seed.

# %% [markdown]
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

# %% stub="mlbook_solutions.exercises:importance_ratios" grade_id="ex5_stale"

# %% test="ex5_stale_test" needs_answers=true tags=["nbval-check-output"]
# Graded: your ratios against a loop over tokens, on a sampler and a policy that
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

# %% solution="ex5_demo" tags=["nbval-check-output"] demo=true
### BEGIN SOLUTION
from mlbook_solutions.exercises import (
    BEHAVIOUR_CLIP,
    STALE,
    STALE_ARMS,
    behaviour_weights,
    load_results,
    plot_stale,
    ratio_stats,
    stale_batch,
    summarise,
    weight_effect,
)

ex5_results = (
    load_results()
)  # cached sweep; `python -m mlbook_solutions.exercises --refresh` reruns it
ex5_summary = summarise(ex5_results)
print(
    f"(a, c) {len(STALE['seeds'])} seeds, {STALE['steps']} steps on {STALE['batch']} prompts; KL target "
    f"{CHAPTER_RUN.kl_target}, beta starts at {CHAPTER_RUN.beta}; mean ± std [min, max] over seeds:"
)
ex5_rows = [
    "| arm | clip fraction, steps 2..N | reward, last 5 steps | steps with KL under target "
    "| lowest beta | final beta | KL to the reference, last 5 steps |",
    "|---|---|---|---|---|---|---|",
]
for ex5_name in STALE_ARMS:
    ex5_mean, ex5_std, ex5_lo, ex5_hi = ex5_summary[f"{ex5_name}_clip_mean"]
    ex5_rew = ex5_summary[f"{ex5_name}_reward_last5"]
    ex5_runs = ex5_results["stale"][ex5_name]
    ex5_under = [
        sum(k < CHAPTER_RUN.kl_target for k in r["kl"]) for r in ex5_runs
    ]  # steps in which beta fell
    ex5_low = [min(r["beta"]) for r in ex5_runs]
    ex5_kl, ex5_beta = ex5_summary[f"{ex5_name}_kl_last5"], ex5_summary[f"{ex5_name}_beta_final"]
    ex5_rows.append(
        f"| `{ex5_name}` | {ex5_mean:.3f} ± {ex5_std:.3f} [{ex5_lo:.3f}, {ex5_hi:.3f}] | {ex5_rew[0]:.2f} ± {ex5_rew[1]:.2f} "
        f"| {min(ex5_under)}-{max(ex5_under)} | {min(ex5_low):.3f}-{max(ex5_low):.3f} "
        f"| {ex5_beta[0]:.3f} ± {ex5_beta[1]:.3f} | {ex5_kl[0]:.2f} ± {ex5_kl[1]:.2f} |"
    )
display(Markdown("\n".join(ex5_rows)))
show(
    plot_stale(ex5_results),
    alt="Four panels over PPO steps, mean and min-max band over seeds. Top row, a sampler one update behind; "
    "bottom row, four updates behind; each row shows the on-policy arm and three stale arms (clip around the "
    "sampler; decoupled, clip around the proximal policy with a truncated behaviour weight; clip around the "
    "proximal policy, no weight). Left: the clip fraction of the last epoch, highest for the arm clipped around "
    "the sampler. Right: the mean reward; four updates behind, the two arms clipped around the proximal policy "
    "rise above the on-policy arm and fall back, while the arm clipped around the sampler climbs slowly.",
)
# (d) Peaks and ends, and the behaviour weight against none, seed by seed, at each lag.
ex5_peaks = [
    "| arm | best step's reward | its step | highest KL to the reference | reward, last 5 steps |",
    "|---|---|---|---|---|",
]
for ex5_name in ("on_policy", "stale4", "decoupled4", "recomputed4"):
    ex5_peak, ex5_step, ex5_klmax, ex5_end = (
        ex5_summary[f"{ex5_name}_{f}"]
        for f in ("reward_peak", "peak_step", "kl_max", "reward_last5")
    )
    ex5_peaks.append(
        f"| `{ex5_name}` | {ex5_peak[0]:.2f} ± {ex5_peak[1]:.2f} [{ex5_peak[2]:.2f}, {ex5_peak[3]:.2f}] "
        f"| {ex5_step[0]:.1f} [{ex5_step[2]:.0f}, {ex5_step[3]:.0f}] "
        f"| {ex5_klmax[0]:.2f} ± {ex5_klmax[1]:.2f} [{ex5_klmax[2]:.2f}, {ex5_klmax[3]:.2f}] "
        f"| {ex5_end[0]:.2f} ± {ex5_end[1]:.2f} [{ex5_end[2]:.2f}, {ex5_end[3]:.2f}] |"
    )
display(Markdown("\n".join(ex5_peaks)))
ex5_e = {lag: weight_effect(ex5_results, lag) for lag in ("", "4")}
print(
    f"(d) behaviour weight vs none, seeds of {ex5_e['']['seeds']} where the weighted arm peaks higher, "
    "reaches a higher KL, ends lower:"
)
for ex5_lag, ex5_label in (("", "one update behind"), ("4", "four updates behind")):
    print(
        f"   {ex5_label:19s} {ex5_e[ex5_lag]['peaks_higher']}, {ex5_e[ex5_lag]['kl_higher']}, "
        f"{ex5_e[ex5_lag]['ends_lower']}"
    )

# (b) One batch sampled by a copy of the policy one update stale, seen from the first PPO epoch.
ex5_policy, ex5_sampler, ex5_roll = stale_batch(seed=0, batch=64)
ex5_right = importance_ratios(
    ex5_policy, ex5_sampler, ex5_roll["tokens"], ex5_roll["mask"]
)  # logp_old from the sampler
ex5_wrong = importance_ratios(
    ex5_policy, ex5_policy, ex5_roll["tokens"], ex5_roll["mask"]
)  # logp_old from the policy
print(f"(b) stale batch, {int(ex5_roll['mask'].sum())} response tokens, ratios at the first epoch:")
for ex5_label, ex5_ratio in (
    ("logp_old from the sampler", ex5_right),
    ("logp_old from the current policy", ex5_wrong),
):
    ex5_s = ratio_stats(ex5_ratio, ex5_roll["mask"])
    print(
        f"   {ex5_label:33s} mean |r-1| {ex5_s['mean_abs_dev']:.4f}, max |r-1| {ex5_s['max_abs_dev']:.4f}, "
        f"outside the clip {100 * ex5_s['clip_frac']:.1f} %"
    )
ex5_log_gap = float((torch.log(ex5_right) * ex5_roll["mask"]).abs().max())
print(f"   largest |log pi_policy - log pi_sampler| on a sampled token: {ex5_log_gap:.3f}")
ex5_w = behaviour_weights(
    ex5_policy, ex5_roll
)  # clamp(pi_prox / pi_sampler): the decoupled form's weight
ex5_on = ex5_roll["mask"].bool()
ex5_clamped = float(
    ((ex5_w[ex5_on] <= BEHAVIOUR_CLIP[0]) | (ex5_w[ex5_on] >= BEHAVIOUR_CLIP[1])).float().mean()
)
ex5_same = torch.allclose(ex5_w[ex5_on], ex5_right[ex5_on].clamp(*BEHAVIOUR_CLIP))
print(
    f"   decoupled: ratio 1 at the first epoch; the behaviour weight is the sampler ratio of the first line, "
    f"clamped to {BEHAVIOUR_CLIP}: {ex5_same}; tokens at the clamp: {100 * ex5_clamped:.1f} %"
)
### END SOLUTION

# %% [markdown] manual="ex5_why_sampler_logp" points=1
# **(a)** Over 5 seeds (steps 2 to 30; step 1 is on-policy in every arm), the clip fraction with a sampler
# one update stale is about three times the on-policy one, and higher on every seed: the lowest stale seed
# is above the highest on-policy seed (the cell prints mean, spread and range). With the sampler's
# `logp_old`, the ratio at the first epoch already measures how far the policy has moved since the
# sampler's weights: on the stale batch of (b) a sizeable share of the response tokens is outside the clip
# range before any step is taken.
#
# The stale runs also end with a *higher* reward on this toy, and the printed trace shows where it comes
# from: KL budget, not better learning. Sampling with weights one update old slows the start, so the KL to
# the reference stays under its target for more steps than on-policy (the ranges do not overlap), and the
# controller keeps lowering $\beta$ all that time. After that both arms sit above 1.2 times the target,
# where the controller's clip caps the rise of $\beta$ at the same 2 % per step, so the stale arm never
# makes up the difference and ends with a lower $\beta$ on every seed. With a cheaper KL fee the stale
# policy drifts further from the reference, and that extra drift buys the extra `good` tokens.
#
# **(b)** Recording `logp_old` from the current policy makes every first-epoch ratio exactly 1 (printed:
# mean and max $|r-1|$ are 0, nothing is clipped). That looks tidy, but the data were drawn from
# $\pi_{\text{stale}}$, not $\pi_\theta$. The surrogate's gradient at ratio 1 is
# $\mathbb{E}_{y \sim \pi_{\text{stale}}}[A\,\nabla\log\pi_\theta(y)]$, which is not the policy gradient
# of $\pi_\theta$: the factor $\pi_\theta/\pi_{\text{stale}}$ that re-weights the stale samples has been
# thrown away, so tokens the sampler favoured more than the current policy count too much and the
# others too little, while the clip fraction and the approximate KL report that nothing is off. The
# chapter's `collect_rollouts` records the sampler's log-probs and checks them against those recorded
# while sampling, so this cannot happen by accident here.
#
# **(c)** Recomputation is wrong only when the correction is dropped with it. The decoupled form
# (Hilton, Cobbe and Schulman, 2022) lets the proximal policy anchor the clip, which is what keeps each
# update small, and gives the correction to a separate weight $\pi_{\text{prox}}/\pi_{\text{sampler}}$;
# truncating that weight so that one token cannot dominate is the V-trace practice (Espeholt et al.,
# 2018) that OpenRLHF's correction follows. At the first epoch the proximal policy is the current
# one, so the weight is exactly the sampler ratio of (b), clamped; on that batch no token reaches the
# clamp (the cell prints the share). In the sweep both recomputing arms clip a fraction between the on-policy and the stale arm
# on every seed; note that their clip fraction measures the drift within an update only, while the
# stale arm's also contains the lag of the sampler. On this toy the weight buys nothing measurable: with
# and without it the rewards and KLs differ by less than their seed-to-seed spread, and which of the two
# peaks higher changes from seed to seed. One update of lag on eight-token responses is mild
# staleness; (d) makes it larger. The other case the truncated weight is built for, an inference
# engine whose numbers differ from the trainer's at the same weights (§4.2), has no lag at all.
#
# **(d)** Four updates of lag pull apart the designs that one update left together (bottom row of the
# figure, second table):
#
# * **Clip around the sampler** still learns, slowly. The lag alone now uses up the band: about half
#   the response tokens are outside the clip range, averaged over the run, the highest clip fraction
#   of every arm on every seed, and such a token adds no gradient when its advantage pushes it further
#   out. The
#   reward is still rising at the end (its best step is one of the last five on every seed), and it
#   ends inside the on-policy arm's range.
# * **Clip around the proximal policy**, with the weight or without, lets each update go as far as an
#   on-policy one would. Both arms climb above the on-policy arm and push the KL to the reference
#   further (the mean of their best steps, and of their highest KLs, is above every on-policy seed's),
#   then give back most of what they gained and end below the on-policy arm on every seed. This rise and fall is what
#   a feedback loop with a delay does: the KL fee and the KL the controller reads are both computed
#   from the sampler's log-probabilities, so they charge the drift of four updates ago. (The reward and
#   KL curves of every stale arm describe the sampled batches, so they lag too.)
# * **The weight now matters**, and it pushes the same way as the delay: seed by seed, the weighted arm
#   peaks higher, reaches a higher KL and ends lower than the unweighted one, on every seed, where one
#   update behind each of these comparisons went both ways. Clamped at 5 from above, the weight enlarges
#   the terms of the tokens the policy has moved toward since they were sampled, so the update follows
#   the current policy's own gradient more closely and goes further in the direction the stale fee has
#   not yet caught up with.
#
# The decoupled objective makes stale tokens usable; it does not make the lag free. That is why AReaL
# bounds how many versions behind its samplers may run and PipelineRL swaps weights mid-generation:
# both keep the delay in the loop short, and what the weight corrects is then small.
