"""The graded-check registry (``@graded`` in tests/ppo_checks.py) and the fragment headers that use it.

Adding a graded function is one check with its decorator and one fragment header; the build writes
the test cell (points, hidden check, call) from the registry and refuses a header key it does not know.
"""

import jupytext
import nbformat
import pytest
from mlbook_tools import build
from mlbook_tools.config import layout
from ppo_checks import CHECKS, graded

pytestmark = pytest.mark.unit

ROOT = layout().root
SOURCE = ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb"


def test_registry_declares_the_six_named_tests_and_the_extra_credit():
    core = {g: c for g, c in CHECKS.items() if not c.extra}
    # the six named tests; their points are declared only by @graded (no total is copied here)
    assert len(core) == 6 and all(c.points > 0 for c in CHECKS.values())
    assert all(g.startswith("ex") for g, c in CHECKS.items() if c.extra)
    assert CHECKS["test_train_ppo_increases_reward_with_bounded_kl"].names == (
        "train_ppo",
        "PPOConfig",
    )


def test_source_notebook_test_cells_come_from_the_registry():
    cells = {
        c.metadata["nbgrader"]["grade_id"]: c for c in nbformat.read(SOURCE, as_version=4).cells
    }
    for gid, check in CHECKS.items():
        cell = cells[gid]
        points = cell.metadata.get("mlbook", {}).get(
            "extra_credit", cell.metadata["nbgrader"]["points"]
        )
        assert points == check.points, gid
        assert check.call_source() in cell.source and "@graded" not in cell.source, gid
    tests = [
        g
        for g, c in cells.items()
        if c.metadata["nbgrader"].get("grade") and not c.metadata["nbgrader"].get("solution")
    ]
    assert sorted(tests) == sorted(CHECKS)  # no graded cell without a declared check


def test_a_check_must_take_seed_last_and_ids_are_unique():
    with pytest.raises(ValueError, match="seed"):
        graded("test_x", 1)(lambda fn: None)
    with pytest.raises(ValueError, match="twice"):
        graded(next(iter(CHECKS)), 1)(lambda fn, seed=0: None)


def _edit(folder, old, new):
    path = folder / "30_implementation.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_typo_in_a_header_key_fails_the_build(fragments):
    _edit(fragments, 'stub_methods="update"', 'stub_method="update"')
    with pytest.raises(ValueError, match=r"unknown header key\(s\) stub_method"):
        build.source_notebook("rlhf_ppo")


def test_a_test_header_without_a_declared_check_fails_the_build(fragments):
    _edit(fragments, 'test="test_gae_matches_brute_force_and_mc_return"', 'test="test_gae_typo"')
    with pytest.raises(ValueError, match="test_gae_typo.*@graded"):
        build.source_notebook("rlhf_ppo")


def test_points_or_check_in_a_header_are_refused_with_the_reason(fragments):
    _edit(
        fragments,
        'test="test_gae_matches_brute_force_and_mc_return"',
        'test="test_gae_matches_brute_force_and_mc_return" points=3',
    )
    with pytest.raises(ValueError, match="points come from its @graded"):
        build.source_notebook("rlhf_ppo")


def test_the_fragments_use_only_known_keys():
    for frag in sorted(layout().chapters_src.glob("*/[0-9]*.py")):
        for i, cell in enumerate(jupytext.reads(frag.read_text(), fmt="py:percent").cells):
            build._check_header(frag, i, cell)
