# %% [markdown]
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

# %%
import math
import statistics
from typing import NamedTuple

import torch.nn as nn
import torch.nn.functional as F

from mlbook.posttrain.cached import load_cached
from mlbook.posttrain.masks import validate_mask
from mlbook.posttrain.toy_lm import GOOD_ID, PAD_ID, TinyTransformer, make_prompts, sample

# %% include="mlbook_solutions.reward_model:GOLD_PEAK,GOLD_SLOPE_PAST_PEAK,gold_reward,Pairs,_padded,preference_pairs,TinyRewardModel"

# %% [markdown]
# Pairs of the kind the reward model is trained on, drawn from this chapter's reference model (the
# initial policy), with their gold scores and the label the noisy rater gave:

# %%
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

# %% [markdown]
# **Exercise (extra credit).** Write `pairwise_loss(r_chosen, r_rejected)`: the mean over pairs of
# $-\log\sigma(r_{\text{chosen}} - r_{\text{rejected}})$, as a scalar tensor with gradient. Make it
# numerically stable: a reward model that is confidently wrong on a pair has a margin of $-100$ or
# less, where $\sigma$ underflows to 0 in float32 and $\log$ of it is $-\infty$. PyTorch has the
# stable form built in.

# %% include="mlbook_solutions.reward_model:validate_pair_rewards"

# %% stub="mlbook_solutions.reward_model:pairwise_loss" grade_id="ex_pairwise_loss"

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% test="ex_pairwise_loss_test" needs_answers=true tags=["nbval-check-output"]
# Graded: value and gradient against a loop over pairs, in float32 and float64,
# for several batch sizes; a large margin stays finite; the inputs are left as they were.
_loss = pairwise_loss(torch.tensor([0.5, -0.5]), torch.tensor([0.0, 0.0]))
assert isinstance(_loss, torch.Tensor) and _loss.numel() == 1, (
    "pairwise_loss must return a scalar tensor"
)

# %% [markdown]
# **Training it.** `train_reward_model` samples 2,048 training pairs and 1,024 held-out pairs from
# the initial policy, fits the model with full-batch Adam on the reference `pairwise_loss`, and
# then fits the gain and bias on 1,024 fresh samples. The three seeds of this section and the PPO
# runs against each of their reward models take a minute or two of CPU (the cell prints how long
# they took when the cache was written), too long for a notebook cell, so they were run once by
# `python -m mlbook_solutions.reward_model --refresh` and are read from the library's cache
# (`mlbook.posttrain.cached`), which stores a fingerprint of the code that produced it and a short
# float64 rerun that the tests repeat. The code is the chapter's own:

# %% include="mlbook_solutions.reward_model:RMConfig,RM_RUN,TrainedRM,train_reward_model,GoldLogger,overoptimisation_run"

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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

# %% include="mlbook_solutions.reward_model:gold_z,summarise,gold_at_equal_kl,_band,plot_overoptimisation" tags=["nbval-check-output"]
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

# %% demo=true
show(
    plot_overoptimisation(rm_results),
    alt="Two panels against the square root of the KL to the reference, rewards in standard "
    "deviations of the initial policy's samples, mean of three seeds with min-max bands. Left: for "
    "three fixed betas the proxy (dashed) rises steadily, while gold (solid) rises to a peak at a "
    "square-root KL near 2 and then falls below zero for the two smaller betas, which travel "
    "furthest; the largest beta stops near the peak. Right, the control with a monotone gold: gold "
    "and proxy rise together and stay together.",
)

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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
# %% demo=true
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

# %% [markdown]
# **The control: a gold that does not reverse.** If over-optimisation were something PPO does to any
# learned reward, it would show up with any gold. The cache therefore holds a second set of runs
# (`refresh` in `mlbook_solutions.reward_model`): for each seed a reward model trained the same way
# on labels from `monotone_gold`, §3.6's count of `good` tokens, where more praise is always
# better, then PPO against it at the smallest $\beta$, the setting that over-optimised hardest above.
# The right panel of the figure shows the result, and the cell below prints it.

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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
