"""Correct answers written in the styles real students use, for the differential fairness suite.

Each style is the solved notebook with some answer cells rewritten (``cells``: grade id -> source)
and cells added below an existing one (``added``: [(grade id above, source)]), as a student would
add them in Jupyter. Every style is correct except where ``lost`` names the graded tests it must
lose (the same under the sandboxed engine and under plain ``nbgrader autograde``).
``tests/test_fairness.py`` grades them all both ways and compares.
"""

from ppo_checks import CHECKS

_ID = {c.fn.__name__: gid for gid, c in CHECKS.items()}
KL = _ID["check_kl_controller"]

_GAE_WITH_HELPER = """def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    validate_per_token(response_mask, rewards=rewards, values=values)
    advantages = torch.zeros_like(rewards)
    carry = rewards.new_zeros(rewards.shape[0])
    value_after = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = response_mask[:, t].to(rewards.dtype)
        carry = m * ({helper}(rewards[:, t], values[:, t], value_after, float(gamma)) + gamma * lam * carry)
        advantages[:, t] = carry
        value_after = m * values[:, t]
    return advantages, (advantages + values) * response_mask
"""


def _gae(helper: str) -> str:
    return _GAE_WITH_HELPER.format(helper=helper)


_DELTA = "def _delta(r, v, v_next, gamma):\n    return r + gamma * v_next - v\n"

_CONTROLLER_SLOTS = '''class AdaptiveKLController:
    """KL controller without a __dict__."""

    __slots__ = ("beta", "target", "horizon")

    def __init__(self, beta, target, horizon=10):
        if beta <= 0 or target <= 0 or horizon <= 0:
            raise ValueError("beta, target and horizon must be positive")
        self.target, self.horizon, self.beta = target, horizon, beta

    def update(self, kl, n_steps=1):
        error = min(0.2, max(-0.2, float(kl) / self.target - 1.0))
        self.beta = self.beta * (1.0 + error * n_steps / self.horizon)
        return self.beta
'''

_CONTROLLER_DATACLASS = """from dataclasses import dataclass


@dataclass
class AdaptiveKLController:
    beta: float
    target: float
    horizon: float = 10

    def __post_init__(self):
        if self.beta <= 0 or self.target <= 0 or self.horizon <= 0:
            raise ValueError("beta, target and horizon must be positive")

    def update(self, kl: float, n_steps: int = 1) -> float:
        error = min(0.2, max(-0.2, float(kl) / self.target - 1.0))
        self.beta *= 1.0 + error * n_steps / self.horizon
        return self.beta
"""

_CONTROLLER_PROPERTY = """class AdaptiveKLController:
    def __init__(self, beta, target, horizon=10):
        if beta <= 0 or target <= 0 or horizon <= 0:
            raise ValueError("beta, target and horizon must be positive")
        self.target, self.horizon, self._beta = target, horizon, beta

    @property
    def beta(self):
        return self._beta

    def update(self, kl, n_steps=1):
        error = min(0.2, max(-0.2, float(kl) / self.target - 1.0))
        self._beta = self._beta * (1.0 + error * n_steps / self.horizon)
        return self._beta
"""

_CONTROLLER_UNFINISHED = """class AdaptiveKLController:
    def __init__(self, beta, target, horizon=10):
        self.target, self.horizon, self.beta = target, horizon, beta

    def update(self, kl, n_steps=1):
        # YOUR CODE HERE
        raise NotImplementedError()
"""

_VALUE_INPLACE = """def value_loss(values, old_values, returns, response_mask, clip_eps: float = 0.2):
    validate_per_token(response_mask, values=values, old_values=old_values, returns=returns)
    low = old_values - clip_eps
    high = old_values + clip_eps
    low.clamp_(max=float("inf"))  # in place, on a local tensor
    v_clipped = torch.max(torch.min(values, high), low)
    worst = (values - returns) ** 2
    worst = torch.maximum(worst, (v_clipped - returns) ** 2)
    return 0.5 * (worst * response_mask).sum() / response_mask.sum()
"""

_VALUE_PRINT_WARN = """import warnings


def value_loss(values, old_values, returns, response_mask, clip_eps: float = 0.2):
    validate_per_token(response_mask, values=values, old_values=old_values, returns=returns)
    if clip_eps > 1:
        warnings.warn("a clip range above 1 hardly clips")
    print("value_loss called on", tuple(values.shape))
    v_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    worst = torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    return 0.5 * masked_mean(worst, response_mask)


warnings.warn("my value_loss prints its input shape (debugging)")
"""

_VALUE_DISPLAY = """from IPython.display import Markdown, display


def value_loss(values, old_values, returns, response_mask, clip_eps: float = 0.2):
    validate_per_token(response_mask, values=values, old_values=old_values, returns=returns)
    v_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    worst = torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    return 0.5 * masked_mean(worst, response_mask)


display(Markdown("**value_loss** is defined"))
"""

_LAST_NUMPY = """import numpy as np


def last_response_index(response_mask):
    validate_mask(response_mask)
    validate_has_response(response_mask)
    m = response_mask.detach().cpu().numpy()
    last = m.shape[1] - 1 - np.argmax(m[:, ::-1] > 0, axis=1)
    return torch.from_numpy(np.ascontiguousarray(last)).long()
"""

_GAE_FLOAT64 = """def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    validate_per_token(response_mask, rewards=rewards, values=values)
    r, v, m = (x.double() for x in (rewards, values, response_mask))
    adv = torch.zeros_like(r)
    carry = torch.zeros(r.shape[0], dtype=torch.float64)
    v_next = torch.zeros(r.shape[0], dtype=torch.float64)
    for t in range(r.shape[1] - 1, -1, -1):
        carry = m[:, t] * (r[:, t] + gamma * v_next - v[:, t] + gamma * lam * carry)
        adv[:, t] = carry
        v_next = m[:, t] * v[:, t]
    adv = adv.to(rewards.dtype)
    return adv, (adv + values) * response_mask
"""

_GAE_RECURSIVE = """def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    validate_per_token(response_mask, rewards=rewards, values=values)
    T = rewards.shape[1]
    m = response_mask.to(rewards.dtype)
    zero = rewards.new_zeros(rewards.shape[0])

    def advantages_from(t):  # [A_t, ..., A_{T-1}]
        if t == T:
            return []
        later = advantages_from(t + 1)
        v_next = m[:, t + 1] * values[:, t + 1] if t + 1 < T else zero
        a_next = later[0] if later else zero
        return [m[:, t] * (rewards[:, t] + gamma * v_next - values[:, t] + gamma * lam * a_next)] + later

    advantages = torch.stack(advantages_from(0), dim=1)
    return advantages, (advantages + values) * response_mask
"""

_GAE_GENERATOR = """def _backwards(n):
    t = n - 1
    while t >= 0:
        yield t
        t -= 1


def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    validate_per_token(response_mask, rewards=rewards, values=values)
    cols = {}
    carry = rewards.new_zeros(rewards.shape[0])
    v_next = rewards.new_zeros(rewards.shape[0])
    for t in _backwards(rewards.shape[1]):
        m = response_mask[:, t].to(rewards.dtype)
        carry = m * (rewards[:, t] + gamma * v_next - values[:, t] + gamma * lam * carry)
        cols[t] = carry
        v_next = m * values[:, t]
    advantages = torch.stack([cols[t] for t in sorted(cols)], dim=1)
    return advantages, (advantages + values) * response_mask
"""

_GAE_CLOSURE = """def _make_gae():
    def step(carry, delta, m, gamma, lam):
        return m * (delta + gamma * lam * carry)

    def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
        validate_per_token(response_mask, rewards=rewards, values=values)
        advantages = torch.zeros_like(rewards)
        carry = rewards.new_zeros(rewards.shape[0])
        v_next = rewards.new_zeros(rewards.shape[0])
        for t in range(rewards.shape[1] - 1, -1, -1):
            m = response_mask[:, t].to(rewards.dtype)
            carry = step(carry, rewards[:, t] + gamma * v_next - values[:, t], m, gamma, lam)
            advantages[:, t] = carry
            v_next = m * values[:, t]
        return advantages, (advantages + values) * response_mask

    return gae


gae = _make_gae()
"""

_CLIP_FUNCTOOLS = """import functools


def ppo_clip_loss(logp_new: torch.Tensor, logp_old, advantages, response_mask, clip_eps=0.2):
    validate_per_token(response_mask, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    ratio = torch.exp(logp_new - logp_old)
    clip = functools.partial(torch.clamp, min=1 - clip_eps, max=1 + clip_eps)
    surrogate = functools.reduce(torch.minimum, [ratio * advantages, clip(ratio) * advantages])
    loss = -masked_mean(surrogate, response_mask)
    outside = ((ratio - 1).abs() > clip_eps).to(ratio.dtype)
    return loss, float(masked_mean(outside, response_mask))
"""

_SHAPED_TORCH_FUNC = """def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):
    validate_per_token(response_mask, logp_policy=logp_policy, logp_ref=logp_ref)
    validate_scores(scores, response_mask.shape[0])
    per_row = torch.func.vmap(lambda a, b, m: -beta * (a - b) * m)
    rewards = per_row(logp_policy, logp_ref, response_mask)
    last = last_response_index(response_mask)
    bonus = torch.zeros_like(rewards).scatter(1, last[:, None], scores.to(rewards.dtype)[:, None])
    return rewards + bonus
"""

_JIT_HELPER = """@torch.jit.script
def _td_error(r: torch.Tensor, v: torch.Tensor, v_next: torch.Tensor, gamma: float) -> torch.Tensor:
    return r + gamma * v_next - v
"""

_HELPER_MODULE = '''%%writefile /tmp/my_ppo_helpers.py
"""My helpers, kept in a module."""


def td_error(r, v, v_next, gamma):
    return r + gamma * v_next - v
'''

STYLES: dict[str, dict] = {
    "reference": {},
    "future-annotations helper cell": {
        "cells": {"gae": _gae("_delta")},
        "added": [
            (
                "shaped_rewards",
                "from __future__ import annotations\n\n\n"
                + _DELTA.replace("(r, v", "(r: torch.Tensor, v"),
            )
        ],
    },
    "helper reads a read-only variable": {
        "cells": {"gae": _gae("_delta")},
        "added": [("shaped_rewards", f"_LAST_WORD = VOCAB[END_ID]\n\n\n{_DELTA}")],
    },
    "try/except in a helper cell": {
        "cells": {"gae": _gae("_delta")},
        "added": [
            (
                "shaped_rewards",
                f"try:\n    import scipy  # noqa: F401\nexcept ImportError:\n    scipy = None\n\n\n{_DELTA}",
            )
        ],
    },
    "two-line decorator": {
        "cells": {"gae": _gae("_delta")},
        "added": [
            (
                "shaped_rewards",
                "import functools\n\n\n@functools.lru_cache(\n    maxsize=None\n)\ndef _discount(g: float) -> float:\n    return g\n\n\n"
                "def _delta(r, v, v_next, gamma):\n    return r + _discount(gamma) * v_next - v\n",
            )
        ],
    },
    "%%time on an answer cell": {
        "cells": {"gae": "%%time\n" + _gae("_delta") + "\n\n" + _DELTA},
    },
    "magics and shell escapes": {
        "added": [
            (
                "last_response_index",
                "!nproc\n%matplotlib inline\n%timeit -n 1 -r 1 sum(range(10))\nfiles = !ls\n",
            )
        ],
    },
    "IPython.display in an answer cell": {"cells": {"value_loss": _VALUE_DISPLAY}},
    "torch.jit.script helper": {
        "cells": {"gae": _gae("_td_error")},
        "added": [("shaped_rewards", _JIT_HELPER)],
    },
    "__slots__ controller": {"cells": {"AdaptiveKLController": _CONTROLLER_SLOTS}},
    "unfinished controller": {
        "cells": {"AdaptiveKLController": _CONTROLLER_UNFINISHED},
        "lost": [KL],
    },
    "controller cell left unfinished (syntax error)": {
        "cells": {
            "AdaptiveKLController": "class AdaptiveKLController:\n    def __init__(self, beta, target, horizon=10):\n        self.beta = \n"
        },
        "lost": [KL],
    },
    "helper module in an added cell": {
        "cells": {
            "gae": "import sys\n\nsys.path.insert(0, '/tmp')\nfrom my_ppo_helpers import td_error\n\n\n"
            + _gae("td_error")
        },
        "added": [("shaped_rewards", _HELPER_MODULE)],
    },
    "closures": {"cells": {"gae": _GAE_CLOSURE}},
    "generators": {"cells": {"gae": _GAE_GENERATOR}},
    "functools": {"cells": {"ppo_clip_loss": _CLIP_FUNCTOOLS}},
    "numpy": {"cells": {"last_response_index": _LAST_NUMPY}},
    "float64 inside": {"cells": {"gae": _GAE_FLOAT64}},
    "recursion": {"cells": {"gae": _GAE_RECURSIVE}},
    "dataclass controller": {"cells": {"AdaptiveKLController": _CONTROLLER_DATACLASS}},
    "property controller": {"cells": {"AdaptiveKLController": _CONTROLLER_PROPERTY}},
    "torch.func": {"cells": {"shaped_rewards": _SHAPED_TORCH_FUNC}},
    "in-place ops on locals": {"cells": {"value_loss": _VALUE_INPLACE}},
    "prints and warnings": {"cells": {"value_loss": _VALUE_PRINT_WARN}},
}


def style_notebook(base, style: dict):
    """The notebook ``base`` (an nbformat notebook, not changed) written in ``style``."""
    import copy

    import nbformat

    nb = copy.deepcopy(base)
    cells = []
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in style.get("cells", {}):
            cell.source = style["cells"][gid]
        cells.append(cell)
        for anchor, source in style.get("added", []):
            if anchor == gid:
                cells.append(
                    nbformat.v4.new_code_cell(source)
                )  # a cell the student added: no metadata
    nb.cells = cells
    return nb


# ---------------------------------------------------------------------- issue 24: three more styles
# Results in a tuple subclass (typing.NamedTuple, collections.namedtuple) or a list subclass: the
# checks receive them as plain tuples and lists, as they unpack them in a kernel.
_GAE_BODY = """    validate_per_token(response_mask, rewards=rewards, values=values)
    advantages = torch.zeros_like(rewards)
    carry = rewards.new_zeros(rewards.shape[0])
    value_after = rewards.new_zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        m = response_mask[:, t].to(rewards.dtype)
        carry = m * (rewards[:, t] + gamma * value_after - values[:, t] + gamma * lam * carry)
        advantages[:, t] = carry
        value_after = m * values[:, t]
"""
_GAE_SIG = "def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):\n"

_GAE_TYPED_NAMEDTUPLE = (
    "from typing import NamedTuple\n\n\nclass GAEResult(NamedTuple):\n    advantages: torch.Tensor\n"
    "    returns: torch.Tensor\n\n\n"
    + _GAE_SIG
    + _GAE_BODY
    + "    return GAEResult(advantages, (advantages + values) * response_mask)\n"
)
_GAE_LIST_SUBCLASS = (
    'class Pair(list):\n    """A list that names its two items."""\n\n    @property\n    def first(self):\n'
    "        return self[0]\n\n\n"
    + _GAE_SIG
    + _GAE_BODY
    + "    return Pair([advantages, (advantages + values) * response_mask])\n"
)
# One ppo_clip_loss that returns a ClipResult, for the two named-tuple styles below.
_CLIP_RETURNS_RESULT = """def ppo_clip_loss(logp_new: torch.Tensor, logp_old, advantages, response_mask, clip_eps=0.2):
    validate_per_token(response_mask, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    ratio = torch.exp(logp_new - logp_old)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    outside = ((ratio - 1).abs() > clip_eps).to(ratio.dtype)
    return ClipResult(-masked_mean(surrogate, response_mask), float(masked_mean(outside, response_mask)))
"""
_CLIP_NAMEDTUPLE = (
    """import collections

ClipResult = collections.namedtuple("ClipResult", ["loss", "clip_frac"])


"""
    + _CLIP_RETURNS_RESULT
)
_CLIP_TYPED_NAMEDTUPLE_METHODS = (
    """from typing import NamedTuple


class ClipResult(NamedTuple):
    loss: torch.Tensor
    clip_frac: float

    def describe(self) -> str:
        return f"loss {float(self.loss):.4f}, clipped {100 * self.clip_frac:.1f} %"


"""
    + _CLIP_RETURNS_RESULT
)

# A helper module the notebook writes itself, imported from the working folder (on sys.path in ipykernel).
_WRITE_HELPERS = '''%%writefile ppo_helpers.py
"""Helpers of my PPO notebook."""


def td_error(r, v, v_next, gamma):
    return r + gamma * v_next - v
'''
_MAKE_PACKAGE = (
    "import os\n\nos.makedirs('myppo', exist_ok=True)\nopen('myppo/__init__.py', 'w').close()\n"
)
_WRITE_PACKAGE_MODULE = "%%writefile myppo/steps.py\ndef td_error(r, v, v_next, gamma):\n    return r + gamma * v_next - v\n"

# torch.compile on correct code (eager where its compiler cannot start)
_COMPILED_HELPER = """@torch.compile
def _td_error(r, v, v_next, gamma: float):
    return r + gamma * v_next - v
"""
_COMPILED_CALL_FORM = """def _eager_td_error(r, v, v_next, gamma):
    return r + gamma * v_next - v


_td_error = torch.compile(_eager_td_error, dynamic=True)
"""
# (not fullgraph=True: a kernel that has compiled a function for more shapes than dynamo's recompile
# limit stops with a hard error there, so it depends on the cells run before, in a kernel too)
_COMPILED_KL_FEE = """@torch.compile(dynamic=False)
def _kl_fee(logp_policy, logp_ref, response_mask, beta: float):
    return -beta * (logp_policy - logp_ref) * response_mask
"""
_SHAPED_COMPILED = """def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):
    validate_per_token(response_mask, logp_policy=logp_policy, logp_ref=logp_ref)
    validate_scores(scores, response_mask.shape[0])
    rewards = _kl_fee(logp_policy, logp_ref, response_mask, beta)
    last = last_response_index(response_mask)
    bonus = torch.zeros_like(rewards).scatter(1, last[:, None], scores.to(rewards.dtype)[:, None])
    return rewards + bonus
"""

STYLES.update(
    {
        "typing.NamedTuple result": {"cells": {"gae": _GAE_TYPED_NAMEDTUPLE}},
        "collections.namedtuple result": {"cells": {"ppo_clip_loss": _CLIP_NAMEDTUPLE}},
        "NamedTuple result with methods": {
            "cells": {"ppo_clip_loss": _CLIP_TYPED_NAMEDTUPLE_METHODS}
        },
        "list subclass result": {"cells": {"gae": _GAE_LIST_SUBCLASS}},
        "%%writefile helper module, import": {
            "cells": {"gae": "import ppo_helpers\n\n\n" + _gae("ppo_helpers.td_error")},
            "added": [("shaped_rewards", _WRITE_HELPERS)],
        },
        "%%writefile helper module, from-import": {
            "cells": {"gae": "from ppo_helpers import td_error as _step\n\n\n" + _gae("_step")},
            "added": [("shaped_rewards", _WRITE_HELPERS)],
        },
        "%%writefile helper package": {
            "cells": {"gae": "from myppo.steps import td_error\n\n\n" + _gae("td_error")},
            "added": [("shaped_rewards", _MAKE_PACKAGE), ("shaped_rewards", _WRITE_PACKAGE_MODULE)],
        },
        "@torch.compile helper": {
            "cells": {"gae": _gae("_td_error")},
            "added": [("shaped_rewards", _COMPILED_HELPER)],
        },
        "torch.compile(fn) call form": {
            "cells": {"gae": _gae("_td_error")},
            "added": [("shaped_rewards", _COMPILED_CALL_FORM)],
        },
        "@torch.compile(dynamic=False) helper of shaped_rewards": {
            "cells": {"shaped_rewards": _COMPILED_KL_FEE + "\n\n" + _SHAPED_COMPILED},
        },
    }
)


# ---------------------------------------------------------------- issue 31: whole answers, tests in place
# Two more cell shapes JupyterLab makes (``split``, ``merged_from_above``), applied on top of the
# shapes above. ``nbgrader_lost``: graded tests plain nbgrader loses although the work is correct
# (the engine must keep them: "10 is right"; test_fairness checks the reference says so too).
#   split: {grade id: (first half, second half)}: Ctrl+Shift+- in JupyterLab 4 replaces the cell by
#       two cells, each with a copy of its metadata (nbgrader's grade id included) and a new cell id.
#   merged_from_above: {grade id: helper source}: a helper cell above the answer, merged into it
#       with the helper selected (Shift+M): the merged cell keeps the helper's metadata (none), its
#       source is the helper, a blank line, the answer.
_style_notebook_plain = style_notebook


def style_notebook(base, style: dict):  # noqa: F811 - the shapes above plus split and merged cells
    """The notebook ``base`` (an nbformat notebook, not changed) written in ``style``."""
    import copy

    nb = _style_notebook_plain(base, style)
    cells = []
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in style.get("merged_from_above", {}):
            cell.source = style["merged_from_above"][gid] + "\n\n" + cell.source
            del cell.metadata["nbgrader"]
        if gid in style.get("split", {}):
            first, second = style["split"][gid]
            half = copy.deepcopy(cell)
            cell.source, half.source = first, second
            half["id"] = f"{cell.get('id', gid)}-split"[:64]
            cells += [cell, half]
            continue
        cells.append(cell)
    nb.cells = cells
    return nb


_GAE_MC_EXPERIMENT = """# An experiment after the test: lambda = 1 gives Monte Carlo advantages. How do they differ?
_my_gae = gae


def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    return _my_gae(rewards, values, response_mask, gamma, 1.0)


_r = torch.tensor([[0.0, 0.0, 1.0]])
_v = torch.tensor([[0.2, 0.5, 0.7]])
print(gae(_r, _v, torch.ones(1, 3))[0], _my_gae(_r, _v, torch.ones(1, 3))[0])
"""

STYLES.update(
    {
        "answer cell split in two (JupyterLab Ctrl+Shift+-)": {
            "split": {"gae": (_DELTA, _gae("_delta"))},
            # nbgrader's DeduplicateIds empties the first half's metadata, then stops the whole
            # notebook (SchemaTooOldError): nothing is graded there; Jupyter runs both halves
            "nbgrader_lost": list(CHECKS),
        },
        "helper cell merged into the answer (JupyterLab Shift+M)": {
            "cells": {"gae": _gae("_delta")},
            "merged_from_above": {"gae": _DELTA},
        },
        "later experiment rebinds a graded name after its test": {
            "added": [(_ID["check_gae"], _GAE_MC_EXPERIMENT)],
        },
    }
)


# ---------------------------------------------------------------------- issue 31: processes, as in a kernel
# Shell lines and %%bash run in the working folder (what they write is importable); a small Pool works
# within the sandbox's process bound (pids.max), as it does in the student's kernel.
_MKDIR_PACKAGE = "!mkdir -p ppo_steps\n"
_WRITE_PACKAGE_INIT = "%%writefile ppo_steps/__init__.py\ndef td_error(r, v, v_next, gamma):\n    return r + gamma * v_next - v\n"
_BASH_HELPER = """%%bash
cat > bash_helpers.py <<'PY'
def td_error(r, v, v_next, gamma):
    return r + gamma * v_next - v
PY
echo "wrote $(wc -l < bash_helpers.py) lines"
"""
_GAE_POOL = """import multiprocessing


def _gae_row(row):
    r, v, m, gamma, lam = row
    adv, carry, v_next = [0.0] * len(r), 0.0, 0.0
    for t in reversed(range(len(r))):
        carry = m[t] * (r[t] + gamma * v_next - v[t] + gamma * lam * carry)
        adv[t] = carry
        v_next = m[t] * v[t]
    return adv


def gae(rewards, values, response_mask, gamma: float = 1.0, lam: float = 0.95):
    validate_per_token(response_mask, rewards=rewards, values=values)
    m = response_mask.to(torch.float64)
    rows = [
        (r, v, mm, float(gamma), float(lam))
        for r, v, mm in zip(rewards.tolist(), values.tolist(), m.tolist())
    ]
    with multiprocessing.Pool(2) as pool:  # one sequence per task
        per_row = pool.map(_gae_row, rows)
    advantages = torch.tensor(per_row, dtype=rewards.dtype).reshape(rewards.shape)
    return advantages, (advantages + values) * response_mask
"""

STYLES.update(
    {
        "!mkdir package, %%writefile, import": {
            "cells": {"gae": "import ppo_steps\n\n\n" + _gae("ppo_steps.td_error")},
            "added": [
                ("shaped_rewards", _MKDIR_PACKAGE),
                ("shaped_rewards", _WRITE_PACKAGE_INIT),
            ],
        },
        "%%bash writes a helper module": {
            "cells": {"gae": "from bash_helpers import td_error\n\n\n" + _gae("td_error")},
            "added": [("shaped_rewards", _BASH_HELPER)],
        },
        "multiprocessing.Pool in an answer": {"cells": {"gae": _GAE_POOL}},
    }
)
