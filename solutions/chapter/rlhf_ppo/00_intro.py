# %% [markdown]
# # RLHF with PPO
#
# Proximal Policy Optimization is the algorithm behind the first generation of instruction-tuned
# chat models, and it remains the yardstick later methods (DPO, GRPO) are measured against. In this
# chapter you will write its six load-bearing functions yourself and train a tiny language model
# with them on your laptop's CPU:
#
# | section | what you do |
# |---|---|
# | §1 Intuition | follow one four-token response through the reward computation |
# | §2 The math | the objective, the per-token KL reward, the clipped surrogate, GAE, the KL controller |
# | §3 Implementation | fill in `last_response_index`, `shaped_rewards`, `gae`, `ppo_clip_loss`, `value_loss`, `AdaptiveKLController.update`; then train; then train a reward model from preferences and watch PPO over-optimise it (§3.7–3.8) |
# | §4 Systems view | memory of the four models, where the time goes, how runs fail; RLOO and GRPO measured against the critic (§4.5) |
# | §5 In production | what InstructGPT, Llama 2, Constitutional AI and Llama 3 did; the recipes that replaced them; the libraries' defaults and the knobs of 2025–26 long-response training |
# | §6 Interview questions | answers hidden until you click |
# | §7 Exercises ★ to ★★★ | extend the code and measure the claims |
# | References | the papers and code the prose cites by author and year |

# %% [markdown] tags=["student-instructions", "self-paced"]
# **How to work through it.** Work in your own copy of this notebook, never in the checkout's
# `chapters/` folder (commands there regenerate it): `mlbook start` copies it to `~/rlhf-ppo-work/`,
# where nothing but you ever writes (a course hands you your copy). Run the cells from the top. Each
# cell that says `raise NotImplementedError` is yours: replace that line with your implementation.
# Right after each of your functions a *check* cell runs it on a small example and prints ✓ or tells
# you what is off. The graded cells (marked "Graded") run more thorough hidden tests when the
# notebook is graded; they accept any correct implementation (loops or vectorised, float32 or
# float64). The checks are built to catch the common mistakes those tests punish, but the hidden
# tests probe more cases. Before you hand in, the cell under "Check your work" at the end runs every
# check again in one summary; with the full checkout it also prints the command that grades your
# saved notebook the way the course will, hidden tests included. Read-only cells hold the code you
# only need to read; edits to them are undone at grading time.

# %% [markdown] tags=["student-instructions", "course"]
# **How to work through it.** This notebook is your copy: edit it where it is, keep its name
# (`rlhf_ppo.ipynb`) and save often (Ctrl+S). Run the cells from the top. Each cell that says
# `raise NotImplementedError` is yours: replace that line with your implementation. Right after each
# of your functions a *check* cell runs it on a small example and prints ✓ or tells you what is off.
# The graded cells (marked "Graded") run more thorough hidden tests when the course grades the
# notebook; they accept any correct implementation (loops or vectorised, float32 or float64). The
# checks are built to catch the common mistakes those tests punish, but the hidden tests probe more
# cases. Before you hand in, the cell under "Check your work" at the end runs every check again in
# one summary, and the text above it says how to hand in. Read-only cells hold the code you only
# need to read; edits to them are undone at grading time.

# %% [markdown]
# **Conventions used everywhere below.** A batch of sequences is a `(B, T)` tensor of token ids:
# prompt, then response, then padding. The log-prob of every *next* token is a `(B, T-1)` tensor
# whose column `t` scores `tokens[:, t+1]`, and every per-token tensor (rewards, values,
# advantages, the response mask) uses that same `(B, T-1)` alignment.

# %% tags=["nbval-check-output"]
import copy
import dataclasses
import math
import os
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from mlbook.figures import draw_pipeline, plot_clip_objective
from mlbook.plotting import plot_gae_trace, plot_response_shape, plot_training_curves, show
from mlbook.posttrain.toy_lm import (
    BOS_ID,
    END_ID,
    GOOD_ID,
    PAD_ID,
    VOCAB,
    TinyCausalLM,
    TinyCritic,
    build_models,
    decode,
    good_count_reward,
    make_prompts,
)
from mlbook.tables import show_table

torch.set_num_threads(1)  # the toy's tensors are tiny: extra threads only add contention
print(f"torch {torch.__version__}; toy vocabulary of {len(VOCAB)} words: {' '.join(VOCAB)}")


# %% include="mlbook_solutions.ppo_lm:imports"
