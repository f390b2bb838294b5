"""Two gloo ranks under DistributedDataParallel reproduce one process on the whole batch.

Two fixtures each start 2 CPU processes with ``mlbook_solutions.ddp.spawn`` (the first start in a
session pays torch's imports, a few seconds; later ones about a second).
"""

import dataclasses

import pytest
import torch
from mlbook_solutions import ddp

pytestmark = pytest.mark.slow

SEED, BATCH, EPOCHS = 0, 8, 3


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> ddp.RunConfig:
    """One float64 rollout batch on disk (rows sorted by response length) and the update's settings."""
    path = tmp_path_factory.mktemp("ddp") / "rollout.pt"
    ddp.save_rollout_batch(str(path), seed=SEED, batch=BATCH)
    return ddp.RunConfig(rollout=str(path), seed=SEED, float64=True, ppo_epochs=EPOCHS)


@pytest.fixture(scope="module")
def updates(cfg):
    """One update on the saved batch by 2 ranks: with global statistics, then with per-rank ones (one spawn)."""
    return ddp.spawn([cfg, dataclasses.replace(cfg, local_whiten=True)], world_size=2)


@pytest.fixture(scope="module")
def runs():
    """3 training steps on 2 ranks: with the global KL, then with per-rank KL (one spawn)."""
    cfg = ddp.RunConfig(steps=3, batch=16, ppo_epochs=2, kl_target=0.2)
    return ddp.spawn([cfg, dataclasses.replace(cfg, local_kl=True)], world_size=2)


def test_two_ranks_update_equals_one_process_on_whole_batch(cfg, updates):
    exact, _ = updates
    shapes = [r["tokens"] for r in exact["per_rank"]]
    assert shapes[0][1] < shapes[1][1], (
        f"the ranks should hold different sequence lengths, got {shapes}"
    )
    assert exact["per_rank"][0]["checksum"] == exact["per_rank"][1]["checksum"]
    reference = ddp.reference_update(cfg)
    with ddp.default_dtype(torch.float64):
        policy, _, critic, _, _ = ddp.build_models(SEED)
    assert (reference - ddp.flat_params(policy, critic)).abs().max() > 1e-4, (
        "the update should move the parameters"
    )
    diff = (exact["params"] - reference).abs().max()
    assert diff <= 1e-6, f"2 ranks differ from 1 process by {diff:.3e}"


def test_per_rank_whitening_does_not_match(cfg, updates):
    _, naive = updates
    diff = (naive["params"] - ddp.reference_update(cfg)).abs().max()
    assert diff > 1e-4, f"per-rank statistics should change the update, max abs diff {diff:.3e}"


def test_ranks_stay_identical_while_training(runs):
    r0, r1 = (r["steps"] for r in runs[0]["per_rank"])
    for step, (a, b) in enumerate(zip(r0, r1, strict=True), 1):
        assert a["checksum"] == b["checksum"], f"parameters differ across ranks after step {step}"
        assert a["beta_next"] == b["beta_next"], f"beta differs across ranks after step {step}"
    assert r0[-1]["beta_next"] != ddp.RunConfig.beta, "the KL controller should have moved beta"


def test_per_rank_kl_lets_beta_drift_apart(runs):
    r0, r1 = (r["steps"] for r in runs[1]["per_rank"])
    assert r0[-1]["checksum"] == r1[-1]["checksum"], "DDP keeps the parameters equal even so"
    assert r0[-1]["beta_next"] != r1[-1]["beta_next"], (
        "per-rank KL should give each rank its own beta"
    )
