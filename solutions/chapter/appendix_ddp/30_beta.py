# %% [markdown]
# ## Beta drifting apart
#
# Six training steps with sampling on two ranks, 32 prompts in all, and a KL target (0.2) close to
# the KL these steps reach, so that the controller's error sometimes falls inside its ±0.2 clip and
# small differences between the ranks' KLs show up in beta. First with the KL summed over ranks, then with
# each rank feeding its controller its own KL. The table shows beta on each rank after each step,
# and whether the two ranks' parameter checksums agree.

# %%
cfg_kl = ddp.RunConfig(steps=6, batch=32, ppo_epochs=2, kl_target=0.2)
runs = ddp.spawn([cfg_kl, dataclasses.replace(cfg_kl, local_kl=True)], world_size=2)
print(cfg_kl)
print(f"{'':>4} {'global KL':^33} | {'per-rank KL':^33}")
print(
    f"{'step':>4} {'beta r0':>10} {'beta r1':>10} {'params equal':>12} | {'beta r0':>10} {'beta r1':>10} {'params equal':>12}"
)
for i in range(cfg_kl.steps):
    cells = []
    for out in runs:
        a, b = (r["steps"][i] for r in out["per_rank"])
        cells.append(
            f"{a['beta_next']:10.5f} {b['beta_next']:10.5f} {str(a['checksum'] == b['checksum']):>12}"
        )
    print(f"{i + 1:4d} " + " | ".join(cells))
print(
    "\nper-rank KL run: the controller's error kl / target - 1 on each rank, before clipping to [-0.2, 0.2]"
)
for i in range(cfg_kl.steps):
    errors = [r["steps"][i]["kl"] / cfg_kl.kl_target - 1 for r in runs[1]["per_rank"]]
    print(f"{i + 1:4d} " + " ".join(f"{e:+8.3f}" for e in errors))

# %% [markdown]
# With the global KL both ranks hold the same beta at every step. With per-rank KL the values
# part as soon as one rank's KL lands where the controller's error `kl / target - 1` is not
# clipped to ±0.2 (at step 1 the policy still equals the reference, the KL is 0 on both ranks,
# and both corrections are clipped to the same value). From then on the two ranks shape their
# rewards with different penalties, while DDP keeps averaging their gradients into one set of
# parameters: a model trained on a mixture of two objectives, with nothing in the logs of rank 0
# to show it.
