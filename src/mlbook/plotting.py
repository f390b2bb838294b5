"""Figures the chapter draws more than once (training curves), and ``show``, which displays a figure
with its alternative text (read by screen readers and written into the HTML by nbconvert)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt

CURVES = (("reward", "mean reward (good tokens)"), ("kl", "KL to reference (nats/seq)"),
          ("clip_frac", "clip fraction"), ("beta", "KL coefficient beta"))  # fmt: skip


def plot_training_curves(history: Sequence, title: str = "PPO on the toy LM", kl_target: float | None = None):
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
    """Display ``fig`` as a PNG whose alternative text is ``alt``, then close it (so it is not shown twice)."""
    if not isinstance(alt, str) or len(alt.strip()) < 10:
        raise ValueError(f"alt must describe the figure in words (a sentence), got {alt!r}")
    from IPython.display import display  # only notebooks show figures; the library itself does not need IPython

    display(fig, metadata={"image/png": {"alt": alt.strip()}})
    plt.close(fig)
