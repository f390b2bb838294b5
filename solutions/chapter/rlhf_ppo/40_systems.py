# %% [markdown]
# ## 4. Systems view: memory, time, and what breaks
#
# On the toy, §3's loop takes a few seconds; the cell below divides the time its run printed by its
# number of steps. At production scale the same loop is limited by two budgets that the algorithm
# description hides: **memory**, because one PPO step keeps four networks resident, and
# **wall-clock**, because every step starts by sampling fresh responses one token at a time. This
# section prices both, measures the split on the toy (with your own `ppo_update`), and then lists
# the failure modes you will meet and how to tell them apart.

# %% needs_answers=true demo=true
print(
    f"§3.6: {len(history)} PPO steps in {train_seconds:.1f} s, {train_seconds / len(history):.3f} s per step on this machine"
)

# %% [markdown]
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

from mlbook.posttrain.systems import (
    format_memory_table,
    human_bytes,
    rlhf_memory_table,
    rlhf_over_pretraining,
)

# %% tags=["nbval-check-output"] demo=true
n_policy = sum(p.numel() for p in policy.parameters())
n_critic = sum(p.numel() for p in critic.parameters())
toy_rows = rlhf_memory_table(n_policy, critic_params=n_critic, reward_params=0)
print(f"toy policy: {n_policy:,} parameters, critic: {n_critic:,} parameters")
display(Markdown(format_memory_table(toy_rows)))

# %% [markdown]
# Now a 7B policy with a critic, reference and reward model of the same size, the usual
# back-of-envelope setting (decimal units, $1\,\text{GB} = 10^9$ bytes):

# %% tags=["nbval-check-output"]
rows_7b = rlhf_memory_table(7e9)
display(Markdown(format_memory_table(rows_7b)))
total_7b = rows_7b[-1]
print(
    f"7B: {total_7b.bytes_per_param:.0f} bytes/param -> {human_bytes(total_7b.total_bytes)} of static state"
)
print(f"pretraining the same 7B model: 16 bytes/param -> {human_bytes(16 * 7e9)}")
print(f"PPO-RLHF / pretraining = 36 / 16 = {rlhf_over_pretraining(7e9):.2f}x")

# %% [markdown]
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

# %% tags=["nbval-check-output"]
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

# %% [markdown]
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

# %% tags=["nbval-check-output"]
h100_bf16_flops, h100_hbm_bytes_per_s = 989e12, 3.35e12  # H100 SXM: dense bf16, HBM3 [H100]
ridge = h100_bf16_flops / h100_hbm_bytes_per_s
floor_ms = 1e3 * 2 * 7e9 / h100_hbm_bytes_per_s  # read 14 GB of bf16 weights once per step
print(f"FLOPs per byte needed to be compute-bound on an H100: {ridge:.0f}")
print(f"decode does about B FLOPs per weight byte read: memory-bound for B < {ridge:.0f}")
print(f"7B, one GPU: each decode step takes >= {floor_ms:.1f} ms just to stream the weights,")
print(f"so a 1,000-token response needs >= {floor_ms:.1f} s of strictly sequential steps")

# %% [markdown]
# Now measure the toy. `time_ppo_step` runs one step on copies of your trained `policy` and `critic`
# (a fresh optimiser each time, so nothing in the notebook changes) and reports the median of each
# phase over three repeats. The functions it times are arguments: §3's `collect_rollouts`, the
# reward function, and `ppo_update` (built on your functions) with §3's settings.

# %% needs_answers=true demo=true
from functools import partial

from mlbook.posttrain.systems import format_time_split, time_ppo_step

update = partial(ppo_update, beta=0.3, cfg=CHAPTER_RUN)  # §3's settings
step_fns = dict(rollout=collect_rollouts, reward_fn=good_count_reward, update=update)
split = time_ppo_step(policy, ref, critic, prompts, max_new_tokens=8, repeats=3, **step_fns)
n_resp = split["response_tokens"]
print(f"one PPO step on the toy: {len(prompts)} prompts, {n_resp:.0f} response tokens")
print(format_time_split(split))

# %% [markdown]
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

# %% demo=true
from mlbook.posttrain.toy_lm import sample

naive, cached = (
    sample(policy, prompts, 8, END_ID, generator=torch.Generator().manual_seed(0), use_cache=c)
    for c in (False, True)
)
gap = (naive.logprobs - cached.logprobs).abs().max()
print(f"same tokens: {torch.equal(naive.tokens, cached.tokens)}; largest log-prob gap: {gap:.1e}")

# %% [markdown]
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

# %% tags=["nbval-check-output"] demo=true
kv_P, kv_n = prompts.shape[1], 64
kv_work_bound = sum(range(kv_P, kv_P + kv_n)) / kv_n
print(
    f"prompt {kv_P}, {kv_n} new tokens: the naive sampler does {kv_work_bound:.1f}x the token passes"
)

# %% demo=true
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

# %% [markdown]
# The gap between the cache and the floor is exactly the work the floor skips: storing each new key
# and value, and letting the query attend over every cached position instead of one. Both grow
# with the batch; the cell above printed how many bytes of keys and values the full cache holds,
# read again by every late step, and on a small CPU that is a sizeable part of a step. How far apart the
# two bounds and the cache sit depends on the machine: a faster core shrinks the fixed cost of each
# operation and raises the bound, a larger batch gives the naive sampler more work to repeat (`make
# bench` prints batch 16 and 128). Neither bound describes a real LLM, whose decode steps are
# dominated by streaming the weights, as the 7B estimate earlier in this section showed.

# %% [markdown]
# **The sweep.** The trained policy's context holds 32 positions, so the sweep builds fresh models
# with a longer one, `ToyLMConfig(max_len=72)` (untrained weights cost the same time as trained
# ones), and switches stopping off (`eos_id=None`), so every response has exactly the length asked
# for. One untimed pass first pays the one-off costs (allocations, first calls), then each length
# and sampler is timed three times on 32 prompts and the median kept. That is still a small sample
# on a machine that may be shared: `make bench` runs lengths 8 to 128 on 64 prompts.

# %% needs_answers=true demo=true
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

# %% [markdown]
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

# %% needs_answers=true demo=true
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

# %% [markdown]
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

# %% demo=true
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

# %% [markdown]
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

# %% tags=["nbval-check-output"] demo=true
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

# %% [markdown]
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
