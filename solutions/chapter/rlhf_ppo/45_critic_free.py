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

# %% include="mlbook_solutions.critic_free:_validate_groups,rloo_advantages,grpo_advantages,sequence_returns"

# %% [markdown]
# One group of four responses to the same prompt, to see what each baseline does with it:

# %% tags=["nbval-check-output"]
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

# %% include="mlbook_solutions.critic_free:published_grpo_update"

# %% include="mlbook_solutions.critic_free:summarise,format_table,plot_arms,ARMS,LABELS" tags=["nbval-check-output"]
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

# %% [markdown]
# Where does credit assignment show? The toy's reward is a sum of per-token indicators, one for
# each `good`, which is exactly what a learned $V(s_t)$ can credit token by token, so the question
# is fair. The next cell reads two more measurements from the same cache. During each GAE run, on a
# batch of 16 prompts with 4 samples each (drawn with a generator of its own, so training is
# untouched), it computed every estimator's per-token advantage, GAE's from the critic as it stood
# and RLOO's and GRPO's one per response, and correlated each with the indicator that the token is
# `good`. And a second sweep runs the three PPO-update arms with 8 samples a step instead of 64,
# where a critic's per-token credit might be worth more, recording the step at which each run's
# reward, averaged over 5 steps, first reaches the threshold in the table's header.

# %% include="mlbook_solutions.critic_free:steps_to_threshold,credit_summary,format_credit_table" tags=["nbval-check-output"]
cf_credit = credit_summary(cf_results)
display(Markdown(format_credit_table(cf_credit, cf_results["credit_config"])))

# %% demo=true
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

# %% [markdown]
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
