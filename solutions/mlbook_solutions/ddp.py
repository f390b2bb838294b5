"""PPO-RLHF on several processes with DistributedDataParallel, equal to one process on the whole batch.

    torchrun --standalone --nproc_per_node=2 -m mlbook_solutions.ddp --steps 5 --batch 64   # one machine
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-id=ppo \\
             --rdzv-endpoint=node0:29400 -m mlbook_solutions.ddp --batch 1024              # on both nodes
    spawn(RunConfig(steps=5), world_size=2)                                                 # from a notebook

Every rank holds the whole policy and critic (wrapped in DDP, which averages their gradients) and
a frozen, unwrapped reference model; the reward is a plain function. Rank r samples responses for
its shard of the prompts (``prompts[r::world]``) with its own generator (``seed + r * 100003``),
while all ranks build their models from the same ``seed``. The statistics that mix samples are
summed over ranks through ``make_reduce()``, the ``reduce=`` hook of ``ppo_update``/``sequence_kl``:
advantage whitening (sum, sum of squares, count), the token-mean losses (global token count), the
approx-KL and the per-sequence KL that drives the controller, so beta moves identically everywhere.
``RunConfig.local_whiten`` / ``local_kl`` switch those reductions off, to show what goes wrong.

Backend: NCCL with one GPU per rank (``LOCAL_RANK``) when CUDA is available, otherwise gloo on CPU.
"""

from __future__ import annotations

import gc
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mlbook.posttrain.masks import Reduce, global_mean
from mlbook.posttrain.systems import StepClock
from mlbook.posttrain.toy_lm import (
    END_ID,
    build_models,
    default_dtype,
    good_count_reward,
    make_prompts,
)
from mlbook_solutions.ppo_lm import (
    AdaptiveKLController,
    PPOConfig,
    collect_rollouts,
    ppo_update,
    sequence_kl,
)

ROLL_KEYS = (
    "tokens",
    "mask",
    "logp_old",
    "logp_ref",
    "values_old",
)  # what a saved rollout batch holds, with scores
SAMPLING_SEED_STRIDE = (
    100003  # rank r samples with seed + r * stride (as in TRL and lm-human-preferences)
)


@dataclass(kw_only=True)
class RunConfig(PPOConfig):
    """A PPO run on several processes: every PPOConfig field (defaults: the chapter's run), plus these."""

    steps: int = 5
    """PPO iterations (a short run by default)."""
    batch: int = 64
    """Prompts per step over all ranks; rank r gets batch // world of them."""
    seed: int = 0
    """Models and prompts from this seed on every rank; rank r samples with seed + r * 100003."""
    float64: bool = False
    """Default dtype of every rank (the equivalence test uses float64)."""
    threads: int = 1
    """Torch threads per rank (torchrun sets OMP_NUM_THREADS=1 too)."""
    local_whiten: bool = False
    """Naive: ppo_update without reduce (per-rank whitening and token means)."""
    local_kl: bool = False
    """Naive: each rank's controller sees only its own KL."""
    rollout: str | None = None
    """A saved rollout batch: one update on it instead of training (see update_once)."""


# ------------------------------------------------------------------------------ process group


def free_port() -> int:
    """A TCP port that is free right now (bind port 0 and let the OS choose)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(
    rank: int | None = None, world: int | None = None, port: int | None = None
) -> tuple[int, int, torch.device]:
    """Join the process group; returns ``(rank, world, device)``.

    Under torchrun the rendezvous variables are already set; ``spawn`` passes rank, world and port.
    """
    if rank is not None:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
        )
        os.environ["LOCAL_RANK"] = str(rank)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # one GPU per rank
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def make_reduce(device: torch.device | None = None) -> Reduce:
    """A ``reduce`` for ppo_update/train_ppo/sequence_kl: the SUM of a tensor over all ranks (a new tensor)."""

    def reduce(x: torch.Tensor) -> torch.Tensor:
        y = x.detach().to(device or x.device, copy=True)  # NCCL needs the tensor on this rank's GPU
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return y.to(x.device)

    return reduce


# ---------------------------------------------------------------------------------- the models


def checksum(*modules: nn.Module) -> float:
    """Sum of every parameter in float64: equal on all ranks iff (in practice) the parameters are equal."""
    return float(sum(p.detach().double().sum() for m in modules for p in m.parameters()))


def flat_params(*modules: nn.Module) -> torch.Tensor:
    """All parameters as one float64 vector on the CPU (for comparisons across runs)."""
    return torch.cat([p.detach().double().flatten().cpu() for m in modules for p in m.parameters()])


# ---------------------------------------------------------------------------- the two programs


def train(cfg: RunConfig, rank: int, world: int, device: torch.device) -> dict:
    """``cfg.steps`` PPO steps on this rank's shard; returns rank-local stats, timings, checksums and betas."""
    policy, ref, critic, prompts, _ = build_models(
        cfg.seed, cfg.batch, device=device
    )  # same seed on every rank
    prompts = prompts[rank::world]  # (batch/world, 2) this rank's shard
    gen = torch.Generator(device).manual_seed(
        cfg.seed + rank * SAMPLING_SEED_STRIDE
    )  # different samples per rank
    ddp_kw = dict(device_ids=[device.index]) if device.type == "cuda" else {}
    policy_ddp, critic_ddp = (
        DDP(policy, **ddp_kw),
        DDP(critic, **ddp_kw),
    )  # gradients averaged over ranks
    reduce = make_reduce(device)
    opt = torch.optim.Adam([*policy_ddp.parameters(), *critic_ddp.parameters()], lr=cfg.lr)
    controller = (
        AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.horizon)
        if cfg.kl_target is not None
        else None
    )
    clock = StepClock()  # the phases of the chapter's §4.2: generation, forward, reward, update
    beta, steps = cfg.beta, []
    for _ in range(cfg.steps):
        clock.reset()
        t0 = time.perf_counter()
        # sampling and the no-grad forwards use the plain modules; only the update goes through DDP
        with clock.rollout(policy, ref, critic):
            roll = collect_rollouts(
                policy, ref, critic, prompts, cfg.max_new_tokens, END_ID, gen
            )  # tokens (b, T)
            roll = {
                k: v.to(torch.get_default_dtype()) if v.is_floating_point() else v
                for k, v in roll.items()
            }
        with clock.phase("reward"):
            scores = good_count_reward(roll["tokens"], roll["response_mask"])  # (b,)
        with clock.phase("update"):
            kl = sequence_kl(
                roll, None if cfg.local_kl else reduce
            )  # mean over all ranks' sequences
            update_reduce = (
                None if cfg.local_whiten else reduce
            )  # global whitening, token means and approx-KL
            epochs = ppo_update(
                policy_ddp, critic_ddp, opt, roll, scores, beta, cfg, reduce=update_reduce
            )
        t2 = time.perf_counter()
        reward = float(global_mean(scores.float(), reduce=reduce))  # mean score over all ranks
        steps.append(
            dict(
                reward=reward,
                kl=kl,
                beta=beta,
                clip_frac=epochs[-1].clip_frac,
                approx_kl=epochs[-1].approx_kl,
                value_loss=epochs[-1].value_loss,
                response_len=float(roll["mask"].sum()) / len(scores),
                checksum=checksum(policy, critic),
                step_s=t2 - t0,
                generation_s=clock.seconds["generation"],
                forward_s=clock.seconds["forward"],
                reward_s=clock.seconds["reward"],
                update_s=clock.seconds["update"],
            )
        )
        if controller is not None:
            beta = controller.update(kl)
        steps[-1]["beta_next"] = beta
    return dict(steps=steps, params=flat_params(policy, critic))


def update_once(cfg: RunConfig, rank: int, world: int, device: torch.device) -> dict:
    """One ``ppo_update`` on this rank's contiguous slice of the rollout batch saved at ``cfg.rollout``.

    The file holds ``tokens`` (B, T), ``mask``, ``logp_old``, ``logp_ref``, ``values_old`` (B, T-1),
    ``scores`` (B,) and ``beta``. Each rank drops the padding columns its own rows do not need, so
    the ranks see different sequence lengths, as they would after sampling.
    """
    batch = torch.load(cfg.rollout, weights_only=True)
    rows = torch.tensor_split(torch.arange(len(batch["scores"])), world)[rank]
    T = (
        int(batch["mask"][rows].sum(0).nonzero().max()) + 2
    )  # columns this rank's longest response needs
    roll = {
        k: batch[k][rows, : T if k == "tokens" else T - 1].to(device) for k in ROLL_KEYS
    }  # (b, T) and (b, T-1)
    roll["on_policy"] = torch.tensor(True)
    policy, _, critic, _, _ = build_models(cfg.seed, device=device)
    ddp_kw = dict(device_ids=[device.index]) if device.type == "cuda" else {}
    policy_ddp, critic_ddp = DDP(policy, **ddp_kw), DDP(critic, **ddp_kw)
    opt = torch.optim.Adam([*policy_ddp.parameters(), *critic_ddp.parameters()], lr=cfg.lr)
    reduce = None if cfg.local_whiten else make_reduce(device)
    scores = batch["scores"][rows].to(device)
    ppo_update(policy_ddp, critic_ddp, opt, roll, scores, float(batch["beta"]), cfg, reduce=reduce)
    return dict(
        params=flat_params(policy, critic),
        checksum=checksum(policy, critic),
        tokens=tuple(roll["tokens"].shape),
    )


def save_rollout_batch(
    path: str, seed: int = 0, batch: int = 8, beta: float = 0.1
) -> dict[str, torch.Tensor]:
    """Sample one float64 rollout batch from the initial policy, save it for ``update_once``; returns it.

    Rows are sorted by response length, so with contiguous shards rank 0 holds the short responses.
    The scores are random: any score will do for checking that N ranks compute what one process does.
    """
    with default_dtype(torch.float64):
        policy, ref, critic, _, _ = build_models(seed)
        gen = torch.Generator().manual_seed(seed)
        roll = collect_rollouts(policy, ref, critic, make_prompts(batch, gen), 8, END_ID, gen)
        roll["mask"] = roll["mask"].double()
        order = roll["mask"].sum(1).argsort(stable=True)  # (B,) shortest response first
        out = {k: roll[k][order] for k in ROLL_KEYS}
        out.update(scores=torch.randn(batch, generator=gen), beta=torch.tensor(beta))
    torch.save(out, path)
    return out


def reference_update(cfg: RunConfig) -> torch.Tensor:
    """The other side of the claim: plain ``ppo_update`` (no DDP, no reduce) on the whole saved batch."""
    with default_dtype(torch.float64 if cfg.float64 else torch.float32):
        batch = torch.load(cfg.rollout, weights_only=True)
        policy, _, critic, _, _ = build_models(cfg.seed)
        opt = torch.optim.Adam([*policy.parameters(), *critic.parameters()], lr=cfg.lr)
        roll = {**{k: batch[k] for k in ROLL_KEYS}, "on_policy": torch.tensor(True)}
        ppo_update(policy, critic, opt, roll, batch["scores"], float(batch["beta"]), cfg)
        return flat_params(policy, critic)


# ------------------------------------------------------------------------------------ entry points


def worker(
    rank: int | None,
    world: int | None,
    cfgs: list[RunConfig],
    port: int | None = None,
    result_path: str | None = None,
) -> list[dict]:
    """One rank's whole life: join, run ``train`` (or ``update_once``) for each config, leave.

    Module-level so that torch.multiprocessing can pickle it. Returns (and on rank 0 saves to
    ``result_path``) one result per config: rank 0's result plus ``per_rank``, every rank's
    small results (checksums, betas, times) gathered with ``all_gather_object``.
    """
    rank, world, device = init(rank, world, port)
    results = []
    try:
        for cfg in cfgs:
            torch.set_num_threads(cfg.threads)
            torch.set_default_dtype(torch.float64 if cfg.float64 else torch.float32)
            out = (update_once if cfg.rollout else train)(cfg, rank, world, device)
            per_rank: list[dict | None] = [None] * world
            dist.all_gather_object(per_rank, {k: v for k, v in out.items() if k != "params"})
            results.append(dict(out, per_rank=per_rank, world=world, config=asdict(cfg)))
        if rank == 0 and result_path:
            torch.save(results, result_path)
        # gloo's barrier waits for this rank's work still in flight (DDP's last all-reduces and
        # their callbacks), so no rank tears down while a peer still uses the group
        dist.barrier()
    finally:
        gc.collect()  # free DDP's reducers first: gloo + DDP can otherwise SIGABRT at exit
        dist.destroy_process_group()
    return results


def spawn(cfg: RunConfig | list[RunConfig], world_size: int = 2) -> dict | list[dict]:
    """Run ``worker`` on ``world_size`` local processes (torch.multiprocessing); rank 0's result(s).

    A list of configs runs one after the other in the same processes. The processes are forked
    from a server that has imported torch and DDP's dependencies once ("forkserver"), so only the
    first call in a session pays that import (seconds); where there is no forkserver, plain spawn.
    """
    cfgs = cfg if isinstance(cfg, list) else [cfg]
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if method == "forkserver":
        mp.get_context(method).set_forkserver_preload(["mlbook_solutions.ddp", "torch._dynamo"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rank0.pt")
        args = (world_size, cfgs, free_port(), path)
        mp.start_processes(worker, args=args, nprocs=world_size, join=True, start_method=method)
        results = torch.load(path, weights_only=True)
    return results if isinstance(cfg, list) else results[0]


def print_report(out: dict) -> None:
    """Per-step table from rank 0, then every rank's checksum and beta after the last step."""
    print(f"world={out['world']}")
    head = dict(
        step=4,
        reward=7,
        KL=6,
        beta=7,
        clip=6,
        len=5,
        **{"step s": 7, "gen s": 6, "fwd s": 6, "upd s": 6},
    )
    print(" ".join(f"{name:>{width}}" for name, width in head.items()))
    for i, s in enumerate(out["steps"], 1):
        print(
            f"{i:4d} {s['reward']:7.3f} {s['kl']:6.3f} {s['beta']:7.4f} {s['clip_frac']:6.3f} {s['response_len']:5.2f}"
            f" {s['step_s']:7.3f} {s['generation_s']:6.3f} {s['forward_s']:6.3f} {s['update_s']:6.3f}"
        )
    for r, res in enumerate(out["per_rank"]):
        print(
            f"rank {r}: checksum {res['steps'][-1]['checksum']:.12f}  beta {res['steps'][-1]['beta_next']:.6f}"
        )


def plot_beta_per_rank(runs: list[dict], kl_target: float):
    """Two runs (KL all-reduced, then per-rank KL): beta on every rank after each step (left) and
    each rank's controller error kl / target - 1 with the clip at +-0.2 (right)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.4))
    styles = (("global KL", "-", "o"), ("per-rank KL", "--", "s"))
    for out, (name, line, marker) in zip(runs, styles, strict=True):
        for r, res in enumerate(out["per_rank"]):
            steps = range(1, len(res["steps"]) + 1)
            color = ("C0", "C3")[r] if name == "per-rank KL" else ("C2", "C1")[r]
            beta = [s["beta_next"] for s in res["steps"]]
            axes[0].plot(
                steps, beta, line, marker=marker, ms=4, color=color, label=f"{name}, rank {r}"
            )
            if name == "per-rank KL":
                err = [s["kl"] / kl_target - 1 for s in res["steps"]]
                axes[1].plot(steps, err, line, marker=marker, ms=4, color=color, label=f"rank {r}")
    for y in (-0.2, 0.2):
        axes[1].axhline(y, color="0.5", lw=0.8, ls=":")
    axes[0].set_title("beta after each step", fontsize=10)
    axes[1].set_title("per-rank KL: controller error kl / target - 1 (clip at ±0.2)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main() -> None:
    import tyro  # command line from RunConfig's fields and their docstrings (--steps, --kl-target None, ...)

    cfg = tyro.cli(RunConfig, description=__doc__)
    (out,) = worker(None, None, [cfg])  # torchrun has set RANK, WORLD_SIZE, MASTER_ADDR, ...
    if int(os.environ["RANK"]) == 0 and not cfg.rollout:
        print_report(out)


if __name__ == "__main__":
    main()
