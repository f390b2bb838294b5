"""The chapter's explanatory figures (no data needed); each function returns a matplotlib Figure.

    plot_clip_objective(eps)   per-token clipped surrogate against the ratio, for A > 0 and A < 0
    draw_pipeline()            one PPO-RLHF iteration as boxes and arrows, frozen vs trained models

Training curves live in :mod:`mlbook.plotting`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch, Patch

CLIPPED_LABEL = r"$\min(rA,\ \mathrm{clip}(r, 1-\epsilon, 1+\epsilon)A)$"
UNCLIPPED_LABEL = r"$rA$ (no clip)"


def clip_objective(ratio: np.ndarray, advantage: float, eps: float) -> np.ndarray:
    """Per-token PPO objective ``min(r A, clip(r, 1 - eps, 1 + eps) A)`` (to maximise)."""
    return np.minimum(ratio * advantage, np.clip(ratio, 1 - eps, 1 + eps) * advantage)


def plot_clip_objective(eps: float = 0.2, advantage: float = 1.0, r_max: float = 2.0, n: int = 401):
    """Two panels, ``A = +advantage`` and ``A = -advantage``: the clipped objective (solid), ``r A``
    (dashed).

    The shaded band is where the clipped objective is flat (zero gradient in the ratio): ``r > 1 +
    eps``
    when ``A > 0`` and ``r < 1 - eps`` when ``A < 0``. Dotted verticals mark ``1 - eps`` and ``1 +
    eps``.
    The solid line carries the label :data:`CLIPPED_LABEL` so tests can read its data back.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    ratio = np.linspace(0.0, r_max, n)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for ax, sign in zip(axes, (1.0, -1.0), strict=True):
        a = sign * abs(advantage)
        flat = (1 + eps, r_max) if a > 0 else (0.0, 1 - eps)
        ax.axvspan(*flat, color="tab:red", alpha=0.12, lw=0, label="flat: zero gradient")
        ax.plot(ratio, ratio * a, ls="--", c="gray", lw=1.2, label=UNCLIPPED_LABEL)
        ax.plot(ratio, clip_objective(ratio, a, eps), c="tab:blue", lw=2.2, label=CLIPPED_LABEL)
        for edge in (1 - eps, 1 + eps):
            ax.axvline(edge, ls=":", c="k", lw=1)
        ax.axvline(1.0, c="k", lw=0.6, alpha=0.4)
        ax.axhline(0.0, c="k", lw=0.6, alpha=0.4)
        ax.set_xticks(
            [0, 1 - eps, 1, 1 + eps, r_max],
            ["0", r"$1-\epsilon$", "1", r"$1+\epsilon$", f"{r_max:g}"],
        )
        ax.set_xlabel(r"ratio $r = \pi_\theta(a|s) / \pi_{\mathrm{old}}(a|s)$")
        word = "good token: pushed up until" if a > 0 else "bad token: pushed down until"
        edge = r"$r = 1+\epsilon$" if a > 0 else r"$r = 1-\epsilon$"
        ax.set_title(f"A = {a:+g} ({word} {edge})", fontsize=10)
        ax.grid(alpha=0.25)
    axes[0].set_ylabel("per-token objective (maximised)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        rf"PPO clipped surrogate, $\epsilon = {eps:g}$: the clip only stops moves that help",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------- pipeline

TRAINED, FROZEN, COMPUTE = "#f6c38b", "#b9cfe6", "#ffffff"
BOX_W, BOX_H = 2.5, 1.05

# name -> (x centre, y centre, text, colour)
PIPELINE_BOXES = {
    "prompts": (1.3, 3.3, "prompts $x$\n(a batch from the dataset)", COMPUTE),
    "policy": (4.5, 3.3, r"policy $\pi_\theta$ (trained)" + "\nsamples responses $y$", TRAINED),
    "reward": (
        7.9,
        5.1,
        r"reward model $r_\phi$ (frozen)" + "\nscores $(x, y)$: lands on\nthe final token",
        FROZEN,
    ),
    "reference": (
        7.9,
        3.3,
        r"reference $\pi_{\mathrm{ref}}$ (frozen)" + "\nper-token log-probs\n" + r"$\to$ KL fee",
        FROZEN,
    ),
    "critic": (7.9, 1.5, r"critic $V_\psi$ (trained)" + "\nvalue $V(s_t)$ per token", TRAINED),
    "shaped": (
        11.3,
        4.2,
        "shaped reward per token\n"
        + r"$R_t = -\beta(\log\pi_{\mathrm{old}} - \log\pi_{\mathrm{ref}})$"
        + "\n"
        + r"$+\ [t{=}T]\ r_\phi(x, y)$",
        COMPUTE,
    ),
    "gae": (11.3, 2.1, "GAE\n" + r"advantages $A_t$, returns $G_t$", COMPUTE),
    "update": (
        11.3,
        -0.1,
        "clipped PPO update\n" + r"$-L^{\mathrm{CLIP}} + c_v L^V$, 1-4 epochs",
        COMPUTE,
    ),
}
PIPELINE_ARROWS = (
    ("prompts", "policy", ""),
    ("policy", "reward", "tokens"),
    ("policy", "reference", "tokens"),
    ("policy", "critic", "tokens"),
    ("reward", "shaped", "score"),
    ("reference", "shaped", r"$\log\pi_{\mathrm{ref}}$"),
    ("shaped", "gae", ""),
    ("critic", "gae", r"$V(s_t)$"),
    ("gae", "update", ""),
)


def _edge_point(name: str, toward: tuple[float, float]) -> tuple[float, float]:
    """Where the straight line from box ``name``'s centre toward ``toward`` leaves the box."""
    x, y, *_ = PIPELINE_BOXES[name]
    dx, dy = toward[0] - x, toward[1] - y
    scale = min(BOX_W / 2 / abs(dx) if dx else np.inf, BOX_H / 2 / abs(dy) if dy else np.inf)
    return x + dx * scale, y + dy * scale


def draw_pipeline():
    """One PPO-RLHF iteration: prompts -> samples -> RM score, reference log-probs, critic values ->
    GAE -> update.

    Orange boxes are trained models, blue boxes frozen ones, white boxes computations. The loop
    arrow from the update back to the policy and the critic carries the new weights.
    """
    fig, ax = plt.subplots(figsize=(12.5, 5.4))
    for name, (x, y, text, colour) in PIPELINE_BOXES.items():
        box = FancyBboxPatch(
            (x - BOX_W / 2, y - BOX_H / 2),
            BOX_W,
            BOX_H,
            boxstyle="round,pad=0.05,rounding_size=0.15",
            fc=colour,
            ec="k",
            lw=1.1,
        )
        box.set_gid(name)
        ax.add_patch(box)
        ax.text(x, y, text, ha="center", va="center", fontsize=8.6)
    arrow = dict(arrowstyle="-|>", color="k", lw=1.2, shrinkA=2, shrinkB=2)
    for start, end, label in PIPELINE_ARROWS:
        a = _edge_point(start, PIPELINE_BOXES[end][:2])
        b = _edge_point(end, PIPELINE_BOXES[start][:2])
        ax.annotate("", xy=b, xytext=a, arrowprops=arrow)
        if label:
            ax.text(
                (a[0] + b[0]) / 2,
                (a[1] + b[1]) / 2 + 0.12,
                label,
                fontsize=8,
                ha="center",
                va="bottom",
                color="dimgray",
            )
    # The loop: new weights from the update back into the policy (and the critic).
    ux, uy, *_ = PIPELINE_BOXES["update"]
    px, py, *_ = PIPELINE_BOXES["policy"]
    cx, cy, *_ = PIPELINE_BOXES["critic"]
    loop = dict(arrowstyle="-|>", color="tab:red", lw=1.8, shrinkA=2, shrinkB=2)
    ax.annotate(
        "",
        xy=(px, py - BOX_H / 2),
        xytext=(ux - BOX_W / 2, uy),
        arrowprops={**loop, "connectionstyle": "angle,angleA=180,angleB=90"},
    )
    ax.annotate(
        "", xy=(cx, cy - BOX_H / 2), xytext=(cx, uy), arrowprops={**loop, "arrowstyle": "-|>"}
    )
    ax.text(
        6.1,
        uy - 0.15,
        r"new weights $\theta$ (and $\psi$): next iteration samples with them",
        fontsize=8.6,
        color="tab:red",
        ha="center",
        va="top",
    )
    handles = [
        Patch(fc=TRAINED, ec="k", label="trained (weights + Adam state)"),
        Patch(fc=FROZEN, ec="k", label="frozen (forward only)"),
        Patch(fc=COMPUTE, ec="k", label="computation, no weights"),
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=8.5, frameon=False)
    ax.set_xlim(-0.2, 12.8)
    ax.set_ylim(-0.9, 5.9)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("One PPO-RLHF iteration: rollout, score, advantages, clipped update", fontsize=11)
    fig.tight_layout()
    return fig
