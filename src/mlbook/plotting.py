"""Figures the chapter draws more than once (training curves), and ``show``, which displays a figure
with its alternative text (read by screen readers and written into the HTML by nbconvert)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt

CURVES = (
    ("reward", "mean reward (good tokens)"),
    ("kl", "KL to reference (nats/seq)"),
    ("clip_frac", "clip fraction"),
    ("beta", "KL coefficient beta"),
)


def plot_training_curves(
    history: Sequence, title: str = "PPO on the toy LM", kl_target: float | None = None
):
    """Four panels from a list of ``PPOStats``-like records: reward, KL, clip fraction, beta."""
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.0))
    steps = range(1, len(history) + 1)
    for ax, (field, label) in zip(axes, CURVES, strict=True):
        ax.plot(steps, [getattr(h, field) for h in history], marker=".", lw=1.2)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    if kl_target is not None:
        axes[1].axhline(kl_target, ls="--", c="gray", lw=1, label="KL target")
        axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def show(fig, alt: str) -> None:
    """Display ``fig`` as a PNG whose alternative text is ``alt``, then close it (so it is not shown
    twice)."""
    if not isinstance(alt, str) or len(alt.strip()) < 10:
        raise ValueError(f"alt must describe the figure in words (a sentence), got {alt!r}")
    from IPython.display import (
        display,
    )  # only notebooks show figures; the library itself does not need IPython

    display(fig, metadata={"image/png": {"alt": alt.strip()}})
    plt.close(fig)


def plot_gae_trace(words: Sequence[str], rewards, values, advantages, returns, title: str = ""):
    """One response token by token: shaped reward R_t (bars), V(s_t), A_t and G_t = A_t + V(s_t)
    (lines)."""
    fig, ax = plt.subplots(figsize=(10, 3.4))
    x = range(len(words))
    ax.bar(x, rewards, color="tab:orange", alpha=0.6, label=r"shaped reward $R_t$")
    ax.plot(x, values, marker="o", c="tab:green", label=r"critic $V(s_t)$")
    ax.plot(
        x, advantages, marker="s", c="tab:blue", label=r"advantage $A_t$ (GAE, before whitening)"
    )
    ax.plot(x, returns, marker="^", ls="--", c="tab:purple", label=r"return $G_t = A_t + V(s_t)$")
    ax.axhline(0, c="gray", lw=0.8)
    ax.set_xticks(list(x), list(words), fontsize=9)
    ax.set_xlabel("response token $a_t$ (the state $s_t$ is everything to its left)")
    # beside the axes, never over the bars and lines (tight_layout makes room for it)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_response_shape(
    history: Sequence, end_share: Sequence[float], title: str = "What the policy learned to do"
):
    """Three panels over PPO steps: good tokens per response (the reward), response length, share
    ending in <|end|>."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.0))
    steps = range(1, len(history) + 1)
    series = (
        ([h.reward for h in history], "good tokens per response (reward)"),
        ([h.response_len for h in history], "response length (tokens)"),
        ([100 * s for s in end_share], "responses ending in <|end|> (%)"),
    )
    for ax, (ys, label) in zip(axes, series, strict=True):
        ax.plot(steps, ys, marker=".", lw=1.2)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
