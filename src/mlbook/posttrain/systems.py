"""The systems view of PPO-RLHF: a memory budget for the four models and a timer for one PPO step.

    rlhf_memory_table(7e9)     -> policy 16 B/param, critic 16, reference 2, reward model 2: 36
    format_memory_table(rows)  -> a markdown (or plain-text) table to display
    StepClock()                -> seconds per phase of a PPO step: generation/forward/reward/update
    time_ppo_step(...)         -> median seconds and shares of one step (timed functions passed in)

Memory counts static state only (weights, fp32 master copy, Adam moments, gradients), not
activations or KV caches, and uses decimal units (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import torch
from torch.nn import Module

from mlbook.posttrain.roofline import Latency, Machine, Shape, fit_latency, predict_step, shares
from mlbook.posttrain.toy_lm import END_ID, draw, sample, token_log_probs

# Bytes per parameter of a model trained with mixed-precision Adam: bf16 weights (2) + fp32 master
# weights (4) + Adam first and second moments in fp32 (4 + 4) + bf16 gradients (2).
TRAINED_PARTS = (("bf16 weights", 2), ("fp32 master", 4), ("Adam m, v", 8), ("bf16 grads", 2))
TRAINED_BYTES = sum(b for _, b in TRAINED_PARTS)  # 16
FROZEN_BYTES = 2  # bf16 weights only: no optimiser state, no gradients
PRETRAIN_BYTES = TRAINED_BYTES  # pretraining holds one trained model


class MemoryRow(NamedTuple):
    component: str
    bytes_per_param: (
        float  # bytes per parameter of *this* model (for the total: per policy parameter)
    )
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
    """Static memory of PPO-RLHF: policy and critic trained (16 B/param), reference and reward model
    frozen (2 B/param).

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
        MemoryRow(
            "policy (trained)", TRAINED_BYTES, n_params, TRAINED_BYTES * n_params, trained_note
        ),
        MemoryRow(
            "critic (trained)",
            TRAINED_BYTES,
            sizes["critic"],
            TRAINED_BYTES * sizes["critic"],
            trained_note,
        ),
        MemoryRow(
            "reference (frozen)",
            FROZEN_BYTES,
            sizes["reference"],
            FROZEN_BYTES * sizes["reference"],
            "bf16 weights",
        ),
        MemoryRow(
            "reward model (frozen)",
            FROZEN_BYTES,
            sizes["reward model"],
            FROZEN_BYTES * sizes["reward model"],
            "bf16 weights" if sizes["reward model"] else "a Python function: no weights",
        ),
    ]
    total = sum(r.total_bytes for r in rows)
    rows.append(
        MemoryRow(
            "total",
            total / n_params,
            sum(r.n_params for r in rows),
            total,
            "before activations and KV cache",
        )
    )
    return rows


def pretraining_bytes(n_params: float) -> float:
    """Static memory of pretraining the same policy with mixed-precision Adam: 16 bytes per
    parameter."""
    return PRETRAIN_BYTES * n_params


def rlhf_over_pretraining(n_params: float) -> float:
    """How many times the static memory of pretraining PPO-RLHF needs (2.25 when all four models
    share a size)."""
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
    """The rows as a markdown table (show it with ``IPython.display.Markdown``) or as aligned plain
    text."""
    header = ("component", "bytes / param", "params", "total", "what the bytes are")
    body = [
        (
            r.component,
            f"{r.bytes_per_param:.4g}",
            human_count(r.n_params),
            human_bytes(r.total_bytes),
            r.note,
        )
        for r in rows
    ]
    if markdown:
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] + ["---:"] * 3 + ["---"]) + "|",
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    fmt = lambda cells: "  ".join(
        c.ljust(w) if i in (0, 4) else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    return "\n".join(
        [fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(cells) for cells in body)]
    )


# ------------------------------------------------------------------------------------ time one step

PHASES = ("generation", "forward", "reward", "update")


class StepClock:
    """Wall-clock seconds per phase of PPO steps; one definition for the notebook and the DDP
    program.

    - ``generation``: the rollout call minus its teacher-forced forwards: the sampler's loop (every
      decode step, the draws, the bookkeeping), prefill included;
    - ``forward``: the teacher-forced no-grad passes over the *complete* sampled sequences that the
      update needs: log-probs of the policy (``logp_old``) and of the reference, the critic's
      values;
    - ``reward``: the reward function or model;
    - ``update``: the PPO update (all epochs, optimiser steps included).

    ``with clock.rollout(policy, ref, critic): roll = collect_rollouts(...)`` times the rollout and
    splits it with forward hooks on the models passed (every model the rollout runs, a separate
    sampler included): a call of one of them over the longest sequences any call
    saw (the sampled batch) is a forward; a call over a shorter prefix, or over one new token with a
    KV cache, is a decode step and counts as generation. ``with clock.phase("update"): ...`` times
    the others. Seconds accumulate until :meth:`reset`.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; the phases are {PHASES}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    @contextmanager
    def rollout(self, *models: Module):
        calls: list[tuple[int, float]] = []  # (sequence length of the call, seconds)
        started: dict[int, float] = {}

        def before(module, args, kwargs):
            started[id(module)] = time.perf_counter()

        def after(module, args, kwargs, out):
            tokens = args[0] if args else next(iter(kwargs.values()))
            calls.append((tokens.shape[1], time.perf_counter() - started.pop(id(module))))

        hooks = [m.register_forward_pre_hook(before, with_kwargs=True) for m in models]
        hooks += [m.register_forward_hook(after, with_kwargs=True) for m in models]
        t0 = time.perf_counter()
        try:
            yield
        finally:
            total = time.perf_counter() - t0
            for h in hooks:
                h.remove()
        full = max((n for n, _ in calls), default=0)
        forward = sum(s for n, s in calls if n == full)
        self.seconds["forward"] += forward
        self.seconds["generation"] += total - forward


def time_ppo_step(
    policy: Module,
    ref: Module,
    critic: Module,
    prompts: torch.Tensor,
    *,
    rollout: Callable,
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    update: Callable,
    max_new_tokens: int = 8,
    eos_id: int | None = END_ID,
    use_cache: bool = False,
    repeats: int = 3,
    warmup: int = 1,
    lr: float = 1e-3,
    seed: int = 0,
) -> dict:
    """Wall-clock of one PPO step, split into the phases of :class:`StepClock` (median over
    ``repeats``).

    The functions timed are arguments, so the step is the caller's own code:

    - ``rollout(policy, ref, critic, prompts, max_new_tokens, eos_id, generator=gen)`` returns the
      rollout dict (``tokens`` (B, T), ``mask`` (B, T-1), ...): the chapter's ``collect_rollouts``;
    - ``reward_fn(tokens, full_mask)`` returns (B,) scores;
    - ``update(policy, critic, opt, roll, scores)``: e.g. ``partial(ppo_update, beta=0.3,
    cfg=PPOConfig())``.

    ``eos_id=None`` disables stopping, so every response has exactly ``max_new_tokens`` tokens.
    ``use_cache`` picks the sampler (sets ``cfg.use_cache`` of the policy's copy, which
    :func:`~mlbook.posttrain.toy_lm.sample` reads). Every repeat works on deep copies of the policy
    and critic with a fresh Adam optimiser and samples with its own seeded generator, so the
    caller's models and random streams are untouched. Returns ``{"seconds": {phase: s},
    "fractions": {phase: f}, "total_s": s, "batch": B, "prompt_len": P, "new_tokens": n,
    "response_tokens": mean count, "repeats": repeats}``; fractions are of the sum of the medians.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timings: dict[str, list[float]] = {phase: [] for phase in PHASES}
    n_tokens, n_new = 0.0, 0
    for i in range(warmup + repeats):
        pol, crit = copy.deepcopy(policy), copy.deepcopy(critic)
        if use_cache and not hasattr(pol, "cfg"):
            raise ValueError("use_cache=True needs a policy with a cfg (a TinyCausalLM)")
        if hasattr(pol, "cfg"):
            pol.cfg.use_cache = use_cache
        opt = torch.optim.Adam([*pol.parameters(), *crit.parameters()], lr=lr)
        gen = torch.Generator(device=prompts.device).manual_seed(seed + i)
        clock = StepClock()
        with clock.rollout(pol, ref, crit):
            roll = rollout(pol, ref, crit, prompts, max_new_tokens, eos_id, generator=gen)
        full_mask = torch.cat(
            [torch.zeros_like(roll["mask"][:, :1]), roll["mask"]], dim=1
        )  # (B, T)
        with clock.phase("reward"), torch.no_grad():
            scores = reward_fn(roll["tokens"], full_mask).float()  # (B,)
        with clock.phase("update"):
            update(pol, crit, opt, roll, scores)
        if i >= warmup:
            for phase in PHASES:
                timings[phase].append(clock.seconds[phase])
            n_tokens += float(roll["mask"].sum())
            n_new = roll["tokens"].shape[1] - prompts.shape[1]
    seconds = {phase: statistics.median(ts) for phase, ts in timings.items()}
    total = sum(seconds.values())
    return dict(
        seconds=seconds,
        fractions={phase: s / total for phase, s in seconds.items()},
        total_s=total,
        batch=prompts.shape[0],
        prompt_len=prompts.shape[1],
        new_tokens=n_new,
        response_tokens=n_tokens / repeats,
        repeats=repeats,
    )


def format_time_split(split: dict) -> str:
    """One line per phase: median milliseconds and share of the step."""
    lines = [f"{'phase':<11} {'ms':>8} {'share':>7}"]
    for phase in PHASES:
        lines.append(
            f"{phase:<11} {1e3 * split['seconds'][phase]:8.2f} {split['fractions'][phase]:7.1%}"
        )
    lines.append(f"{'total':<11} {1e3 * split['total_s']:8.2f} {1:7.1%}")
    return "\n".join(lines)


# --------------------------------------------------------------------- the KV cache and its bound


@torch.no_grad()
def one_token_floor(model: Module, prompts: torch.Tensor, new_tokens: int, generator=None) -> None:
    """``new_tokens`` steps that each run ``model`` on one token and sample from its logits.

    The least work any per-token sampler does per step (a cached one also attends over its past),
    so its time bounds the speed-up a KV cache can give. Its samples mean nothing: no step sees
    the tokens before the one it is fed.
    """
    x = prompts[:, -1:]  # (B, 1)
    with torch.inference_mode():  # as :func:`sample` runs its loop
        for _ in range(new_tokens):
            logp = torch.log_softmax(model(x)[:, -1].float(), dim=-1)  # (B, V)
            x = draw(logp.exp(), generator)  # (B, 1)


def time_samplers(
    model: Module, prompts: torch.Tensor, new_tokens: int, repeats: int = 3, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of the naive sampler, the KV-cached one and :func:`one_token_floor`.

    Every response is ``new_tokens`` long (no stopping). The three are interleaved within each
    repeat, so that a change of machine load hits them alike. ``warmup`` untimed rounds of a few
    tokens come first (the first call of each path pays one-off costs). Returns
    ``{"naive": s, "cached": s, "floor": s}``.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if prompts.shape[1] + new_tokens > model.cfg.max_len:
        raise ValueError(
            f"{prompts.shape[1]} + {new_tokens} positions exceed max_len={model.cfg.max_len}"
        )
    runs: dict[str, list[float]] = {"naive": [], "cached": [], "floor": []}
    for i in range(warmup + repeats):
        n = new_tokens if i >= warmup else min(new_tokens, 4)  # warm-up rounds: a few tokens
        for name in runs:
            gen = torch.Generator(device=prompts.device).manual_seed(i)
            t0 = time.perf_counter()
            if name == "floor":
                one_token_floor(model, prompts, n, gen)
            else:
                sample(model, prompts, n, eos_id=None, generator=gen, use_cache=name == "cached")
            if i >= warmup:
                runs[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in runs.items()}


# ------------------------------------------------------------------- sweep and the roofline's view


def sweep_time_split(
    policy: Module, ref: Module, critic: Module, prompts: torch.Tensor, lengths, **step_kwargs
) -> list[dict]:
    """:func:`time_ppo_step` for each response length, naive and KV-cached sampler, fixed lengths.

    ``step_kwargs`` go to :func:`time_ppo_step` (``rollout``, ``reward_fn``, ``update``,
    ``repeats``, ...); ``eos_id`` is None, so each response is exactly as long as asked.
    Returns one row per (length, sampler): ``{"sampler": "naive" | "cached", **split}``.
    """
    rows = []
    for n in lengths:
        for cached in (False, True):
            split = time_ppo_step(
                policy,
                ref,
                critic,
                prompts,
                max_new_tokens=n,
                eos_id=None,
                use_cache=cached,
                **step_kwargs,
            )
            rows.append(dict(sampler="cached" if cached else "naive", **split))
    return rows


PHASE_LATENCIES = (
    "forward",
    "reward",
    "update",
    "update_per_position",
)  # Latency fields not set by the sampler


def calibrate_latency(
    policy: Module,
    ref: Module,
    critic: Module,
    prompt: torch.Tensor,
    shape: Shape,
    machine: Machine,
    epochs: int,
    lengths: tuple[int, int] = (4, 16),
    **step_kwargs,
) -> dict[str, Latency]:
    """Fixed costs of each phase, per sampler, from two timed steps of a one-prompt batch.

    A batch of one does almost no arithmetic, so what a step costs there is latency; the two
    lengths separate the per-token part from the per-step part (:func:`roofline.fit_latency`).
    The phases other than generation do not depend on the sampler; their latencies are the mean of
    the two fits. Returns ``{"naive": Latency, "cached": Latency}``.
    """
    if prompt.shape[0] != 1:
        raise ValueError(f"calibrate with a single prompt (1, P), got {tuple(prompt.shape)}")
    fits = {}
    for cached in (False, True):
        short, long = (
            time_ppo_step(
                policy,
                ref,
                critic,
                prompt,
                max_new_tokens=n,
                eos_id=None,
                use_cache=cached,
                **step_kwargs,
            )
            for n in lengths
        )
        fits["cached" if cached else "naive"] = fit_latency(
            shape, machine, short, long, epochs, cached
        )
    # only generation depends on the sampler: pool the other phases' four measurements
    pooled = {
        f: (getattr(fits["naive"], f) + getattr(fits["cached"], f)) / 2 for f in PHASE_LATENCIES
    }
    return {name: replace(lat, **pooled) for name, lat in fits.items()}


def predicted_split(
    row: dict, shape: Shape, machine: Machine, epochs: int, latency: dict[str, Latency]
) -> dict:
    """The roofline's seconds and shares for a measured row of :func:`sweep_time_split`.

    ``latency_share`` is the part of the predicted step that is fixed latency, not FLOPs or bytes.
    """
    args = (
        shape,
        machine,
        row["batch"],
        row["prompt_len"],
        row["new_tokens"],
        epochs,
        row["sampler"] == "cached",
    )
    seconds = predict_step(*args, latency[row["sampler"]])
    total, work = sum(seconds.values()), sum(predict_step(*args).values())
    return dict(
        seconds=seconds, fractions=shares(seconds), total_s=total, latency_share=1 - work / total
    )


def format_sweep(
    rows: list[dict], predicted: list[dict] | None = None, markdown: bool = False
) -> str:
    """Measured (and predicted) generation share and step time per response length and sampler;
    ``markdown=True``: the same columns as a Markdown table (the notebook renders it)."""
    if markdown:
        cols = ["batch", "new tokens", "sampler", "gen ms", "step ms", "gen share"]
        if predicted is not None:
            cols += ["predicted share", "pred / meas", "predicted step ms"]
        out = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
        for i, r in enumerate(rows):
            cells = [
                str(r["batch"]),
                str(r["new_tokens"]),
                r["sampler"],
                f"{1e3 * r['seconds']['generation']:.1f}",
                f"{1e3 * r['total_s']:.1f}",
                f"{r['fractions']['generation']:.1%}",
            ]
            if predicted is not None:
                p = predicted[i]
                ratio = p["fractions"]["generation"] / r["fractions"]["generation"]
                cells += [
                    f"{p['fractions']['generation']:.1%}",
                    f"{ratio:.2f}",
                    f"{1e3 * p['total_s']:.1f}",
                ]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out)
    head = f"{'batch':>5} {'new tokens':>10} {'sampler':>7} {'gen ms':>8} {'step ms':>8}"
    head += f" {'gen share':>9}"
    if predicted is not None:
        head += f" {'predicted':>9} {'pred/meas':>9} {'pred step ms':>12}"
    lines = [head]
    for i, r in enumerate(rows):
        line = (
            f"{r['batch']:>5} {r['new_tokens']:>10} {r['sampler']:>7} "
            f"{1e3 * r['seconds']['generation']:>8.1f}"
            f" {1e3 * r['total_s']:>8.1f} {r['fractions']['generation']:>9.1%}"
        )
        if predicted is not None:
            p = predicted[i]
            ratio = p["fractions"]["generation"] / r["fractions"]["generation"]
            line += (
                f" {p['fractions']['generation']:>9.1%} {ratio:>9.2f} {1e3 * p['total_s']:>12.1f}"
            )
        lines.append(line)
    return "\n".join(lines)


def times_phrase(ratio: float, faster: str = "faster", slower: str = "slower") -> str:
    """A speed ratio in words that cannot contradict its number: ``2.3x faster`` for a ratio of at
    least 1, ``1.4x slower`` (the inverse) below 1. A measured "speed-up" of 0.8 is 1.25x slower."""
    if not ratio > 0 or not math.isfinite(ratio):
        raise ValueError(f"a speed ratio must be a positive finite number, got {ratio}")
    return f"{ratio:.1f}x {faster}" if ratio >= 1 else f"{1 / ratio:.1f}x {slower}"


def share_verdict(ratios: list[float], tolerance: float = 0.2) -> str:
    """What predicted / measured ratios of a share say, in words, for a sentence "the model ...".

    All within ``1 +- tolerance``: it matches; all above: it over-predicts; all below: it
    under-predicts; otherwise it does neither consistently. Prose built from this cannot say
    "over" when the printed ratios are below 1.
    """
    if not ratios or not all(r > 0 and math.isfinite(r) for r in ratios):
        raise ValueError(f"need positive finite ratios, got {ratios}")
    lo, hi = min(ratios), max(ratios)
    if 1 - tolerance <= lo and hi <= 1 + tolerance:
        return f"matches the measurement to within {tolerance:.0%}"
    if lo > 1:
        return f"over-predicts it ({lo:.2f} to {hi:.2f} times the measured share)"
    if hi < 1:
        return f"under-predicts it ({lo:.2f} to {hi:.2f} times the measured share)"
    return f"is off in both directions ({lo:.2f} to {hi:.2f} times the measured share)"


def emulated_engine(policy: Module, dtype: torch.dtype) -> Module:
    """A float64 copy of ``policy`` that rounds like an inference engine running in ``dtype``.

    Every weight is rounded to ``dtype`` and every leaf layer's output (embeddings, linear layers,
    layer norms, activations; so also the logits) is rounded to ``dtype`` on its way out, as a
    low-precision GEMM writes its result. The arithmetic itself runs in float64, and rounding a
    float64 to ``dtype`` is exact IEEE rounding, so the engine's numbers are the same on every CPU
    (a kernel that accumulates in another order moves a float64 result by ~1e-16, far too little
    to change which ``dtype`` value it rounds to), provided ``policy``'s own weights are: build it
    under ``default_dtype(torch.float64)``, since ``normal_`` initialises float32 weights
    differently on different instruction sets. What it leaves out: the residual sums and the
    attention's internals stay in float64.
    """
    engine = copy.deepcopy(policy).double()
    with torch.no_grad():
        for p in engine.parameters():
            p.copy_(p.float().to(dtype).double())

    def round_output(module: Module, args: tuple, out: object) -> object:
        return out.float().to(dtype).double() if isinstance(out, torch.Tensor) else out

    for module in engine.modules():
        if not list(module.children()):  # a leaf layer
            module.register_forward_hook(round_output)
    return engine


def precision_mismatch(
    policy: Module,
    prompts: torch.Tensor,
    max_new_tokens: int,
    engine_dtype: torch.dtype = torch.bfloat16,
    band: tuple[float, float] = (0.5, 5.0),
    generator: torch.Generator | None = None,
    emulate: bool = False,
) -> dict[str, float]:
    """The training-inference mismatch in miniature: sample with a copy of ``policy`` cast to
    ``engine_dtype`` (the "inference engine"), score the same tokens with ``policy`` itself (the
    trainer, its own dtype), and compare the two log-probs of every response token.

    ``emulate=True``: the engine is :func:`emulated_engine` and the trainer a float64 copy of
    ``policy``, so every returned number is the same on every CPU (the native path runs the CPU's
    own low-precision kernels, whose rounding differs between instruction sets).

    Returns, over response tokens: ``mean_abs`` and ``max_abs`` of log pi_train - log pi_engine;
    ``kl`` = mean of log pi_engine - log pi_train (the k1 estimate of KL(engine || trainer) that
    OpenRLHF logs as ``vllm_kl``); the share of tokens whose ratio pi_train / pi_engine lies outside
    ``band`` (what a TIS clamp would cut, an IcePop mask would drop); and the range of the
    per-sequence geometric-mean ratio (what a sequence-level mask tests). ``tokens`` counts them.
    """
    if emulate:
        policy = copy.deepcopy(policy).double()
        engine = emulated_engine(policy, engine_dtype)
    else:
        engine = copy.deepcopy(policy).to(engine_dtype)
    s = sample(engine, prompts, max_new_tokens, generator=generator, use_cache=True)
    with torch.no_grad():
        logp_train = token_log_probs(policy(s.tokens), s.tokens)  # (B, T-1)
        # sample() records its log-probs in float32; the emulated engine rescores in float64
        logp_engine = token_log_probs(engine(s.tokens), s.tokens) if emulate else s.logprobs
    mask = s.response_mask[:, 1:]  # (B, T-1), aligned with the log-probs
    on = mask.bool()
    gap = (logp_train.double() - logp_engine.double()) * mask  # (B, T-1), 0 off the response
    diff = gap[on]  # (N,) per response token
    ratio = diff.exp()
    seq_log = gap.sum(1) / mask.sum(1)  # (B,)
    return dict(
        tokens=float(on.sum()),
        mean_abs=float(diff.abs().mean()),
        max_abs=float(diff.abs().max()),
        kl=float(-diff.mean()),
        outside_band=float(((ratio < band[0]) | (ratio > band[1])).double().mean()),
        seq_ratio_min=float(seq_log.exp().min()),
        seq_ratio_max=float(seq_log.exp().max()),
    )
