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
for i in range(6):
    print(f"chosen   (gold {rm_gold_c[i]:+.1f}): {decode(rm_pairs.chosen[i])}")
    print(f"rejected (gold {rm_gold_r[i]:+.1f}): {decode(rm_pairs.rejected[i])}")
rm_ties = float((rm_pairs.gold_margin == 0).float().mean())
rm_flipped = float((rm_pairs.gold_margin < 0).float().mean())
print(f"over {len(rm_pairs.chosen):,} pairs: {rm_ties:.0%} tie on gold (a coin flip decides them), "
      f"{rm_flipped:.0%} were labelled against the gold order")  # fmt: skip

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
# Graded (1 point, extra credit): value and gradient against a loop over pairs, in float32 and float64,
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
print(f"{rm_cfg['train_pairs']:,} training pairs, {rm_cfg['heldout_pairs']:,} held out, "
      f"{rm_cfg['rm_steps']} Adam steps, gain and bias fitted on {rm_cfg['norm_samples']:,} samples; "
      f"cache written in {rm_results['seconds']:.0f} s")  # fmt: skip
for seed, r in rm_results["rms"].items():
    print(f"seed {seed}: pairwise loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f} (train), "
          f"{r['heldout_loss']:.3f} held out; agrees with the noisy held-out labels on "
          f"{r['heldout_accuracy']:.1%}, with the gold order on {r['gold_accuracy']:.1%} of the "
          f"pairs gold can tell apart; gain {r['gain']:.3f}, bias {r['bias']:+.3f}")  # fmt: skip
rm_noise_ceiling = 1 / (1 + math.exp(-1.0))  # sigmoid(1)
print(f"a rater who prefers the better of two responses one gold point apart does so "
      f"{rm_noise_ceiling:.1%} of the time")  # fmt: skip

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
# reward keeps rising while the gold reward rises, peaks and falls. The figure shows every step of
# every run (three reward models, one per seed, three values of $\beta$).

# %% include="mlbook_solutions.reward_model:summarise,plot_overoptimisation" tags=["nbval-check-output"]
rm_summary = summarise(rm_results)
print(f"{'beta':>6} {'gold start':>10} {'gold peak':>9} {'KL at peak':>10} {'gold end':>8} "
      f"{'proxy end':>9} {'KL end':>6} {'length end':>10}")  # fmt: skip
for beta in rm_cfg["betas"]:
    s = rm_summary[str(beta)]
    print(f"{beta:>6g} {s['gold_start']:>10.2f} {s['gold_peak']:>9.2f} {s['kl_at_peak']:>10.2f} "
          f"{s['gold_final']:>8.2f} {s['proxy_final']:>9.2f} {s['kl_final']:>6.2f} "
          f"{s['length_final']:>10.2f}")  # fmt: skip
rm_low, rm_high = str(min(rm_cfg["betas"])), str(max(rm_cfg["betas"]))
print(f"beta {rm_low}: gold falls from its peak {rm_summary[rm_low]['gold_peak']:.2f} to "
      f"{rm_summary[rm_low]['gold_final']:.2f} while the proxy ends at {rm_summary[rm_low]['proxy_final']:.2f} "
      f"standard deviations above the initial policy")  # fmt: skip

# %% demo=true
show(
    plot_overoptimisation(rm_results),
    alt="Scatter of lines: gold reward (solid) and learned proxy reward (dashed) against the square "
    "root of the KL to the reference, for every PPO step of three seeds at three fixed betas. The "
    "proxy rises steadily with the square root of KL; the gold reward rises at first, peaks at a "
    "small KL and falls well below its starting value for the smallest beta, which reaches the "
    "largest KL; the largest beta stays at small KL near the gold peak.",
)

# %% [markdown]
# What the runs show (the cell above prints the numbers):
#
# - **The proxy is not the goal.** With the smallest $\beta$ the policy learns to write `good` in
#   every position. The proxy calls that the best response it has seen, several standard deviations
#   above the initial policy, while the gold score ends well below where it *started*. The reward
#   model was never wrong about the data it saw; it was asked about responses far outside it, where
#   "more `good` is better" was an extrapolation.
# - **Gold peaks at a small KL.** In every run gold first rises, peaking at a few nats; where the
#   KL keeps growing past that, gold falls while the proxy still climbs. Gao et al. fit the gold score of RL runs with $d(\alpha - \beta \log d)$, where
#   $d = \sqrt{\mathrm{KL}}$ (and best-of-$n$ with $d(\alpha - \beta d)$). The peak in the table is the
#   largest of 60 noisy step means, so it sits a little above the curve it samples.
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
#   stopping the run earlier on the same curve. The same holds on the toy: at equal KL, the three
#   $\beta$ values sit on one gold curve.
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
rm_init = sample(build_models(seed=0).ref, make_prompts(1024, torch.Generator().manual_seed(5)), 8, END_ID,
                 generator=torch.Generator().manual_seed(6))  # fmt: skip
rm_len = rm_init.response_mask.sum(1)  # (1024,)
rm_gold = gold_reward(rm_init.tokens, rm_init.response_mask)  # (1024,)
rm_corr = torch.corrcoef(torch.stack([rm_len, rm_gold]))[0, 1]
rm_len0 = statistics.fmean(r["length"][0] for runs in rm_results["runs"].values() for r in runs)
print(f"initial policy: mean response length {rm_len0:.2f} tokens (first PPO step, all runs); "
      f"correlation of length and gold over 1,024 samples: {float(rm_corr):.2f}")  # fmt: skip

# %% [markdown]
# The remedies §4.3 lists for over-optimisation follow from this picture: more KL (or an earlier
# stop), reward models trained on fresh samples of the current policy, ensembles whose disagreement
# flags extrapolation, and explicit length control.
