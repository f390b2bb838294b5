"""Masked reductions and input checks shared by every per-token PPO function.

Per-token tensors are (B, T-1) and aligned with ``token_log_probs``; ``response_mask`` is 1.0 on
response tokens and 0.0 on prompt and padding. The ``validate_*`` functions raise a ``ValueError``
that names the argument and what is wrong with it, so a bad call fails at the call, not three
functions later with a broadcasting error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reduce = Callable[
    [torch.Tensor], torch.Tensor
]  # sums a tensor over all ranks (identity in one process)


def no_reduce(x: torch.Tensor) -> torch.Tensor:
    """The ``reduce`` of a single process: nothing to sum over."""
    return x


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask == 1`` (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def global_mean(
    x: torch.Tensor, weights: torch.Tensor | None = None, reduce: Reduce = no_reduce
) -> torch.Tensor:
    """``sum(weights * x) / sum(weights)`` over every rank, accumulated in float64, with one
    ``reduce``.

    ``weights`` (a 0/1 mask, or counts) has the shape of ``x``'s trailing dims; ``x`` may stack K
    quantities in front, each averaged separately: (K, *S), (*S) -> (K,). No weights: a plain mean
    over the last dim, (K, B) -> (K,).
    The one helper behind every statistic that mixes samples (whitening moments, KL, token means):
    in one process ``reduce`` is the identity and this is a masked mean.
    """
    w = x.new_ones(x.shape[-1:]) if weights is None else weights
    lead = x.shape[: x.dim() - w.dim()]
    x64 = x.to(torch.float64).reshape(*lead, -1)  # (*K, N)
    w64 = w.to(device=x.device, dtype=torch.float64).reshape(-1)  # (N,)
    sums = reduce(torch.cat([(x64 * w64).sum(-1).reshape(-1), w64.sum().reshape(1)]))  # (K + 1,)
    return (sums[:-1] / sums[-1].clamp(min=1e-300)).reshape(lead)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, reduce: Reduce = no_reduce, eps: float = 1e-8
) -> torch.Tensor:
    """``(x - mean) / std`` over masked positions; zero outside the mask.

    Population variance of the masked entries, from the first two moments summed in float64 (in
    float32, E[x^2] - mean^2 loses every digit once |mean| / std reaches about 1e4). Under DDP the
    moments are those of the whole global batch: one all-reduce of (sum x, sum x^2, count).
    """
    x64 = x.to(torch.float64)
    mean, mean_sq = global_mean(torch.stack([x64, x64 * x64]), mask, reduce)  # float64 scalars
    var = (mean_sq - mean * mean).clamp(min=0.0)
    return ((x64 - mean) * torch.rsqrt(var + eps)).to(x.dtype) * mask


# ------------------------------------------------------------------------------------ validation


def validate_mask(mask: torch.Tensor, name: str = "response_mask") -> None:
    """A 2-D tensor whose entries are all 0 or 1."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, T-1), got shape {tuple(mask.shape)}")
    if not ((mask == 0) | (mask == 1)).all():
        bad = mask[(mask != 0) & (mask != 1)].flatten()[:3].tolist()
        raise ValueError(f"{name} must contain only 0 and 1, found values such as {bad}")


def validate_per_token(response_mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Every named tensor is a finite floating tensor with the mask's shape; the mask is 0/1."""
    validate_mask(response_mask)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != response_mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but response_mask has shape "
                f"{tuple(response_mask.shape)}; "
                "all per-token tensors must be (B, T-1), aligned with token_log_probs"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
        if not torch.isfinite(t).all():
            raise ValueError(
                f"{name} contains NaN or inf at {int((~torch.isfinite(t)).sum())} position(s)"
            )


def validate_has_response(response_mask: torch.Tensor) -> None:
    """Every row has at least one response token (the score needs a position to land on)."""
    empty = (response_mask.sum(dim=1) == 0).nonzero().flatten()
    if len(empty):
        raise ValueError(
            f"rows {empty.tolist()[:5]} of response_mask have no response token (empty response)"
        )


def validate_scores(scores: torch.Tensor, batch: int) -> None:
    if not isinstance(scores, torch.Tensor) or scores.shape != (batch,):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a (B,) tensor with B={batch}, got {shape}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf")
