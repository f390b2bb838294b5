"""The main job: train the toy PPO with the reference code, print a per-step table, save curves.

    python -m mlbook_solutions.run_toy [--out build] [--steps 40] [--seed 0]

Reward = number of ``good`` tokens in the response; the reference is the untrained (near-uniform)
toy LM; an adaptive KL controller steers beta toward ``--kl-target``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import matplotlib
import torch

from mlbook.plotting import plot_training_curves
from mlbook.posttrain.toy_lm import END_ID, build_models, decode, good_count_reward
from mlbook_solutions.ppo_lm import PPOConfig, collect_rollouts, train_ppo

# The chapter's training run (PPOConfig's defaults); the notebook's §3.6 uses the same settings.
CHAPTER_RUN = PPOConfig()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="build")
    ap.add_argument("--steps", type=int, default=CHAPTER_RUN.steps)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    matplotlib.use("Agg")  # a script: write PNGs, open no window (importers keep their own backend)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, more only contend

    policy, ref, critic, prompts, gen = build_models(args.seed)
    t0 = time.perf_counter()
    history = train_ppo(
        policy,
        ref,
        critic,
        prompts,
        good_count_reward,
        END_ID,
        dataclasses.replace(CHAPTER_RUN, steps=args.steps),
        generator=gen,
        progress=True,
    )
    seconds = time.perf_counter() - t0
    print(
        f"\n{'step':>4} {'reward':>7} {'KL':>6} {'clip':>6} {'approxKL':>9} {'beta':>7} {'len':>5}"
    )
    for i, h in enumerate(history, 1):
        row = f"{i:4d} {h.reward:7.2f} {h.kl:6.2f} {h.clip_frac:6.3f} {h.approx_kl:9.5f}"
        print(f"{row} {h.beta:7.4f} {h.response_len:5.2f}")
    fig = plot_training_curves(history, kl_target=CHAPTER_RUN.kl_target)
    png = out / "ppo_toy_curves.png"
    fig.savefig(png, dpi=110)
    roll = collect_rollouts(policy, ref, critic, prompts[:4], 8, END_ID, gen)
    print("\nsamples after training:")
    for row in roll["tokens"]:
        print("  ", decode(row))
    print(f"\n{args.steps} PPO steps in {seconds:.1f}s; curves saved to {png}")


if __name__ == "__main__":
    main()
