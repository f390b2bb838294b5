"""Who samples the rollouts: ``train_ppo(sampler=...)`` and ``collect_rollouts(sampler=...)`` take
a function ``policy -> model that samples this step`` (none: the policy itself, on-policy)."""

from __future__ import annotations

import copy

import torch.nn as nn


class StaleBy:
    """Asynchronous rollouts (exercise 5): each step samples with the weights the policy had
    ``updates`` updates ago, as a pipeline that many batches deep does. Until the policy has made
    that many updates, the sampler is the initial copy (step 1 is on-policy)."""

    def __init__(self, updates: int = 1) -> None:
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
            raise ValueError(f"updates must be a positive int (updates of lag), got {updates!r}")
        self.updates = updates
        self.copies: list[nn.Module] = []  # the policy at the start of each of the last steps

    def __call__(self, policy: nn.Module) -> nn.Module:
        self.copies = [*self.copies, copy.deepcopy(policy)][-(self.updates + 1) :]
        return self.copies[0]


class StaleByOneUpdate(StaleBy):
    """Each step samples with the weights the policy had at the start of the previous step, one
    update behind (the first step: a copy of the policy)."""

    def __init__(self) -> None:
        super().__init__(1)
