"""A roofline model of one PPO step: what a decode step, a scoring forward and an update cost.

    measure_machine()              -> achievable FLOP/s (a matmul) and bytes/s (a copy) here
    Shape(n_layers, d_model, ...)  -> a decoder-only transformer
    pass_cost(shape, B, new, ctx)  -> FLOPs and bytes of one pass
    predict_step(shape, machine, batch, prompt_len, new_tokens, ...)
                                   -> seconds per phase, both samplers

A pass over ``new`` positions per row that attend to ``ctx`` positions takes

    t = latency + max(FLOPs / flop_rate, matmul bytes / bandwidth) + activation bytes / bandwidth

the roofline (Williams et al., 2009) of the matmuls, plus the elementwise kernels (LayerNorm,
GELU, residual adds), which do no matmul work and only stream activations, plus a fixed latency:
on a GPU kernel launches, on a CPU Python and operator dispatch. FLOPs count matmuls (2 per
multiply-add): 2 N B new for the weights, 4 L d B new ctx for attention (scores and weighted sum;
fused, FlashAttention-style, as PyTorch runs it on this CPU too, so the score matrix never goes to
memory). Matmul bytes are the weights, read once per pass, and the keys and values of the context;
activation bytes are the activations each written and read once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

# d-wide values written per token per layer in a pre-norm block: LN, q k v, attention, projection,
# residual, LN, the 4d MLP hidden before and after GELU, its output, residual = 18 d. Each is
# written once and read once: 36 d values.
ACT_VALUES_PER_LAYER = 36
ADAM_BYTES_PER_PARAM = 28  # fp32 Adam: read weight, grad, m, v (16); write weight, m, v (12)


@dataclass(frozen=True)
class Machine:
    """Ceilings of one device: achievable (not datasheet) rates where measured."""

    name: str
    flop_rate: float  # FLOP/s
    bandwidth: float  # bytes/s

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a pass is compute-bound."""
        return self.flop_rate / self.bandwidth


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer: ``n_layers`` blocks of width ``d_model``, MLP width ``d_ff``."""

    n_layers: int
    d_model: int
    vocab: int
    d_ff: int | None = None  # default 4 * d_model
    bytes_per_value: int = 4  # fp32 (the toy); 2 for bf16
    mlp_matrices: int = 2  # up and down (the toy, GPT-2); 3 for a gated MLP (SwiGLU: Llama)

    @property
    def ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def matmul_params(self) -> int:
        """Weights of the matmuls: q, k, v, output projection (4 d^2) and the MLP per layer, LM
        head."""
        d = self.d_model
        return self.n_layers * (4 * d * d + self.mlp_matrices * d * self.ff) + d * self.vocab

    @property
    def params(self) -> int:
        """Matmul weights plus the token embedding (biases, LayerNorms, positions left out)."""
        return self.matmul_params + self.d_model * self.vocab


class Cost(NamedTuple):
    flops: float  # matmul FLOPs
    bytes: float  # read by the matmuls: weights, keys and values
    act_bytes: float  # streamed by the elementwise kernels

    def __add__(self, other: Cost) -> Cost:  # type: ignore[override]
        return Cost(*(a + b for a, b in zip(self, other, strict=True)))

    def __mul__(self, k: float) -> Cost:  # type: ignore[override]
        return Cost(*(k * a for a in self))

    def seconds(self, machine: Machine) -> float:
        """Matmuls: the slower of computing and reading their operands; then the elementwise
        streams."""
        return (
            max(self.flops / machine.flop_rate, self.bytes / machine.bandwidth)
            + self.act_bytes / machine.bandwidth
        )


def pass_cost(shape: Shape, batch: int, new: int, ctx: int) -> Cost:
    """One forward of ``batch`` rows over ``new`` positions that attend to ``ctx`` positions (ctx >=
    new).

    A teacher-forced pass over T tokens is ``new = ctx = T``; a naive decode step at prefix t is
    ``new = ctx = t``; a KV-cached decode step is ``new = 1, ctx = t``.
    """
    if not 1 <= new <= ctx:
        raise ValueError(f"need 1 <= new <= ctx, got new={new}, ctx={ctx}")
    L, d, s = shape.n_layers, shape.d_model, shape.bytes_per_value
    flops = 2 * shape.matmul_params * batch * new + 4 * L * d * batch * new * ctx
    kv = 2 * L * d * batch * ctx  # keys and values read by attention
    act = ACT_VALUES_PER_LAYER * L * d * batch * new
    return Cost(flops, s * (shape.params + kv), s * act)


def generation_cost(
    shape: Shape, batch: int, prompt_len: int, new_tokens: int, cached: bool
) -> Cost:
    """All decode steps of a static batch: ``new_tokens`` passes, the first over the prompt."""
    P = prompt_len
    if cached:  # prefill the prompt once, then one new position per step over a growing cache
        steps = [pass_cost(shape, batch, P, P)] + [
            pass_cost(shape, batch, 1, t) for t in range(P + 1, P + new_tokens)
        ]
    else:  # every step re-runs the whole prefix
        steps = [pass_cost(shape, batch, t, t) for t in range(P, P + new_tokens)]
    return sum(steps[1:], steps[0])


def update_cost(shape: Shape, batch: int, seq_len: int, epochs: int, n_trained: int = 2) -> Cost:
    """``epochs`` full-batch steps on ``n_trained`` models (policy and critic): forward + backward
    (3x a forward's FLOPs and bytes) and an fp32 Adam step."""
    fwd = pass_cost(shape, batch, seq_len, seq_len)
    adam = Cost(0.0, 0.0, ADAM_BYTES_PER_PARAM * shape.params)
    return (fwd * 3 + adam) * (epochs * n_trained)


@dataclass(frozen=True)
class Latency:
    """Fixed seconds of the toy's phases that no FLOP or byte explains (dispatch, Python)."""

    decode_step: float  # per decode step
    generation: float  # per rollout, independent of length (setup, concatenation, checks)
    forward: float  # the scoring forwards of one step
    reward: float
    update: float  # per update, independent of length
    update_per_position: float = 0.0  # per sequence position (a Python loop over t, e.g. GAE)


def predict_step(
    shape: Shape,
    machine: Machine,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    epochs: int,
    cached: bool,
    latency: Latency | None = None,
    n_scoring: int = 3,
    reward_passes: int = 0,
) -> dict[str, float]:
    """Predicted seconds per phase of one PPO step (the phases of ``systems.StepClock``).

    Generation: ``new_tokens`` decode steps; forward: ``n_scoring`` teacher-forced passes (policy,
    reference, critic) over the whole sequence; reward: ``reward_passes`` such passes (0 for the
    toy's
    Python function, 1 for a reward model of the same shape); update: :func:`update_cost`.
    """
    lat = latency or Latency(0.0, 0.0, 0.0, 0.0, 0.0)
    T = prompt_len + new_tokens
    gen = generation_cost(shape, batch, prompt_len, new_tokens, cached).seconds(machine)
    fwd = (pass_cost(shape, batch, T, T) * n_scoring).seconds(machine)
    upd = update_cost(shape, batch, T, epochs).seconds(machine)
    return dict(
        generation=gen + lat.generation + new_tokens * lat.decode_step,
        forward=fwd + lat.forward,
        reward=lat.reward + (pass_cost(shape, batch, T, T) * reward_passes).seconds(machine),
        update=upd + lat.update + T * lat.update_per_position,
    )


def shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: v / total for k, v in seconds.items()}


def fit_latency(
    shape: Shape, machine: Machine, short: dict, long: dict, epochs: int, cached: bool
) -> Latency:
    """The fixed costs, from two measured steps (``systems.time_ppo_step`` results) of a tiny batch.

    ``short`` and ``long`` differ only in ``new_tokens``. The roofline time of their work is
    subtracted first; what is left is a straight line in the number of decode steps (generation)
    and in the sequence length (update), whose slope and intercept are the latencies. Negative
    estimates (noise) are clipped to zero.
    """
    if short["batch"] != long["batch"] or short["new_tokens"] >= long["new_tokens"]:
        raise ValueError("short and long must share a batch, and long must have more new tokens")

    def rest(split: dict) -> dict[str, float]:  # measured minus roofline work
        work = predict_step(
            shape, machine, split["batch"], split["prompt_len"], split["new_tokens"], epochs, cached
        )
        return {k: split["seconds"][k] - work[k] for k in work}

    a, b = rest(short), rest(long)
    n_a, n_b = short["new_tokens"], long["new_tokens"]
    step = max(0.0, (b["generation"] - a["generation"]) / (n_b - n_a))
    per_pos = max(0.0, (b["update"] - a["update"]) / (n_b - n_a))
    T_a = short["prompt_len"] + n_a
    return Latency(
        decode_step=step,
        generation=max(0.0, a["generation"] - n_a * step),
        forward=max(0.0, (a["forward"] + b["forward"]) / 2),
        reward=max(0.0, (a["reward"] + b["reward"]) / 2),
        update=max(0.0, a["update"] - T_a * per_pos),
        update_per_position=per_pos,
    )


# ------------------------------------------------------------------------------ measure this
# machine


def _best_time(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_flop_rate(m: int = 512, k: int = 512, n: int = 512, repeats: int = 5) -> float:
    """FLOP/s of an fp32 (m, k) @ (k, n) matmul on this machine's current torch threads."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    return 2 * m * k * n / _best_time(lambda: a @ b, repeats)


def measure_bandwidth(n_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of copying an ``n_bytes`` fp32 tensor (read + write), bigger than the caches."""
    x = torch.randn(n_bytes // 4)
    y = torch.empty_like(x)
    return 2 * n_bytes / _best_time(lambda: y.copy_(x), repeats)


def measure_machine(
    name: str = "this CPU", gemm: tuple[int, int, int] = (512, 512, 512)
) -> Machine:
    """Calibrate the two ceilings: a matmul of shape ``gemm`` and a large copy (best of 5 each)."""
    return Machine(name, measure_flop_rate(*gemm), measure_bandwidth())
