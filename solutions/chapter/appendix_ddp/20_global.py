# %% [markdown]
# ## What DDP leaves to us
#
# DDP synchronises gradients and nothing else. Everything PPO computes *across samples* outside
# the backward pass is per rank unless we sum it over ranks ourselves:
#
# | statistic | summed over ranks | if it stays per rank |
# |---|---|---|
# | advantage whitening | Σ A, Σ A², number of response tokens | each rank subtracts its own mean and divides by its own std, so the weight of a token depends on which rank it landed on; a rank with few tokens whitens with a noisy std |
# | token mean of the losses | number of response tokens | DDP averages per-rank means, which gives every rank the same say: the tokens of a rank with short responses count for more |
# | KL fed to the controller | Σ per-sequence KL, number of sequences | each rank moves beta with its own KL; the ranks then optimise different rewards and nothing warns |
# | approx-KL for early stopping | Σ (r − 1 − log r), number of tokens | one rank stops its epochs while another runs one more `backward()`, whose gradient all-reduce waits for ever: a hang |
# | logged reward, clip fraction | sums and counts | only the log is wrong |
#
# Whitening needs three numbers from each rank: with $N=\sum_r n_r$ tokens,
# $\mu = \frac{1}{N}\sum A$ and $\sigma^2 = \frac{1}{N}\sum A^2 - \mu^2$, exactly the full-batch
# values. For the loss, rank $r$ computes its token mean $L_r = \frac{1}{n_r}\sum_{t \in r}\ell_t$
# and DDP hands every rank $\frac{1}{W}\sum_r \nabla (s_r L_r)$. Choosing $s_r = n_r W / N$ turns this
# into $\frac{1}{N}\sum_t \nabla\ell_t$, the gradient of the token mean over the whole batch; that is
# the `scale` in `ppo_update`.
#
# Seeds are the last global ingredient. Every rank builds its models from the same seed. DDP
# would broadcast rank 0's policy and critic when it wraps them anyway, but the reference model is
# not wrapped, and the policy must start equal to it. Sampling, on the other hand, uses
# `seed + rank * SAMPLING_SEED_STRIDE`, so that the ranks draw different random numbers:

# %% tags=["nbval-check-output"]
print("sampling seed of rank r: seed + r *", ddp.SAMPLING_SEED_STRIDE)

# %% [markdown]
# ### Whitening per rank, by hand
#
# A rollout batch of 8 sequences sampled from the initial policy, sorted by response length and
# cut into two halves, as two ranks would hold it. The halves have different numbers of response
# tokens and different advantage statistics, so whitening each half with its own mean and std
# gives other advantages than whitening the whole batch:

# %%
workdir = tempfile.mkdtemp()
rollout_path = os.path.join(workdir, "rollout.pt")
batch = ddp.save_rollout_batch(rollout_path, seed=0, batch=8)
m = batch["mask"]  # (8, T-1)
print("rollout batch: tokens", tuple(batch["tokens"].shape), "response mask", tuple(m.shape))
rewards = shaped_rewards(
    batch["scores"], batch["logp_old"], batch["logp_ref"], m, float(batch["beta"])
)
adv, _ = gae(rewards, batch["values_old"], m)  # (8, T-1)
halves = (slice(0, 4), slice(4, 8))
for r, h in enumerate(halves):
    n = m[h].sum()
    mean = (adv[h] * m[h]).sum() / n
    std = (((adv[h] - mean) * m[h]) ** 2).sum().div(n).sqrt()
    print(f"rank {r}: {int(n):2d} response tokens, advantage mean {mean:+.4f}, std {std:.4f}")
whole = masked_whiten(adv, m)  # (8, T-1)
per_rank = torch.cat([masked_whiten(adv[h], m[h]) for h in halves])  # (8, T-1)
print(f"max |whitened per rank - whitened over the batch| = {(whole - per_rank).abs().max():.4f}")

# %% [markdown]
# ### The equivalence check
#
# Now real processes. The same saved batch goes to two gloo ranks, rank 0 the short half and
# rank 1 the long half; each trims the padding columns it does not need, so the ranks run
# different sequence lengths, as they would after sampling. Each runs three PPO epochs of
# `ppo_update` in float64, once with `reduce=make_reduce()` and once without (per-rank
# whitening and token means). One process runs the same update on the whole batch, without DDP.

# %%
cfg_eq = ddp.RunConfig(rollout=rollout_path, float64=True, ppo_epochs=3)
print(cfg_eq)
exact, naive = ddp.spawn([cfg_eq, dataclasses.replace(cfg_eq, local_whiten=True)], world_size=2)
reference = ddp.reference_update(cfg_eq)
print("token tensor per rank:", [r["tokens"] for r in exact["per_rank"]])
with ddp.default_dtype(torch.float64):
    initial = ddp.build_models(0)
start = ddp.flat_params(initial.policy, initial.critic)  # before the update
print(f"parameters moved by the update (max abs): {(reference - start).abs().max():.2e}")
print(
    f"2 ranks, global statistics   vs 1 process: max abs diff {(exact['params'] - reference).abs().max():.2e}"
)
print(
    f"2 ranks, per-rank statistics vs 1 process: max abs diff {(naive['params'] - reference).abs().max():.2e}"
)
BOUND = 1e-6  # what tests/test_ddp.py asserts
print(f"bound asserted by the test: {BOUND:.0e}")
same = [out["per_rank"][0]["checksum"] == out["per_rank"][1]["checksum"] for out in (exact, naive)]
print(
    f"rank 0 and rank 1 hold the same parameters: global statistics {same[0]}, per-rank statistics {same[1]}"
)
assert (exact["params"] - reference).abs().max() <= BOUND

# %% [markdown]
# With the sums over ranks the two-rank update is the one-process update to round-off (the test
# `tests/test_ddp.py` asserts the bound printed above). Without them the update lands elsewhere,
# by an amount that is large next to how far the update moved the parameters at all. Yet in both
# two-rank runs the two ranks end with the same parameters (last line): DDP guarantees that much,
# which is why the per-rank error goes unnoticed.
