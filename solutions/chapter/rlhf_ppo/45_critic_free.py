# %% [markdown]
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
# The comparison below changes only the advantage. All three arms draw 64 responses per step (GAE:
# 64 prompts; RLOO and GRPO: 16 prompts, $k = 4$ each), pay the same per-token KL fee in the reward
# with a fixed $\beta = 0.3$ (so GRPO's KL sits in the reward here, not in its loss), and update
# with the same clipped surrogate, epochs and learning rate. Each arm runs for 40 steps on three
# seeds; the sweep is cached like §3.8's.

# %% include="mlbook_solutions.critic_free:_validate_groups,rloo_advantages,grpo_advantages,sequence_returns"

# %% [markdown]
# One group of four responses to the same prompt, to see what each baseline does with it:

# %% tags=["nbval-check-output"]
cf_group = torch.tensor([3.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # returns of k = 4 samples
print("returns:                  ", cf_group.tolist())
print("RLOO advantages:          ", [round(a, 3) for a in rloo_advantages(cf_group, 4).tolist()])
print("GRPO advantages:          ", [round(a, 3) for a in grpo_advantages(cf_group, 4).tolist()])
print("RLOO / (R - group mean):  ", round(float(rloo_advantages(cf_group, 4)[0] / (3.0 - cf_group.mean())), 4),
      "= k / (k - 1)")  # fmt: skip
print("a group of equal returns: ", grpo_advantages(torch.ones(4, dtype=torch.float64), 4).tolist(),
      "(no signal, no update)")  # fmt: skip

# %% include="mlbook_solutions.critic_free:summarise,format_table,plot_arms,ARMS" tags=["nbval-check-output"]
cf_results = load_cached("critic_free")
cf_beta = cf_results["config"]["beta"]
cf_summary = summarise(cf_results)
display(Markdown(format_table(cf_summary, cf_beta)))
cf_obj = [s["objective"] for s in cf_summary.values()]
print(
    f"regularised objective, last 10 steps: {min(cf_obj):.2f} to {max(cf_obj):.2f} across the three arms"
)
print(f"the critic is {cf_summary['gae']['critic_bytes'] / 1e3:.0f} kB of weights plus "
      f"{cf_summary['gae']['critic_train_bytes'] / 1e3:.0f} kB of gradients and Adam moments "
      f"(float32: 4 + 4 + 8 bytes per parameter)")  # fmt: skip
cf_speed = cf_summary["gae"]["seconds"] / statistics.fmean(
    cf_summary[a]["seconds"] for a in ("rloo", "grpo")
)
print(
    f"on the machine that wrote the cache, a GAE run took {cf_speed:.1f}x as long as a critic-free one"
)
print(
    f"7B critic (16 B/param, §4.1): {human_bytes(16 * 7e9)} of static memory that RLOO and GRPO do not need"
)

# %% demo=true
show(
    plot_arms(cf_results),
    alt="Two panels over 40 steps, mean of three seeds with min-max bands: reward (left) and KL to "
    "the reference (right) for GAE with a critic, RLOO and GRPO. The three reward curves rise "
    "together from about 0.5 to about 5 good tokens within 15 steps and then overlap; the KL curves "
    "rise to about 10 nats and overlap too.",
)

# %% [markdown]
# Where each wins, on this measurement (the table and the cell above give the numbers):
#
# - **Final quality: a tie.** With the same samples and the same KL fee, the three arms end at the
#   same reward, KL and regularised objective, within the spread over seeds. The toy's reward is
#   one number at the end of at most eight tokens, with nothing for token-level credit to find, so
#   a learned $V(s_t)$ has little to add over a group baseline.
# - **Speed per sample: no clear winner.** GAE's mean reward over the first ten steps is a little
#   higher, but not on every seed: the spread over three seeds is as large as the gap. Whatever
#   extra information the critic's per-token values carry, this task does not reward it.
# - **Cost: RLOO and GRPO, clearly.** Without the critic a run is much cheaper in wall time (no
#   critic forward, backward or optimiser step; the cell prints the ratio, and every seed agrees)
#   and the critic's weights, gradients and Adam state are gone; at 7B that is the 112 GB the cell
#   prints.
#
# What the toy cannot settle is how the estimators compare on long responses with informative
# intermediate tokens, where a good critic can assign credit inside a response and a sequence-level
# advantage cannot; GRPO's per-group normalisation also changes how much each prompt counts, a choice
# this task with equal-difficulty prompts does not test. Published comparisons need the same care
# as this one: Xu et al. (2024) found that PPO, tuned carefully, beats DPO across dialogue and code
# benchmarks, so a weak result for any method may be a weakly tuned baseline.
