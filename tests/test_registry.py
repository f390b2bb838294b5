"""The graded-check registry (``@graded`` in tests/ppo_checks.py) and the fragment headers that use it.

Adding a graded function is one check with its decorator and one fragment header; the build writes
the test cell (points, hidden check, call) from the registry and refuses a header key it does not know.
"""

import dataclasses
import re

import jupytext
import nbformat
import pytest
from mlbook_tools import build
from mlbook_tools import fragments as rules  # the fixture `fragments` is a folder of them
from mlbook_tools.config import assignment, layout
from ppo_checks import CHECKS, CORE_MAX, graded

pytestmark = pytest.mark.unit

ROOT = layout().root
SOURCE = ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb"


def test_registry_declares_the_named_tests_and_the_extra_credit():
    core = {g: c for g, c in CHECKS.items() if not c.extra}
    # the named tests and their points are declared only by @graded (no count or total is copied here)
    assert core and all(g.startswith("test_") for g in core)
    assert all(c.points > 0 for c in CHECKS.values())
    assert CORE_MAX == sum(c.points for c in core.values())
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
        # the visible points line is the declaration's, written by the build
        assert f"# Graded ({rules.points_phrase(check)}):" in cell.source, gid
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
            rules.check_header(frag, i, cell)


def test_points_phrase_reads_as_the_fragment_used_to_say_it():
    gae, ex = CHECKS["test_gae_matches_brute_force_and_mc_return"], CHECKS["ex4_ptx_test"]
    assert rules.points_phrase(gae) == f"{gae.points:g} points"
    assert rules.points_phrase(dataclasses.replace(gae, points=1)) == "1 point"
    assert rules.points_phrase(dataclasses.replace(ex, points=1)) == "1 point, extra credit"
    assert rules.points_phrase(dataclasses.replace(gae, points=1.5)) == "1.5 points"


def test_a_hand_typed_points_line_fails_the_build(fragments):
    _edit(
        fragments,
        "# Graded: hidden tests compare `gae`",
        "# Graded (3 points): hidden tests compare `gae`",
    )
    with pytest.raises(ValueError, match=r"test_gae_matches.*by hand.*@graded"):
        build.source_notebook("rlhf_ppo")


def test_the_points_line_follows_the_declaration(fragments, monkeypatch):
    gid = "test_gae_matches_brute_force_and_mc_return"
    registry = {**CHECKS, gid: dataclasses.replace(CHECKS[gid], points=5)}
    monkeypatch.setattr(build, "load_registry", lambda path: registry)
    cell = next(c for c in build.source_notebook("rlhf_ppo").cells if c.id == gid)
    assert cell.source.startswith("# Graded (5 points): hidden tests compare `gae`")
    assert cell.metadata["nbgrader"]["points"] == 5


@pytest.mark.parametrize("bad", ["gea", "no_such_reference_name"])
def test_a_check_parameter_the_grader_cannot_bind_fails_the_build(fragments, monkeypatch, bad):
    """A parameter that is neither an answer cell's function or class nor an attribute of the
    reference would make every submission UNGRADED at grading time: the build says so first."""
    gid = "test_gae_matches_brute_force_and_mc_return"
    registry = {**CHECKS, gid: dataclasses.replace(CHECKS[gid], names=(bad,))}
    monkeypatch.setattr(build, "load_registry", lambda path: registry)
    with pytest.raises(ValueError, match=rf"check_gae .*{gid}.*parameter {bad!r}.*UNGRADED"):
        build.source_notebook("rlhf_ppo")


def test_check_parameters_accept_answer_symbols_and_reference_attributes():
    cells = nbformat.read(SOURCE, as_version=4).cells
    rules.check_parameters(
        CHECKS, cells, (assignment().reference,)
    )  # the chapter's own registry passes
    # train_ppo and PPOConfig are the course's read-only code: found only in the reference
    assert CHECKS["test_train_ppo_increases_reward_with_bounded_kl"].names == (
        "train_ppo",
        "PPOConfig",
    )
    with pytest.raises(ValueError, match=r"check_train_ppo .*parameter 'train_ppo'"):
        rules.check_parameters(CHECKS, cells, ("math",))  # not in that reference
    answers_only = [c for c in cells if c.metadata["nbgrader"].get("grade_id") != "gae"]
    with pytest.raises(ValueError, match=r"check_gae .*parameter 'gae'"):
        rules.check_parameters(CHECKS, answers_only, ("math",))


def test_docs_leave_the_core_total_to_the_registry():
    """The README, the fragments' README and the course config describe the scores without typing
    the core total (CORE_MAX, from @graded): adding a core test changes no prose file."""
    root = layout().root
    said = {
        "README.md": [
            r"six named tests \((\d+) points\)",
            r"core (\d+) / (\d+)",
            r"(\d+) / (\d+), never",
        ],
        "solutions/chapter/README.md": [r"core tests \((\d+) points\)"],
        "autograde/nbgrader_config.py": [r"as (\d+) \(\+ extra\) / (\d+)"],
    }
    for rel, patterns in said.items():
        text = " ".join(root.joinpath(rel).read_text().split())
        for pattern in patterns:
            assert not re.findall(pattern, text), f"{rel} types a core total ({pattern!r})"
