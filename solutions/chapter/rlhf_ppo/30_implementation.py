# %% [markdown]
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

# %% stub="mlbook_solutions.ppo_lm:last_response_index"

# %% stub="mlbook_solutions.ppo_lm:shaped_rewards"

# %% [markdown]
# Check: the §1 example, then a ragged batch in which the policy's log-prob exceeds the reference's
# by 1 nat at *every* column, prompt and padding included: only response tokens may pay the fee,
# the score must land on the right column, and your function must leave its inputs untouched.

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% test="test_shaped_rewards_places_score_and_kl" tags=["nbval-check-output"]
# Graded: hidden tests compare `last_response_index` and `shaped_rewards` with a
# position-by-position computation on ragged batches (float32 and float64).

# %% [markdown]
# ### 3.2 Generalised advantage estimation
#
# Walk backwards over the columns. Two details decide correctness: the value *after* the last
# response token is 0 (the critic's prediction on padding must not leak in), and positions outside
# the response carry no advantage.

# %% stub="mlbook_solutions.ppo_lm:gae"

# %% [markdown]
# Check: with $\gamma = \lambda = 1$, advantages plus values must equal the reward-to-go on every
# response token, including a row that ends in padding.

# %% needs_answers=true
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

# %% test="test_gae_matches_brute_force_and_mc_return" tags=["nbval-check-output"]
# Graded: hidden tests compare `gae` with the explicit sum over (gamma*lambda)^l delta
# for several (gamma, lambda), and with the Monte-Carlo return at lambda = 1.

# %% [markdown]
# ### 3.3 The clipped surrogate and the clipped value loss
#
# Compute the ratio in log space (`exp(logp_new - logp_old)`), take the pessimistic minimum, and
# average over response tokens. Return the clip fraction as a Python float.

# %% stub="mlbook_solutions.ppo_lm:ppo_clip_loss"

# %% [markdown]
# Check: at ratio 1 the loss is $-\bar A$ and its gradient is the vanilla policy gradient. Then a
# ragged batch of two rows in which three tokens have moved: one with $A > 0$ pushed past
# $1+\epsilon$ and one with $A < 0$ pushed below $1-\epsilon$ (both clipped: zero gradient), and one
# with $A > 0$ whose ratio fell to $e^{-0.5}$, the wrong way, which is never clipped.

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% test="test_ppo_clip_loss_gradient_and_clipping" tags=["nbval-check-output"]
# Graded: hidden tests check the value against a per-token loop, the gradient at ratio 1,
# the zero gradient in each clipped region, the unclipped wrong-way cases and padding invariance.

# %% stub="mlbook_solutions.ppo_lm:value_loss"

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% test="test_value_loss_clipping" tags=["nbval-check-output"]
# Graded: hidden tests compare value and gradient with a per-token computation for two clip widths.

# %% [markdown]
# ### 3.4 The KL controller
#
# Only `update` is yours; remember the clip of the relative error to ±0.2 and the `n_steps / horizon` scaling.

# %% stub="mlbook_solutions.ppo_lm:AdaptiveKLController" stub_methods="update"

# %% needs_answers=true tags=["nbval-check-output"]
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

# %% test="test_kl_controller_moves_beta_toward_target" tags=["nbval-check-output"]
# Graded: hidden tests check single updates on both sides of the target, the n_steps form
# and a closed loop in which beta must converge toward the target.

# %% [markdown]
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

# %% include="mlbook_solutions.ppo_lm:masked_entropy,collect_rollouts,PPOConfig,EpochStats,ppo_update,PPOStats,sequence_kl,train_ppo"

# %% [markdown]
# ### 3.6 Training the toy model
#
# The task: the reward is the number of `good` tokens in the response; the reference is the
# untrained toy model, whose next-token distribution is nearly uniform. The policy starts as a copy
# of it. An adaptive controller aims the KL at a target of 3 nats per sequence.
#
# The run also keeps a log for the figures after it, through two hooks and without changing a
# single number: the reward function sees every step's rollouts before the update, and
# `extra_loss`, called at the start of every epoch, looks at the policy and adds a zero to the loss.


# %%
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


# %% include="mlbook_solutions.run_toy:CHAPTER_RUN" needs_answers=true demo=true
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

# %% needs_answers=true demo=true
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

# %% [markdown]
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


# %% needs_answers=true demo=true
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

# %% [markdown]
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

# %% needs_answers=true demo=true
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

# %% [markdown]
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

# %% needs_answers=true demo=true
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

# %% [markdown]
# Same run, same tokens: the TRL-style clip fraction is clearly the smaller one on average and far
# smaller on single steps (the cell prints both), so a threshold read off one library's dashboard
# means something else in another's. The two approximate KLs agree to within a few per cent here because the ratios stay
# close to 1, where $k_2$ and $k_3$ share their second-order term $\tfrac12(\log r)^2$; they part as
# the policy moves further within a step.


# %% test="test_train_ppo_increases_reward_with_bounded_kl" tags=["nbval-check-output"]
# Graded: a hidden, seeded 30-step run with beta = 0.5 must raise the mean reward and keep
# the KL to the reference bounded.
