"""Who samples the rollouts: ``train_ppo(sampler=...)`` and ``collect_rollouts(sampler=...)`` take
a function ``policy -> model that samples this step`` (none: the policy itself, on-policy)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from mlbook.posttrain.toy_lm import sample, token_log_probs


class StaleByOneUpdate:
    """Asynchronous rollouts (exercise 5): each step samples with the weights the policy had at
    the start of the previous step, one update behind (the first step: a copy of the policy)."""

    def __init__(self) -> None:
        self.previous: nn.Module | None = None

    def __call__(self, policy: nn.Module) -> nn.Module:
        sampler, self.previous = self.previous or copy.deepcopy(policy), copy.deepcopy(policy)
        return sampler


def precision_mismatch(
    policy: nn.Module,
    prompts: torch.Tensor,
    max_new_tokens: int,
    engine_dtype: torch.dtype = torch.bfloat16,
    band: tuple[float, float] = (0.5, 5.0),
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """The training-inference mismatch in miniature: sample with a copy of ``policy`` cast to
    ``engine_dtype`` (the "inference engine"), score the same tokens with ``policy`` itself (the
    trainer, its own dtype), and compare the two log-probs of every response token.

    Returns, over response tokens: ``mean_abs`` and ``max_abs`` of log pi_train - log pi_engine;
    ``kl`` = mean of log pi_engine - log pi_train (the k1 estimate of KL(engine || trainer) that
    OpenRLHF logs as ``vllm_kl``); the share of tokens whose ratio pi_train / pi_engine lies outside
    ``band`` (what a TIS clamp would cut, an IcePop mask would drop); and the range of the
    per-sequence geometric-mean ratio (what a sequence-level mask tests). ``tokens`` counts them.
    """
    engine = copy.deepcopy(policy).to(engine_dtype)
    s = sample(engine, prompts, max_new_tokens, generator=generator, use_cache=True)
    with torch.no_grad():
        logp_train = token_log_probs(policy(s.tokens), s.tokens)  # (B, T-1)
    mask = s.response_mask[:, 1:]  # (B, T-1), aligned with the log-probs
    on = mask.bool()
    diff = (logp_train.double() - s.logprobs.double())[on]  # (N,) per response token
    ratio = diff.exp()
    seq_log = ((logp_train.double() - s.logprobs.double()) * mask).sum(1) / mask.sum(1)  # (B,)
    return dict(
        tokens=float(on.sum()),
        mean_abs=float(diff.abs().mean()),
        max_abs=float(diff.abs().max()),
        kl=float(-diff.mean()),
        outside_band=float(((ratio < band[0]) | (ratio > band[1])).double().mean()),
        seq_ratio_min=float(seq_log.exp().min()),
        seq_ratio_max=float(seq_log.exp().max()),
    )
