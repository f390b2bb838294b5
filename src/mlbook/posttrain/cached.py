"""Results of the chapter's longer training sweeps, shipped with the library as JSON.

Training a reward model and running PPO against it, or three advantage estimators on three seeds,
takes a minute or two of CPU: too long for a notebook cell. The reference code that produces
each file (``python -m mlbook_solutions.reward_model --refresh``, ``... critic_free --refresh``)
writes it here, with a fingerprint of that code and a short float64 replay that the tests rerun;
the notebook only reads and draws it.
"""

from __future__ import annotations

import json
import pathlib

RESULTS_DIR = pathlib.Path(__file__).with_name("results")
NAMES = ("reward_model", "critic_free")


def results_path(name: str) -> pathlib.Path:
    """Where the cached sweep ``name`` lives (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"no cached sweep {name!r}; the sweeps are {NAMES}")
    return RESULTS_DIR / f"{name}.json"


def load_cached(name: str) -> dict:
    """The cached sweep ``name`` as a dict (what its ``refresh`` wrote)."""
    path = results_path(name)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run `python -m mlbook_solutions.{name} --refresh`"
        )
    return json.loads(path.read_text())
