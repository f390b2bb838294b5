# %% [markdown]
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
