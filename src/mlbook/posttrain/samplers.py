"""Who samples the rollouts: ``train_ppo(sampler=...)`` and ``collect_rollouts(sampler=...)`` take
a function ``policy -> model that samples this step`` (none: the policy itself, on-policy)."""

from __future__ import annotations

import copy

import torch.nn as nn


class StaleByOneUpdate:
    """Asynchronous rollouts (exercise 5): each step samples with the weights the policy had at
    the start of the previous step, one update behind (the first step: a copy of the policy)."""

    def __init__(self) -> None:
        self.previous: nn.Module | None = None

    def __call__(self, policy: nn.Module) -> nn.Module:
        sampler, self.previous = self.previous or copy.deepcopy(policy), copy.deepcopy(policy)
        return sampler
