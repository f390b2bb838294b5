# %%
import dataclasses
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist  # noqa: F401 (this import and the next ones serve the code shown below)
from mlbook_solutions import ddp
from mlbook_solutions.ddp import (
    SAMPLING_SEED_STRIDE,
    RunConfig,
    build_models,
    checksum,
    flat_params,
)  # noqa: F401
from mlbook_solutions.ppo_lm import (
    AdaptiveKLController,
    collect_rollouts,
    gae,
    ppo_update,
    sequence_kl,
    shaped_rewards,
)  # noqa: F401
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401

from mlbook.posttrain.masks import Reduce, masked_whiten  # noqa: F401
from mlbook.posttrain.systems import StepClock  # noqa: F401
from mlbook.posttrain.toy_lm import END_ID, good_count_reward, make_prompts, sample  # noqa: F401

NOTEBOOK_T0 = time.perf_counter()
torch.set_num_threads(1)

# %% [markdown]
# Joining the group, and the one communication primitive PPO needs besides DDP's: a sum over
# ranks. `make_reduce()` is what `ppo_update(..., reduce=)` and `sequence_kl(..., reduce=)` take;
# with `reduce=None` they behave as in one process.

# %% include="mlbook_solutions.ddp:init,make_reduce"

# %% [markdown]
# One rank's training loop. It is `train_ppo` from the chapter, unrolled so that it can wrap the
# models in DDP, time each phase, and record a checksum of the parameters and the value of beta on
# every rank after every step.

# %% include="mlbook_solutions.ddp:train"
