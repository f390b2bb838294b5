# %% [markdown]
# ## 4. Systems view: memory, time, and what breaks
#
# On the toy, §3's loop takes a few seconds (its cell prints the time; about 0.1 s per step). At production scale the same loop is limited by two
# budgets that the algorithm description hides: **memory**, because one PPO step keeps four
# networks resident, and **wall-clock**, because every step starts by sampling fresh responses one
# token at a time. This section prices both, measures the split on the toy (with your own
# `ppo_update`), and then lists the failure modes you will meet and how to tell them apart.
#
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

# %%
from IPython.display import Markdown, display

from mlbook.posttrain.systems import format_memory_table, human_bytes, rlhf_memory_table, rlhf_over_pretraining

n_policy = sum(p.numel() for p in policy.parameters())
n_critic = sum(p.numel() for p in critic.parameters())
toy_rows = rlhf_memory_table(n_policy, critic_params=n_critic, reward_params=0)
print(f"toy policy: {n_policy:,} parameters, critic: {n_critic:,} parameters")
display(Markdown(format_memory_table(toy_rows)))

# %% [markdown]
# Now a 7B policy with a critic, reference and reward model of the same size, the usual
# back-of-envelope setting (decimal units, $1\,\text{GB} = 10^9$ bytes):

# %%
rows_7b = rlhf_memory_table(7e9)
display(Markdown(format_memory_table(rows_7b)))
total_7b = rows_7b[-1]
print(f"7B: {total_7b.bytes_per_param:.0f} bytes/param -> {human_bytes(total_7b.total_bytes)} of static state")
print(f"pretraining the same 7B model: 16 bytes/param -> {human_bytes(16 * 7e9)}")
print(f"PPO-RLHF / pretraining = 36 / 16 = {rlhf_over_pretraining(7e9):.2f}x")

# %% [markdown]
# So PPO-RLHF needs $36/16 = 2.25\times$ the static memory of pretraining the same model, and no
# single 80 GB accelerator holds it. The standard ways out:
#
# - **Shard it.** ZeRO stage 3 (DeepSpeed) or FSDP (PyTorch) partitions weights, gradients and
#   optimiser state of each trained model across the $N$ data-parallel ranks and gathers a layer's
#   weights just before it runs, so static memory per GPU is about $36P/N$ bytes: 252 GB over 8
#   GPUs is about 32 GB each. The frozen pair can be sharded the same way, offloaded to CPU between
#   phases, or placed on their own GPUs (OpenRLHF places the four models on separate GPU groups with
#   Ray; other stacks co-locate everything and swap).
# - **LoRA.** Train low-rank adapters on a frozen base. The reference is then the base model with the
#   adapters switched off, so it costs nothing extra, and Adam state exists only for the adapters.
#   A critic can be a second adapter (plus a value head) on the same base.
# - **Drop the critic.** GRPO replaces $V(s_t)$ with the mean reward of a group of samples for the
#   same prompt; with a rule-based verifier instead of a reward model only the policy (16) and the
#   reference (2) remain.
#
# The cell below prices these variants for 7B. The LoRA row assumes adapters with 1 % of the base's
# parameters; the exact share depends on the rank and which matrices get adapters.

# %%
P, lora_share = 7e9, 0.01
variants = {
    "PPO, four full models": 16 + 16 + 2 + 2,
    "GRPO with a reward model (no critic)": 16 + 2 + 2,
    "GRPO with a verifier (policy + reference)": 16 + 2,
    "PPO with LoRA policy and critic on one frozen base": 2 + 2 * 16 * lora_share + 2,  # base, two adapters, RM
}
for name, bytes_per_param in variants.items():
    print(f"{name:<52} {bytes_per_param:5.2f} B/param -> {human_bytes(bytes_per_param * P):>7}")

# %% [markdown]
# ### 4.2 Time: generation dominates
#
# A PPO step has four phases: **generate** responses, run the **forward** passes that record
# $\log\pi_{\text{old}}$, $\log\pi_{\text{ref}}$ and $V(s_t)$, **score** with the reward model, and
# **update** policy and critic for a few epochs. The update looks like the expensive part (backward
# passes, two optimisers), yet at scale generation is where the time goes:
#
# - **It is sequential.** Token $t+1$ cannot start before token $t$ is sampled, so a 1,000-token
#   response is 1,000 dependent forward passes; the training passes see all tokens at once.
# - **It is memory-bound.** Each decode step reads every weight (and the KV cache) from HBM to do
#   about $2P$ FLOPs per sequence in the batch, i.e. roughly $B$ FLOPs per byte for a batch of $B$
#   sequences. An accelerator needs far more than that to be compute-bound (the cell below computes
#   the ratio for an H100), and the KV cache caps $B$ long before that.
# - **It has a tail.** Responses end at different lengths; a static batch waits for its longest
#   sequence while the finished rows idle.

# %%
h100_bf16_flops, h100_hbm_bytes_per_s = 989e12, 3.35e12  # H100 SXM: dense bf16 peak, HBM3 bandwidth
ridge = h100_bf16_flops / h100_hbm_bytes_per_s
decode_step_floor_ms = 1e3 * 2 * 7e9 / h100_hbm_bytes_per_s  # read 14 GB of bf16 weights once per step
print(f"FLOPs per byte needed to be compute-bound on an H100: {ridge:.0f}")
print(f"decode with a batch of B sequences does about B FLOPs per weight byte read: memory-bound for B < {ridge:.0f}")
print(f"7B, one GPU: each decode step takes >= {decode_step_floor_ms:.1f} ms just to stream the weights,")
print(f"so a 1,000-token response needs >= {decode_step_floor_ms:.1f} s of strictly sequential steps")

# %% [markdown]
# Now measure the toy. `time_ppo_step` runs one step on copies of your trained `policy` and `critic`
# (a fresh optimiser each time, so nothing in the notebook changes), times each phase with
# `time.perf_counter`, and reports the median over three repeats. The update is **your**
# `ppo_update` from §3, with §3's settings.

# %%
from mlbook.posttrain.systems import format_time_split, time_ppo_step

split = time_ppo_step(
    policy, ref, critic, prompts, good_count_reward, END_ID, ppo_update, max_new_tokens=8, repeats=3, beta=0.3, cfg=CHAPTER_RUN
)
print(f"one PPO step on the toy: {len(prompts)} prompts, {split['response_tokens']:.0f} response tokens")
print(format_time_split(split))

# %% [markdown]
# Generation's share depends on how long the responses are. Allow longer responses (the toy's
# context holds 32 tokens) and time the step again (two repeats each):

# %%
longest = policy.cfg.max_len - prompts.shape[1] - 2
print(f"{'max new tokens':>14} {'response tokens':>16} {'generation':>11} {'update':>8} {'step ms':>8}")
for n_new in (8, 16, longest):
    s = split if n_new == 8 else time_ppo_step(
        policy, ref, critic, prompts, good_count_reward, END_ID, ppo_update, max_new_tokens=n_new, repeats=2, warmup=0,
        beta=0.3, cfg=CHAPTER_RUN,
    )  # fmt: skip
    fr = s["fractions"]
    print(f"{n_new:>14} {s['response_tokens']:>16.0f} {fr['generation']:>11.1%} {fr['update']:>8.1%} {1e3 * s['total_s']:>8.0f}")

# %% [markdown]
# On the toy the update wins and generation is a minority share at 8 tokens, though its share
# climbs quickly with response length. That is the **opposite** of a real run,
# where most reports put 60-80 % of wall-clock into generation. The toy is not lying about PPO; it is
# just in a different regime:
#
# - Its 27k-parameter model does a forward pass's arithmetic in microseconds; the millisecond or two a
#   forward actually takes is Python and kernel-launch overhead, so every phase is dominated by that overhead, not by memory bandwidth. Generation's structural handicap,
#   streaming billions of weight bytes per token, does not exist here.
# - Responses are at most 8 tokens, so generation is 8 dependent steps, while the update runs
#   four epochs of forward and backward passes through two networks plus Adam.
# - The reward is a token count, essentially free; a real reward model is another full forward pass
#   of a large network over every sampled sequence.
#
# What carries over is the *shape* of the argument, and the length sweep above shows it: generation
# cost grows with response length faster than the update's (the toy's sampler even re-reads the whole
# prefix at every step, having no KV cache), and none of its steps can run in parallel.
#
# Production stacks therefore move rollouts to an inference engine (vLLM, SGLang: paged KV cache,
# continuous batching), copy the new weights into it after every update, and often overlap
# generation for step $k+1$ with training on step $k$. That overlap makes the data one update stale,
# which PPO's ratio can absorb **only if** $\log\pi_{\text{old}}$ is the log-probability under the
# weights that actually sampled (§3's `sampler=` argument). A second, subtler gap: even with
# identical weights, an inference engine's kernels do not reproduce the trainer's numbers exactly.
# Most stacks therefore recompute $\log\pi_{\text{old}}$ with the trainer *using the weights that sampled*
# (in synchronous training the first epoch then starts at ratio 1) and, if they correct the engine/trainer mismatch at all, do it with a separate
# truncated importance weight (OpenRLHF's `enable_vllm_is_correction`). Llama 2's report describes
# the other half of the problem: with FSDP, sampling was very slow until the full weights were
# gathered onto each node once before generation and freed afterwards.
#
# ### 4.3 Failure modes: symptom, cause, fix
#
# Read the diagnostic column first: most symptoms have two or three causes, and the cheap check
# that separates them is what an experienced practitioner reaches for.
#
# | Symptom | Likely cause | How to confirm | Fix |
# |---|---|---|---|
# | Reward climbs, samples get worse (longer, formulaic, sycophantic) | Over-optimisation: the policy exploits the reward model off its training distribution | Fresh human or strong-judge labels on current samples; length drift; disagreement within an RM ensemble | Lower KL target / raise $\beta$; stop earlier; refresh the RM on current samples; length penalty or length-controlled RM |
# | KL to the reference explodes in the first tens of steps | Step too large: LR too high, $\beta$ too small, too many PPO epochs or minibatches | Approx-KL $\mathbb E[r-1-\log r]$ between old and new policy per epoch; clip fraction high from epoch 1 | Lower LR; 1-2 epochs; adaptive KL controller; early-stop the epochs on approx-KL |
# | Reward flat **and** clip fraction $\approx 0$ | The policy barely moves: LR too low, advantages near zero, or the signal never reaches the tokens | Histogram of advantages; is the score landing on a response token (see the off-by-one row)?; gradient norm | Raise LR; check masks and score placement; normalise the RM's scale once (a fixed gain/bias on SFT samples) rather than per-batch reward whitening, which Huang et al. (2024) found hurt |
# | Value loss dwarfs the policy loss, training unstable | Critic far from the returns: random or poorly matched init, large reward scale | Explained variance of $V$ vs returns; value-loss share of the total | Initialise the critic from the RM; warm it up with the policy frozen; clip values; lower `vf_coef`; separate optimiser or gradient clip for the critic |
# | Entropy collapses, many prompts get the same answer | KL too weak; reward favours one template | Per-token entropy over training; distinct-$n$ of samples | Raise $\beta$ or the KL target; a *small* entropy bonus (a large one spreads mass over a 100k-token vocabulary) |
# | Loss taken on prompt tokens or after EOS | Missing or misaligned response mask (the mask must be shifted with the log-probs) | Appending padding to a batch changes the loss | Mask everything outside the response in every loss, the KL and the whitening statistics |
# | KL to the reference drifts with asynchronous rollouts although every first-epoch ratio is exactly 1 | Off-policy drift hidden by bookkeeping: samples from stale weights, $\log\pi_{\text{old}}$ recomputed with the current ones, so the importance correction vanishes | Compare $\log\pi_{\text{old}}$ with the log-probs recorded at sampling (`collect_rollouts` does, to 1e-4); with correct bookkeeping a stale batch starts at ratio $\neq 1$ (exercise 5 prints how far) and the clip fraction rises | Record $\log\pi_{\text{old}}$ under the weights that sampled; cap staleness at one update |
# | Measured KL to the reference is negative | Impure sampling: top-$k$/top-$p$, suppressed EOS or other logit processors make the sampled distribution differ from the one you score | Compare the log-probs recorded while sampling with recomputed ones | Sample from the exact distribution you score (plain temperature sampling), or score the processed distribution |
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
# | PPO (this chapter) | A scalar reward model, prompts | 4: policy, critic (trained); reference, RM (frozen) | On-policy, token-level credit through the critic; strongest at optimising a learned reward | Most memory and infrastructure; many knobs; critic can destabilise | You have a good RM, the budget for four models, and the proxy reward still has headroom |
# | DPO | Preference pairs | 2: policy (trained), reference (frozen; log-probs can be precomputed) | Supervised-style loss, stable, cheap; no sampling during training | Offline: learns only from the pairs it is given; can drift from the data; iterate with fresh on-policy pairs to recover much of the gap | Pairs only, limited compute, or very large models (Llama 3's choice) |
# | GRPO / RLVR | A verifiable reward (tests, exact answers) or an RM; several samples per prompt | 2-3: policy (trained), reference, optional RM | No critic; the group mean is the baseline; suits long reasoning traces with a sparse end reward | $k$ samples per prompt multiplies generation; sequence-level credit only | Rewards can be checked by a program and responses are long |
# | Rejection sampling + SFT (best-of-$N$) | An RM; an SFT pipeline | 1 trained at a time; the RM only scores | Trivial to run on any SFT stack; KL to the sampler at most $\log N - (N-1)/N$; explores broadly | Only reinforces whole winning samples; gains plateau | First round of any RLHF effort, or as the warm start before PPO (Llama 2) |
