"""Where r_phi comes from: a Bradley-Terry reward model trained on the toy, then PPO against it.

    python -m mlbook_solutions.reward_model --refresh   # retrain, rerun PPO, rewrite the cache
    python -m mlbook_solutions.reward_model             # summary of the cached runs

Read top to bottom: a hidden *gold* preference (the toy's stand-in for human raters) -> preference
pairs sampled from the initial policy and labelled by it, with Bradley-Terry noise -> the pairwise
loss -> a reward model (the toy transformer's trunk plus a scalar head, initialised from the
reference LM) -> LMHP's normalisation (a gain and a bias so that rewards on samples of the initial
policy have mean 0 and std 1) -> PPO against the learned reward, logging the gold score of the same
samples, which is how over-optimisation shows (Gao, Schulman & Hilton, 2023).

Training the reward models and the PPO runs takes one to two minutes on one core, so the notebook
reads them from the library's cached results (``mlbook.posttrain.cached``), built like the
exercises' cache (a code fingerprint plus a float64 replay; see :mod:`mlbook_solutions.exercises`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import pathlib
import statistics
import time
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mlbook.posttrain.cached import results_path
from mlbook.posttrain.masks import validate_mask
from mlbook.posttrain.toy_lm import (
    END_ID,
    GOOD_ID,
    PAD_ID,
    TinyCausalLM,
    TinyTransformer,
    build_models,
    default_dtype,
    good_count_reward,
    make_prompts,
    sample,
)
from mlbook_solutions.exercises import code_fingerprint
from mlbook_solutions.ppo_lm import last_response_index, train_ppo
from mlbook_solutions.run_toy import CHAPTER_RUN

RESULTS_PATH = results_path("reward_model")  # shipped with the library: the notebook draws it

# ------------------------------------------------------------------------- the gold preference

GOLD_PEAK = 2  # praise helps up to two "good" tokens; every one beyond that costs
GOLD_SLOPE_PAST_PEAK = 0.5


def gold_reward(tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The hidden preference the labels come from: (B, T), (B, T) -> (B,).

    ``g`` = ``good`` tokens in the response; the score rises by 1 per ``good`` up to ``GOLD_PEAK``
    and falls by ``GOLD_SLOPE_PAST_PEAK`` per ``good`` after it: a little praise is what the raters
    like, a response that is nothing but praise is not. Samples of the near-uniform initial policy
    almost never reach the peak, so pairs drawn from it say "more good is better" and nearly nothing
    about what lies past the peak.
    """
    validate_mask(response_mask)
    if tokens.shape != response_mask.shape:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and response_mask {tuple(response_mask.shape)} differ"
        )
    g = ((tokens == GOOD_ID).float() * response_mask).sum(dim=1)  # (B,)
    return torch.clamp(g, max=GOLD_PEAK) - GOLD_SLOPE_PAST_PEAK * torch.clamp(g - GOLD_PEAK, min=0)


monotone_gold = good_count_reward  # the control: §3.6's count, where more praise is always better


# ------------------------------------------------------------------------- preference pairs


class Pairs(NamedTuple):
    """Preference pairs: for each prompt a chosen and a rejected response, both (N, T)."""

    chosen: torch.Tensor  # (N, T) long: prompt, response, PAD
    chosen_mask: torch.Tensor  # (N, T) float: 1 on response tokens
    rejected: torch.Tensor  # (N, T) long
    rejected_mask: torch.Tensor  # (N, T) float
    gold_margin: (
        torch.Tensor
    )  # (N,) gold(chosen) - gold(rejected); negative where the noise flipped


def _padded(samples, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a sample's tokens (PAD) and mask (0) to ``length`` columns."""
    extra = length - samples.tokens.shape[1]
    return F.pad(samples.tokens, (0, extra), value=PAD_ID), F.pad(samples.response_mask, (0, extra))


def preference_pairs(
    model: nn.Module,
    n: int,
    max_new_tokens: int,
    generator: torch.Generator,
    noise: bool = True,
    gold=gold_reward,
) -> Pairs:
    """``n`` pairs: two responses of ``model`` per prompt, labelled by ``gold``.

    With ``noise`` the first response is preferred with probability ``sigmoid(gold_a - gold_b)``
    (the Bradley-Terry model of a rater: ties are coin flips, a margin of 1 is right 73 % of the
    time); without it the higher gold score wins and ties are broken at random.
    """
    prompts = make_prompts(n, generator)  # (N, 2)
    length = prompts.shape[1] + max_new_tokens
    a = _padded(sample(model, prompts, max_new_tokens, END_ID, generator=generator), length)
    b = _padded(sample(model, prompts, max_new_tokens, END_ID, generator=generator), length)
    margin = gold(*a) - gold(*b)  # (N,)
    p_a = torch.sigmoid(margin) if noise else (margin > 0).float() + 0.5 * (margin == 0).float()
    a_wins = torch.rand(n, generator=generator) < p_a  # (N,)
    pick = a_wins.unsqueeze(1)  # (N, 1)
    return Pairs(
        torch.where(pick, a[0], b[0]),
        torch.where(pick, a[1], b[1]),
        torch.where(pick, b[0], a[0]),
        torch.where(pick, b[1], a[1]),
        torch.where(a_wins, margin, -margin),
    )


# ------------------------------------------------------------------------- the model and its loss


class TinyRewardModel(nn.Module):
    """A transformer trunk, a scalar head read at the last response token: (B, T), (B, T) -> (B,).

    Built from a language model (``from_lm``) as InstructGPT and LMHP build theirs: the LM's trunk,
    its unembedding replaced by a linear head with one output.
    """

    def __init__(self, trunk: TinyTransformer) -> None:
        super().__init__()
        self.trunk = trunk
        d = trunk.cfg.d_model
        self.head = nn.Linear(d, 1)
        nn.init.normal_(self.head.weight, std=1 / math.sqrt(d + 1))  # LMHP's reward-head init
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_lm(cls, lm: TinyCausalLM):  # no return annotation: the notebook has no __future__
        """A reward model whose trunk is a trainable copy of ``lm``'s."""
        return cls(copy.deepcopy(lm.trunk).requires_grad_(True))

    def forward(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape != response_mask.shape:
            raise ValueError(
                "expected tokens and response_mask of the same (B, T) shape, got "
                f"{tuple(tokens.shape)} and {tuple(response_mask.shape)}"
            )
        hidden = self.trunk(tokens)  # (B, T, d)
        last = last_response_index(response_mask)  # (B,) column of the last response token
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return self.head(hidden[rows, last]).squeeze(-1)  # (B,)


def validate_pair_rewards(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> None:
    """Both 1-D floating tensors of the same length N (one reward per pair), all finite."""
    for name, r in (("r_chosen", r_chosen), ("r_rejected", r_rejected)):
        if not isinstance(r, torch.Tensor) or not r.is_floating_point() or r.dim() != 1:
            shape = tuple(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__
            raise ValueError(f"{name} must be a 1-D floating tensor (N,), got {shape}")
        if not torch.isfinite(r).all():
            raise ValueError(f"{name} contains NaN or inf")
    if r_chosen.shape != r_rejected.shape:
        raise ValueError(
            f"one reward per pair: r_chosen {tuple(r_chosen.shape)} vs r_rejected "
            f"{tuple(r_rejected.shape)}"
        )


def pairwise_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry negative log-likelihood ``mean_i -log sigmoid(r_chosen_i - r_rejected_i)``.

    Args:
        r_chosen: (N,) reward of the preferred response of each pair.
        r_rejected: (N,) reward of the other response.
    Returns:
        A scalar tensor with gradient to both inputs, finite for any finite margin.
    """
    validate_pair_rewards(r_chosen, r_rejected)
    return -F.logsigmoid(r_chosen - r_rejected).mean()  # logsigmoid: no log(0) at large margins


@dataclasses.dataclass(kw_only=True)
class RMConfig:
    """Everything that sets the reward model and the PPO runs against it."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """One reward model and one PPO run per seed per beta."""
    train_pairs: int = 2048
    """Preference pairs the RM is trained on (sampled from the initial policy)."""
    heldout_pairs: int = 1024
    """Pairs it is evaluated on, from the same distribution."""
    rm_steps: int = 40
    """Full-batch Adam steps on the pairwise loss."""
    rm_lr: float = 2e-3
    """Adam learning rate of the reward model."""
    norm_samples: int = 1024
    """Samples of the initial policy the gain and bias are fitted on."""
    betas: tuple[float, ...] = (0.01, 0.1, 0.3)
    """Fixed KL coefficients of the PPO runs (no controller: the KL is free to grow)."""
    ppo_steps: int = 60
    """PPO steps per run."""
    batch: int = 64
    """Prompts per PPO step."""
    control_beta: float = 0.01
    """Beta of the control runs (monotone gold, one RM per seed): the most pressure."""


RM_RUN = RMConfig()
REPLAY = dict(seed=0, rm_steps=10, ppo_steps=4, train_pairs=256, beta=0.01)


@dataclasses.dataclass
class TrainedRM:
    """A trained reward model, its normalisation, and what was measured while fitting it."""

    model: TinyRewardModel
    gain: float
    bias: float
    loss: list[float]  # pairwise loss per training step
    heldout_loss: float
    heldout_accuracy: float  # agreement with the noisy held-out labels
    gold_accuracy: float  # agreement with the noiseless gold order, pairs with different gold
    gold_mean: float  # gold's mean and std on the samples the gain and bias were fitted on: gold in
    gold_std: float  # the proxy's units is (gold - gold_mean) / gold_std

    def __call__(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """The normalised reward ``gain * r_phi + bias`` (no gradient): a ``reward_fn``."""
        with torch.no_grad():
            return self.gain * self.model(tokens, response_mask) + self.bias


def train_reward_model(seed: int, cfg: RMConfig | None = None, gold=gold_reward) -> TrainedRM:
    """Sample pairs from the initial policy of ``build_models(seed)``, labelled by ``gold``, fit
    the RM, normalise it. ``cfg`` defaults to ``RM_RUN`` (read at call time: the grader keeps
    definitions only)."""
    cfg = RM_RUN if cfg is None else cfg
    policy = build_models(seed).policy  # a copy of the reference: the initial policy
    gen = torch.Generator().manual_seed(10_000 + seed)  # the raters' own random stream
    n_new = CHAPTER_RUN.max_new_tokens
    train = preference_pairs(policy, cfg.train_pairs, n_new, gen, gold=gold)
    heldout = preference_pairs(policy, cfg.heldout_pairs, n_new, gen, gold=gold)
    torch.manual_seed(seed)
    rm = TinyRewardModel.from_lm(policy)
    opt = torch.optim.Adam(rm.parameters(), lr=cfg.rm_lr)
    losses = []
    for _ in range(cfg.rm_steps):
        loss = pairwise_loss(
            rm(train.chosen, train.chosen_mask), rm(train.rejected, train.rejected_mask)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        r_c, r_r = (
            rm(heldout.chosen, heldout.chosen_mask),
            rm(heldout.rejected, heldout.rejected_mask),
        )
        decided = heldout.gold_margin != 0
        gold_acc = float(((r_c > r_r) == (heldout.gold_margin > 0))[decided].float().mean())
        # LMHP: gain and bias so that rewards of the initial policy's samples have mean 0, std 1
        norm = sample(policy, make_prompts(cfg.norm_samples, gen), n_new, END_ID, generator=gen)
        raw = rm(norm.tokens, norm.response_mask)  # (norm_samples,)
        gain = 1.0 / float(raw.std())
        bias = -gain * float(raw.mean())
        gold_norm = gold(norm.tokens, norm.response_mask)  # (norm_samples,) same samples

    return TrainedRM(
        rm.requires_grad_(False),
        gain,
        bias,
        losses,
        float(pairwise_loss(r_c, r_r)),
        float((r_c > r_r).float().mean()),
        gold_acc,
        float(gold_norm.mean()),
        float(gold_norm.std()),
    )


class GoldLogger:
    """A ``reward_fn``: returns the proxy's scores, logs the gold score of the same samples."""

    def __init__(self, proxy, gold=gold_reward) -> None:
        self.proxy, self.gold_fn, self.gold = proxy, gold, []

    def __call__(self, tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        self.gold.append(float(self.gold_fn(tokens, response_mask).mean()))
        return self.proxy(tokens, response_mask)


def overoptimisation_run(
    seed: int, beta: float, rm: TrainedRM, steps: int, batch: int, gold=gold_reward
) -> dict:
    """PPO (the chapter's settings, beta fixed) against the learned reward: per-step proxy, gold
    (``gold`` of the same samples), KL and response length."""
    policy, ref, critic, prompts, gen = build_models(seed, batch)
    logger = GoldLogger(rm, gold)
    cfg = dataclasses.replace(CHAPTER_RUN, steps=steps, beta=beta, kl_target=None)
    history = train_ppo(policy, ref, critic, prompts, logger, END_ID, cfg, generator=gen)
    return dict(
        seed=seed,
        beta=beta,
        proxy=[h.reward for h in history],
        gold=logger.gold,
        kl=[h.kl for h in history],
        length=[h.response_len for h in history],
    )


# ------------------------------------------------------------------------------ cache and report

FINGERPRINT_MODULES = (
    "mlbook.posttrain.toy_lm",
    "mlbook.posttrain.masks",
    "mlbook_solutions.ppo_lm",
    "mlbook_solutions.run_toy",
    "mlbook_solutions.reward_model",
)


def fingerprint() -> str:
    """The exercises' code fingerprint over this sweep's modules and settings."""
    settings = [dataclasses.asdict(CHAPTER_RUN), dataclasses.asdict(RM_RUN), REPLAY]
    return code_fingerprint(FINGERPRINT_MODULES, settings)


def _rm_summary(rm: TrainedRM) -> dict:
    return dict(
        loss=rm.loss,
        heldout_loss=rm.heldout_loss,
        heldout_accuracy=rm.heldout_accuracy,
        gold_accuracy=rm.gold_accuracy,
        gain=rm.gain,
        bias=rm.bias,
        gold_mean=rm.gold_mean,
        gold_std=rm.gold_std,
    )


def replay64() -> dict:
    """Seed 0's pipeline, shortened (fewer pairs, RM and PPO steps), in float64: the portable
    replay."""
    n = REPLAY["train_pairs"]
    cfg = dataclasses.replace(
        RM_RUN, train_pairs=n, heldout_pairs=n, norm_samples=n, rm_steps=REPLAY["rm_steps"]
    )
    with default_dtype(torch.float64):
        rm = train_reward_model(REPLAY["seed"], cfg)
        run = overoptimisation_run(
            REPLAY["seed"], REPLAY["beta"], rm, REPLAY["ppo_steps"], cfg.batch
        )
        rm_c = train_reward_model(REPLAY["seed"], cfg, gold=monotone_gold)
        control = overoptimisation_run(
            REPLAY["seed"], REPLAY["beta"], rm_c, REPLAY["ppo_steps"], cfg.batch, monotone_gold
        )
    return dict(rm=_rm_summary(rm), run=run, control_rm=_rm_summary(rm_c), control=control)


def refresh(path: pathlib.Path = RESULTS_PATH, verbose: bool = True) -> dict:
    """Train every RM, run PPO against each at every beta, replay in float64; write the cache."""
    t0 = time.perf_counter()
    rms, runs = {}, {str(b): [] for b in RM_RUN.betas}
    control_rms, control = {}, []
    for seed in RM_RUN.seeds:
        rm = train_reward_model(seed)
        rms[str(seed)] = _rm_summary(rm)
        for beta in RM_RUN.betas:
            runs[str(beta)].append(
                overoptimisation_run(seed, beta, rm, RM_RUN.ppo_steps, RM_RUN.batch)
            )
        # the control: raters who follow the monotone count, PPO at the smallest beta
        rm_c = train_reward_model(seed, gold=monotone_gold)
        control_rms[str(seed)] = _rm_summary(rm_c)
        control.append(
            overoptimisation_run(
                seed, RM_RUN.control_beta, rm_c, RM_RUN.ppo_steps, RM_RUN.batch, monotone_gold
            )
        )
    results = dict(
        torch=torch.__version__,
        fingerprint=fingerprint(),
        config={
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(RM_RUN).items()
        },
        replay_config=REPLAY,
        seconds=round(time.perf_counter() - t0, 1),
        rms=rms,
        runs=runs,
        control_rms=control_rms,
        control=control,
        replay64=replay64(),
    )
    path.write_text(json.dumps(results, indent=1) + "\n")
    if verbose:
        print(f"wrote {path} ({results['seconds']:.0f}s)")
    return results


def load_results(path: pathlib.Path = RESULTS_PATH) -> dict:
    """The cached sweep (``python -m mlbook_solutions.reward_model --refresh`` regenerates it)."""
    return json.loads(path.read_text())


def gold_z(results: dict, run: dict, control: bool = False) -> list[float]:
    """A run's gold in the proxy's units: minus gold's mean, over its std, on the initial policy's
    samples the run's reward model was normalised on (so both start near 0, in the same unit)."""
    rm = results["control_rms" if control else "rms"][str(run["seed"])]
    return [(g - rm["gold_mean"]) / rm["gold_std"] for g in run["gold"]]


def summarise(results: dict) -> dict:
    """Per beta, over seeds: peak gold and where it happened, final gold and proxy, final KL;
    ``control``: the same for the monotone-gold runs. ``*_z``: gold in the proxy's units."""
    out = {}
    groups = dict(results["runs"], control=results["control"])
    for beta, runs in groups.items():
        control = beta == "control"
        z = [gold_z(results, r, control) for r in runs]
        peak = [max(range(len(r["gold"])), key=r["gold"].__getitem__) for r in runs]
        out[beta] = dict(
            gold_start=statistics.fmean(r["gold"][0] for r in runs),
            gold_peak=statistics.fmean(r["gold"][i] for r, i in zip(runs, peak, strict=True)),
            kl_at_peak=statistics.fmean(r["kl"][i] for r, i in zip(runs, peak, strict=True)),
            gold_final=statistics.fmean(statistics.fmean(r["gold"][-5:]) for r in runs),
            proxy_start=statistics.fmean(r["proxy"][0] for r in runs),
            proxy_final=statistics.fmean(statistics.fmean(r["proxy"][-5:]) for r in runs),
            kl_final=statistics.fmean(statistics.fmean(r["kl"][-5:]) for r in runs),
            length_final=statistics.fmean(statistics.fmean(r["length"][-5:]) for r in runs),
            gold_start_z=statistics.fmean(g[0] for g in z),
            gold_final_z=statistics.fmean(statistics.fmean(g[-5:]) for g in z),
        )
    rms = results["rms"].values()
    out["rm"] = dict(
        heldout_accuracy=statistics.fmean(r["heldout_accuracy"] for r in rms),
        gold_accuracy=statistics.fmean(r["gold_accuracy"] for r in rms),
    )
    return out


def gold_at_equal_kl(
    results: dict, d_values=(0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5), width: float = 0.25
) -> dict:
    """Per beta, the mean gold (proxy units) of every step, all seeds, whose sqrt(KL) lies within
    ``width`` of each ``d``; None where fewer than three steps do. Equal rows mean the betas move
    along one gold-versus-KL curve and differ only in how far along it they stop."""
    out = {}
    for beta, runs in results["runs"].items():
        pts = [
            (math.sqrt(max(k, 0.0)), g)
            for r in runs
            for k, g in zip(r["kl"], gold_z(results, r), strict=True)
        ]
        row = {}
        for d in d_values:
            near = [g for x, g in pts if abs(x - d) < width]
            row[d] = statistics.fmean(near) if len(near) >= 3 else None
        out[beta] = row
    return out


def _band(runs: list[dict], values: list[list[float]], window: int = 5):
    """Per step over seeds: mean sqrt(KL), and the mean, min and max of ``values``, each smoothed
    by a centred running mean over ``window`` steps (step means are noisy)."""
    steps = range(len(runs[0]["kl"]))
    x = [statistics.fmean(math.sqrt(max(r["kl"][t], 0.0)) for r in runs) for t in steps]
    cols = list(zip(*values, strict=True))  # per step: one value per seed
    curves = [
        x,
        [statistics.fmean(c) for c in cols],
        [min(c) for c in cols],
        [max(c) for c in cols],
    ]
    h = window // 2
    return [[statistics.fmean(v[max(0, t - h) : t + h + 1]) for t in steps] for v in curves]


def plot_overoptimisation(results: dict):
    """Gold (solid) and proxy (dashed), both in the proxy's units, against sqrt(KL): per beta the
    mean over seeds with a min-max band (5-step running means); right: the monotone-gold control."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8), sharey=True)
    panels = [(axes[0], results["runs"], False), (axes[1], {"control": results["control"]}, True)]
    for ax, groups, control in panels:
        for i, (beta, runs) in enumerate(groups.items()):
            color = "C1" if control else ("C0", "C3", "C2")[i % 3]
            label = f"beta {results['config']['control_beta']}" if control else f"beta {beta}"
            gold = [gold_z(results, r, control) for r in runs]
            x, mean, lo, hi = _band(runs, gold)
            ax.plot(x, mean, "-", color=color, lw=1.8, label=f"gold, {label}")
            ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)
            x, mean, lo, hi = _band(runs, [r["proxy"] for r in runs])
            ax.plot(x, mean, "--", color=color, lw=1.2, label=f"proxy, {label}")
            ax.fill_between(x, lo, hi, color=color, alpha=0.08, lw=0)
        ax.axhline(0, color="0.6", lw=0.8)
        ax.set_xlabel("sqrt(KL to the reference)  (nats^0.5, per sequence)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("gold peaks at two `good` (§3.7's raters)", fontsize=9)
    axes[1].set_title("control: gold is the monotone count (§3.6)", fontsize=9)
    axes[0].set_ylabel("reward, in std of the initial policy's samples")
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--refresh", action="store_true", help="retrain and rewrite the cache")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = refresh() if args.refresh else load_results()
    for key, stats in summarise(results).items():
        print(key, {k: round(v, 3) for k, v in stats.items()})


if __name__ == "__main__":
    main()
