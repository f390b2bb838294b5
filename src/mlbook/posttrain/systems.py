"""The systems view of PPO-RLHF: a memory budget for the four models and a timer for one PPO step.

    rlhf_memory_table(7e9)        -> rows: policy 16 B/param, critic 16, reference 2, reward model 2; total 36 (252 GB)
    format_memory_table(rows)     -> a markdown (or plain-text) table to display
    time_ppo_step(...)            -> median seconds and fractions of one step: generate / forward / reward / update

Memory counts static state only (weights, fp32 master copy, Adam moments, gradients), not
activations or KV caches, and uses decimal units (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.nn import Module

from mlbook.posttrain.toy_lm import sample, token_log_probs

# Bytes per parameter of a model trained with mixed-precision Adam: bf16 weights (2) + fp32 master
# weights (4) + Adam first and second moments in fp32 (4 + 4) + bf16 gradients (2).
TRAINED_PARTS = (("bf16 weights", 2), ("fp32 master", 4), ("Adam m, v", 8), ("bf16 grads", 2))
TRAINED_BYTES = sum(b for _, b in TRAINED_PARTS)  # 16
FROZEN_BYTES = 2  # bf16 weights only: no optimiser state, no gradients
PRETRAIN_BYTES = TRAINED_BYTES  # pretraining holds one trained model


class MemoryRow(NamedTuple):
    component: str
    bytes_per_param: float  # bytes per parameter of *this* model (for the total: per policy parameter)
    n_params: float  # parameters of this model
    total_bytes: float
    note: str = ""


def rlhf_memory_table(
    n_params: float,
    *,
    critic_params: float | None = None,
    ref_params: float | None = None,
    reward_params: float | None = None,
) -> list[MemoryRow]:
    """Static memory of PPO-RLHF: policy and critic trained (16 B/param), reference and reward model frozen (2 B/param).

    ``n_params`` is the policy's size; the other three default to the same size (the usual
    back-of-envelope, giving 36 B/param). Pass their real sizes when they differ (the toy's
    critic has no LM head; its reward is a Python function, ``reward_params=0``). The last row is
    the total; its ``bytes_per_param`` is the total divided by the policy's parameter count.
    """
    if n_params <= 0:
        raise ValueError(f"n_params must be positive, got {n_params}")
    sizes = {
        "critic": n_params if critic_params is None else critic_params,
        "reference": n_params if ref_params is None else ref_params,
        "reward model": n_params if reward_params is None else reward_params,
    }
    trained_note = " + ".join(f"{name} {b}" for name, b in TRAINED_PARTS)
    rows = [
        MemoryRow("policy (trained)", TRAINED_BYTES, n_params, TRAINED_BYTES * n_params, trained_note),
        MemoryRow("critic (trained)", TRAINED_BYTES, sizes["critic"], TRAINED_BYTES * sizes["critic"], trained_note),
        MemoryRow("reference (frozen)", FROZEN_BYTES, sizes["reference"], FROZEN_BYTES * sizes["reference"], "bf16 weights"),
        MemoryRow(
            "reward model (frozen)",
            FROZEN_BYTES,
            sizes["reward model"],
            FROZEN_BYTES * sizes["reward model"],
            "bf16 weights" if sizes["reward model"] else "a Python function: no weights",
        ),
    ]
    total = sum(r.total_bytes for r in rows)
    rows.append(MemoryRow("total", total / n_params, sum(r.n_params for r in rows), total, "before activations and KV cache"))
    return rows


def pretraining_bytes(n_params: float) -> float:
    """Static memory of pretraining the same policy with mixed-precision Adam: 16 bytes per parameter."""
    return PRETRAIN_BYTES * n_params


def rlhf_over_pretraining(n_params: float) -> float:
    """How many times the static memory of pretraining PPO-RLHF needs (2.25 when all four models share a size)."""
    return rlhf_memory_table(n_params)[-1].total_bytes / pretraining_bytes(n_params)


def human_bytes(n: float) -> str:
    """Decimal units: 252e9 -> '252 GB', 1.2e6 -> '1.2 MB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def human_count(n: float) -> str:
    """7e9 -> '7B', 110_000 -> '110k'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def format_memory_table(rows: list[MemoryRow], markdown: bool = True) -> str:
    """The rows as a markdown table (show it with ``IPython.display.Markdown``) or as aligned plain text."""
    header = ("component", "bytes / param", "params", "total", "what the bytes are")
    body = [(r.component, f"{r.bytes_per_param:.4g}", human_count(r.n_params), human_bytes(r.total_bytes), r.note) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 3 + ["---"]) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    fmt = lambda cells: "  ".join(
        c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(cells) for cells in body)])


# ------------------------------------------------------------------------------------ time one step

PHASES = ("generation", "forward", "reward", "update")


def time_ppo_step(
    policy: Module,
    ref: Module,
    critic: Module,
    prompts: torch.Tensor,
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    eos_id: int,
    ppo_update: Callable,
    max_new_tokens: int = 8,
    repeats: int = 3,
    warmup: int = 1,
    beta: float = 0.05,
    lr: float = 1e-3,
    seed: int = 0,
    **update_kwargs,
) -> dict:
    """Wall-clock of one PPO step, split into its four phases (median over ``repeats``):

    - ``generation``: ancestral sampling with :func:`mlbook.posttrain.toy_lm.sample`;
    - ``forward``: no-grad forwards of the policy (``logp_old``), the reference and the critic;
    - ``reward``: ``reward_fn(tokens, response_mask)``;
    - ``update``: ``ppo_update(policy, critic, opt, roll, scores, beta, **update_kwargs)``, the
      function passed in (the notebook passes the student's own).

    Every repeat works on deep copies of the policy and critic with a fresh Adam optimiser and
    samples with its own seeded generator, so the caller's models and random streams are untouched.
    Returns ``{"seconds": {phase: s}, "fractions": {phase: f}, "total_s": s, "response_tokens": n,
    "repeats": repeats}``; the fractions are of the sum of the phase medians.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timings: dict[str, list[float]] = {phase: [] for phase in PHASES}
    n_tokens = 0.0
    for i in range(warmup + repeats):
        pol, crit = copy.deepcopy(policy), copy.deepcopy(critic)
        opt = torch.optim.Adam([*pol.parameters(), *crit.parameters()], lr=lr)
        gen = torch.Generator(device=prompts.device).manual_seed(seed + i)
        t0 = time.perf_counter()
        tokens, full_mask, _ = sample(pol, prompts, max_new_tokens, eos_id, generator=gen)
        t1 = time.perf_counter()
        mask = full_mask[:, 1:]  # (B, T-1) aligned with token_log_probs
        with torch.no_grad():
            logp_old = token_log_probs(pol(tokens), tokens) * mask  # (B, T-1)
            logp_ref = token_log_probs(ref(tokens), tokens) * mask  # (B, T-1)
            values_old = crit(tokens)[:, :-1]  # (B, T-1)
        t2 = time.perf_counter()
        with torch.no_grad():
            scores = reward_fn(tokens, full_mask).float()  # (B,)
        t3 = time.perf_counter()
        roll = dict(tokens=tokens, mask=mask, logp_old=logp_old, logp_ref=logp_ref, values_old=values_old)
        roll["on_policy"] = torch.tensor(True)
        ppo_update(pol, crit, opt, roll, scores, beta, **update_kwargs)
        t4 = time.perf_counter()
        if i >= warmup:
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                timings[phase].append(seconds)
            n_tokens += float(mask.sum())
    seconds = {phase: statistics.median(ts) for phase, ts in timings.items()}
    total = sum(seconds.values())
    return dict(
        seconds=seconds,
        fractions={phase: s / total for phase, s in seconds.items()},
        total_s=total,
        response_tokens=n_tokens / repeats,
        repeats=repeats,
    )


def format_time_split(split: dict) -> str:
    """One line per phase: median milliseconds and share of the step."""
    lines = [f"{'phase':<11} {'ms':>8} {'share':>7}"]
    for phase in PHASES:
        lines.append(f"{phase:<11} {1e3 * split['seconds'][phase]:8.2f} {split['fractions'][phase]:7.1%}")
    lines.append(f"{'total':<11} {1e3 * split['total_s']:8.2f} {1:7.1%}")
    return "\n".join(lines)
