# %% [markdown]
# # Appendix: the PPO loop on several processes (DistributedDataParallel)
#
# The chapter trains in a single process. This appendix runs the very same `ppo_update` on N
# processes ("ranks"), each with its own slice of the prompts, and checks that the result is the
# one-process result on the whole batch, down to float64 round-off. That holds only if a few
# statistics are computed over all ranks rather than per rank; we name them, show the damage
# when they are left per rank, and measure what two ranks buy on this machine.
#
# **What one rank holds.** A complete policy and a complete critic, each wrapped in
# `DistributedDataParallel` (DDP), plus the frozen reference model and the reward function,
# unwrapped. During `backward()` DDP sums the gradients of all ranks (in buckets, overlapped with
# the backward pass) and divides by the number of ranks, so every rank applies the same averaged
# gradient and the copies stay identical. The reference and the reward are only evaluated, so
# there is nothing to synchronise for them. Generation is a series of no-grad forwards; it uses
# the bare policy (`ddp_policy.module`), since there is no gradient to reduce.
#
# **Launching.** The worker is the module `mlbook_solutions.ddp`. On one machine with two GPUs, or
# two CPU processes as here:
#
# ```bash
# torchrun --standalone --nproc_per_node=2 -m mlbook_solutions.ddp --steps 5 --batch 64
# ```
#
# On two machines with eight GPUs each, start the same command on both; they find each other
# through a rendezvous endpoint, a port on one of the machines:
#
# ```bash
# torchrun --nnodes=2 --nproc_per_node=8 \
#          --rdzv-backend=c10d --rdzv-endpoint=node0.example.org:29400 --rdzv-id=ppo-appendix \
#          -m mlbook_solutions.ddp --steps 100 --batch 1024
# ```
#
# The torchrun agent of each node connects to a small key-value store (c10d) at the endpoint.
# Once `--nnodes` agents have registered under the same `--rdzv-id`, they settle the membership,
# give every worker a global `RANK` (0 to 15), a `LOCAL_RANK` on its node (0 to 7) and the
# `WORLD_SIZE` (16), and start the workers with those values, `MASTER_ADDR` and `MASTER_PORT` in
# their environment. The worker only reads them: `init()` below calls
# `dist.init_process_group("nccl")` with GPU number `LOCAL_RANK` when CUDA is available, and uses
# `"gloo"` on CPUs. The PPO code never learns how many machines there are. (`--nnodes=1:4` makes
# the job elastic: it starts with one node and admits up to four, restarting the workers on every
# membership change, so a real job would also reload a checkpoint.)
#
# A notebook has no torchrun. `spawn(cfg, world_size)` starts the ranks with
# `torch.multiprocessing`, picks a free port by binding port 0, and returns rank 0's results.
# The function the children run must come from an importable module: a function defined in a
# notebook cell cannot be unpickled by a child process.
