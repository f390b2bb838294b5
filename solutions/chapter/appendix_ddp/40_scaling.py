# %% [markdown]
# ## What two ranks buy on this machine
#
# The same global batch (64 prompts, 8 new tokens, 4 PPO epochs), five steps, on one rank and on
# two ranks, one thread per rank (as torchrun sets it). Step 1 pays one-off costs, so the means
# are over steps 2 to 5. The split is §4.2's (`StepClock`): *generation* is sampling token by
# token, *forward* the three no-grad passes on the finished sequences (`logp_old`, reference,
# critic), *update* the PPO epochs with DDP's gradient all-reduce. As a yardstick, the last line times
# sampling 64 and 32 sequences in this notebook's own process (the fastest of ten tries, which is
# the least disturbed by other jobs).

# %%
cfg_time = ddp.RunConfig(steps=5, batch=64, ppo_epochs=4)
print(cfg_time)
timed = {
    "1 rank, 1 thread": ddp.spawn(cfg_time, world_size=1),
    "2 ranks, 1 thread each": ddp.spawn(cfg_time, world_size=2),
}
print(f"{'':24} {'step s':>7} {'generation':>10} {'forward':>10} {'update':>7}")
step_time = {}
for name, out in timed.items():
    later = out["steps"][1:]
    mean = {
        k: sum(s[k] for s in later) / len(later)
        for k in ("step_s", "generation_s", "forward_s", "update_s")
    }
    step_time[name] = mean["step_s"]
    print(
        f"{name:24} {mean['step_s']:7.3f} {mean['generation_s']:10.3f} {mean['forward_s']:10.3f} {mean['update_s']:7.3f}"
    )
one, two = (timed[k]["steps"][1:] for k in timed)
gen_ratio = sum(s["generation_s"] for s in two) / sum(s["generation_s"] for s in one)
print(
    f"speed-up of 2 ranks over 1 rank: {step_time['1 rank, 1 thread'] / step_time['2 ranks, 1 thread each']:.2f}x"
)
print(f"CPU cores: {os.cpu_count()}, load average over the last minute: {os.getloadavg()[0]:.1f}")
policy0, gen0 = ddp.build_models(0).policy, torch.Generator().manual_seed(0)
alone = {64: [], 32: []}
for _ in range(10):
    for n in alone:
        t0 = time.perf_counter()
        sample(policy0, make_prompts(n, gen0), 8, END_ID, generator=gen0)
        alone[n].append(time.perf_counter() - t0)
print(
    f"sampling in this process (fastest of 10): 64 sequences {min(alone[64]):.3f} s, 32 sequences {min(alone[32]):.3f} s"
)
print(f"generation time, 32 / 64 sequences in one process: {min(alone[32]) / min(alone[64]):.2f}")
print(f"generation time, 2 ranks / 1 rank:                 {gen_ratio:.2f}")

# %% [markdown]
# These are wall-clock times on a small CPU that other jobs may share, so they move from run to
# run; read them next to the core count and the load printed with them. The generation column is
# the diagnostic. Sampling involves no communication at all and each of the two ranks samples
# half of the sequences, so with a free core per rank the two-rank/one-rank ratio of generation
# time should come close to the yardstick's 32/64 ratio (the last two lines). The yardstick is
# usually above one half: part of each forward pass is a fixed cost that does not shrink with the
# number of rows, and on a model this small that part is large. When the two-rank ratio is
# clearly above the yardstick, the ranks are waiting for CPU time, not for each other, and the
# update column is inflated in the same way: a slow-down then says that the machine had no spare
# core, not that DDP is slow. What the communication itself adds lies in the update: one
# gradient all-reduce per PPO epoch for each of the two wrapped models, and at each of them the
# faster rank waits for the slower one (for instance the one that drew the longer responses).
#
# With a real model on GPUs the balance is different: generation takes most of a PPO step, its
# cost grows with the number of sequences, and splitting the prompts over ranks divides it. DDP
# overlaps the gradient all-reduce with the backward pass; across nodes its cost is set by the
# model size and the network, and once the weights and optimizer state no longer fit on one GPU,
# sharded data parallelism (FSDP, ZeRO) takes over from plain DDP.
#
# The command-line route, `torchrun ... -m mlbook_solutions.ddp`, runs the same `worker`;
# `tests/test_slow.py` (marker `stress`) starts it 20 times under torchrun and fails if any run crashes.

# %%
print(f"time since the first code cell: {time.perf_counter() - NOTEBOOK_T0:.1f} s")
