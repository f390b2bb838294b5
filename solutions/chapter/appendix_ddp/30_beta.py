# %% [markdown]
# ## Beta drifting apart
#
# Six training steps with sampling on two ranks, 32 prompts in all, and a KL target (0.2) close to
# the KL these steps reach, so that the controller's error sometimes falls inside its ±0.2 clip and
# small differences between the ranks' KLs show up in beta. First with the KL summed over ranks, then with
# each rank feeding its controller its own KL. The cell prints, per run, after how many steps the
# two ranks hold the same beta and whether their parameter checksums agree; the figure shows beta on
# each rank and, for the per-rank run, each controller's error before its clip.

# %%
from mlbook.plotting import show

cfg_kl = ddp.RunConfig(steps=6, batch=32, ppo_epochs=2, kl_target=0.2)
runs = ddp.spawn([cfg_kl, dataclasses.replace(cfg_kl, local_kl=True)], world_size=2)
for name, out in zip(("global KL", "per-rank KL"), runs, strict=True):
    r0, r1 = out["per_rank"]
    same_beta = sum(
        a["beta_next"] == b["beta_next"] for a, b in zip(r0["steps"], r1["steps"], strict=True)
    )
    same_params = all(
        a["checksum"] == b["checksum"] for a, b in zip(r0["steps"], r1["steps"], strict=True)
    )
    print(
        f"{name:>11}: the ranks hold the same beta after {same_beta} of {cfg_kl.steps} steps; "
        f"final beta {r0['steps'][-1]['beta_next']:.5f} / {r1['steps'][-1]['beta_next']:.5f}; "
        f"parameter checksums equal at every step: {same_params}"
    )
show(
    ddp.plot_beta_per_rank(runs, cfg_kl.kl_target),
    alt="Two panels over six PPO steps on two ranks. Left: beta after each step; with the KL "
    "all-reduced the two ranks' lines coincide, with each rank feeding its own KL they part after "
    "the first step. Right: in the per-rank run, each rank's controller error kl / target - 1, with "
    "dotted lines at the clip of plus and minus 0.2; the errors of the two ranks differ and fall "
    "inside the clip at some steps.",
)

# %% [markdown]
# With the global KL both ranks hold the same beta at every step. With per-rank KL the values
# part as soon as one rank's KL lands where the controller's error `kl / target - 1` is not
# clipped to ±0.2 (at step 1 the policy still equals the reference, the KL is 0 on both ranks,
# and both corrections are clipped to the same value). From then on the two ranks shape their
# rewards with different penalties, while DDP keeps averaging their gradients into one set of
# parameters: a model trained on a mixture of two objectives, with nothing in the logs of rank 0
# to show it.
