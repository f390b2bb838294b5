"""Markers by kind, applied by file, and the one graded class (``graded_class``) the course tests share.

Every test gets at least one kind (pyproject.toml lists them): from ``KINDS`` by its file (a file
not listed is ``unit``), from a marker written on the test itself, or ``notebook`` for what nbval
collects. A test marked ``full`` (on the test itself) runs only in ``make test-full``, which CI runs
after ``make test``; ``make test`` keeps at least one test of every kind.
"""

import functools
import json
import os
import pathlib

import pytest
import torch

# The toy's tensors are tiny: intra-op threads only contend with each other (10x slower under load).
torch.set_num_threads(1)

KINDS = {  # file -> kinds of every test in it
    "test_autograde.py": ("classrun", "nbgrader", "sandbox"),
    "test_adversarial.py": ("classrun", "sandbox"),
    "test_fairness.py": ("classrun",),
    "test_engine.py": ("sandbox",),
    # test_sandbox_bounds.py: its tests that start a sandbox carry the marker themselves
    "test_bounds.py": ("sandbox",),
    "test_load.py": ("sandbox",),
    "test_browser.py": ("browser",),
    "test_xss.py": ("browser",),
    "test_hub.py": ("browser",),
    "test_nbval_checks.py": ("nbgrader",),
    "test_student_dist.py": ("slow",),
    "test_student_work.py": ("slow",),
    "test_ddp.py": ("slow",),
    "test_progress.py": ("slow",),  # starts kernels
    # compare a trained or sampled number with a stored one: rerun on torch's portable kernels
    "test_posttrain_ppo.py": ("portable",),
    "test_grading_catalog.py": ("portable",),
    "test_exercises.py": ("portable",),
    "test_reward_model.py": ("portable",),
    "test_critic_free.py": ("portable",),
}
KIND_NAMES = {
    "unit",
    "sandbox",
    "nbgrader",
    "classrun",
    "browser",
    "notebook",
    "slow",
    "stress",
    "portable",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.fspath))
        if path.suffix == ".ipynb":
            item.add_marker("notebook")
        for kind in KINDS.get(path.name, ()):
            item.add_marker(kind)
        if not {m.name for m in item.iter_markers()} & KIND_NAMES:
            item.add_marker("unit")


def pytest_collection_finish(session):
    """With MLBOOK_KINDS_TO=<file>: write every collected test's kinds there (tests/test_tiers.py reads it)."""
    if out := os.environ.get("MLBOOK_KINDS_TO"):
        kinds = {
            item.nodeid: sorted({m.name for m in item.iter_markers()} & (KIND_NAMES | {"full"}))
            for item in session.items
        }
        pathlib.Path(out).write_text(json.dumps(kinds))


@functools.cache
def _no_sandbox() -> str | None:
    """Why bubblewrap cannot start here (None if it can): asked once, when a sandbox test first runs."""
    from mlbook_tools import sandbox

    return sandbox.check_available()


def pytest_runtest_setup(item):
    if item.get_closest_marker("sandbox") and _no_sandbox():
        pytest.skip(f"bubblewrap cannot start here: {_no_sandbox()}")


@pytest.fixture(scope="session")
def graded_class(request, tmp_path_factory):
    """The shared class, graded once (tests/graded_class.py says who is in it and how it is run): the
    students of the tiers the session's selected tests need (``full``-marked ones: make test-full's)."""
    import graded_class as gc

    tiers = {
        bool(item.get_closest_marker("full"))
        for item in request.session.items
        if "graded_class" in getattr(item, "fixturenames", ())
    }
    return gc.grade(
        tmp_path_factory.mktemp("class") / "course", fast=False in tiers, full=True in tiers
    )
