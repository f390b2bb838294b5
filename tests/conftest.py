"""Defaults for the test kinds, the unit guard, and the one graded class (``graded_class``) the course
tests share.

Each tests/test_*.py states its kinds where it is written (a module-level ``pytestmark``;
tests/test_tiers.py checks that it does). Here only the defaults: what nbval collects is
``notebook``, a test with no lane is ``unit``. A lane is ``unit`` (``make check``) or one or more
of ``HEAVY`` (``make test``, or ``make test-full`` with ``full``); ``portable`` only adds a rerun
on torch's portable kernels.

The unit guard (pytest-socket's pattern): while a ``unit`` test runs, starting a sandbox, a
subprocess of the grader, nbgrader, Jupyter or a browser fails the test with "unit test started X".
"""

import ast
import contextlib
import functools
import json
import os
import pathlib
import shlex
import subprocess

import pytest
import torch

# The toy's tensors are tiny: intra-op threads only contend with each other (10x slower under load).
torch.set_num_threads(1)

HEAVY = {"sandbox", "nbgrader", "classrun", "browser", "notebook", "slow", "stress"}
KIND_NAMES = HEAVY | {"unit", "portable"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if pathlib.Path(str(item.fspath)).suffix == ".ipynb":
            item.add_marker("notebook")
        if not {m.name for m in item.iter_markers()} & (HEAVY | {"unit"}):
            item.add_marker("unit")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (make test's heavy lane and make test-full, ``-n auto``): the tests of a
    file run on one worker, so its module fixtures start once and nbval runs a notebook's cells in
    one kernel, and the files that read the graded class run on one worker, so the session fixture
    grades it once."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerPerFile(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return xdist_scope(config.rootpath, nodeid)

    return OneWorkerPerFile(config, log)


def xdist_scope(root: pathlib.Path, nodeid: str) -> str:
    """The tests with one scope run on one xdist worker: a file's, or every reader's of the graded class."""
    path = nodeid.split("::", 1)[0]
    return "graded_class" if _reads_graded_class(root / path) else path


@functools.cache
def _reads_graded_class(path: pathlib.Path) -> bool:
    """Whether a test file's functions (tests or fixtures) take the ``graded_class`` fixture."""
    if path.suffix != ".py":
        return False
    tree = ast.parse(path.read_text())
    return any(
        "graded_class" in (a.arg for a in node.args.args)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    )


def pytest_collection_finish(session):
    """With MLBOOK_KINDS_TO=<file>: write every collected test's kinds there (tests/test_tiers.py reads it)."""
    if out := os.environ.get("MLBOOK_KINDS_TO"):
        kinds = {
            item.nodeid: sorted({m.name for m in item.iter_markers()} & (KIND_NAMES | {"full"}))
            for item in session.items
        }
        pathlib.Path(out).write_text(json.dumps(kinds))


# --- the unit guard -----------------------------------------------------------------------------


class UnitTestStarted(AssertionError):
    """A unit test started what only the other lanes may start."""


# What a command line starts, by the start of a word's base name (or a ``-m`` module): first match.
STARTED = (
    ("bwrap", "a sandbox (bubblewrap)"),
    ("nbgrader", "nbgrader"),
    ("alembic", "nbgrader (its alembic; tests/gradebook_support.py makes gradebooks in-process)"),
    ("mlbook_tools.classgrade", "a grader worker"),
    ("mlbook_tools.cli", "the grader (mlbook)"),
    ("mlbook_tools.execute", "a notebook executor"),
    ("ipykernel", "a Jupyter kernel"),
    ("jupyter", "Jupyter"),
    ("chrom", "a browser (Chromium)"),
    ("configurable-http-proxy", "the hub's proxy"),
    ("torchrun", "torchrun"),
)


def started(args) -> str | None:
    """What a Popen command line starts that a unit test must not (None: nothing of that kind)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = shlex.split(os.fsdecode(args))
    else:
        argv = [os.fsdecode(a) for a in args]
    running = "--collect-only" not in argv  # collecting notebooks starts no kernel
    if running and any("--nbval" in a for a in argv):  # pytest running notebooks: a kernel each
        return "Jupyter (nbval)"
    names = [os.path.basename(a).lower() for a in argv if not a.startswith("-")]
    if "mlbook" in names:  # the console script (``mlbook grade``, ``grade-class``, ``hub``)
        return "the grader (mlbook)"
    for word, what in STARTED:
        if any(name.startswith(word) for name in names):
            return what
    return None


@contextlib.contextmanager
def unit_guard():
    """Patch the lowest common points: every subprocess (Popen._execute_child, which run, call,
    check_output and asyncio's subprocesses go through), the sandbox's Runner, Selenium's Chrome."""
    patches = []

    def patch(owner, name, replacement):
        patches.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    original = subprocess.Popen._execute_child

    def execute_child(self, args, *rest, **kw):
        if what := started(args):
            raise UnitTestStarted(f"unit test started {what}: {args!r:.300}")
        return original(self, args, *rest, **kw)

    def refuse(what):
        def refused(*args, **kw):
            raise UnitTestStarted(f"unit test started {what}")

        return refused

    patch(subprocess.Popen, "_execute_child", execute_child)
    from mlbook_tools import sandbox

    patch(sandbox.Runner, "__init__", refuse("a sandbox (mlbook_tools.sandbox.Runner)"))
    with contextlib.suppress(ImportError):
        from selenium.webdriver.chrome.webdriver import WebDriver

        patch(WebDriver, "__init__", refuse("a browser (selenium Chrome)"))
    try:
        yield
    finally:
        for owner, name, value in reversed(patches):
            setattr(owner, name, value)


def _guarded(item) -> bool:
    """A unit test runs under ``unit_guard``, its fixtures' setup and teardown too (MLBOOK_GUARD_ALL=1:
    every test does, to list the pure tests of the other lanes: those that still pass)."""
    return bool(item.get_closest_marker("unit") or os.environ.get("MLBOOK_GUARD_ALL"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if not _guarded(item):
        if item.get_closest_marker("sandbox") and _no_sandbox():
            pytest.skip(f"bubblewrap cannot start here: {_no_sandbox()}")
        return (yield)
    with unit_guard():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _guarded(item):
        return (yield)
    with unit_guard():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if not _guarded(item):
        return (yield)
    with unit_guard():
        return (yield)


# --- the other lanes ----------------------------------------------------------------------------


@functools.cache
def _no_sandbox() -> str | None:
    """Why bubblewrap cannot start here (None if it can): asked once, when a sandbox test first runs."""
    from mlbook_tools import sandbox

    return sandbox.check_available()


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


@pytest.fixture
def fragments(tmp_path, monkeypatch):
    """A copy of the chapter's fragments that ``mlbook build`` reads instead of the real ones."""
    import shutil

    from mlbook_tools import build
    from mlbook_tools.config import layout

    folder = tmp_path / "rlhf_ppo"
    shutil.copytree(layout().chapters_src / "rlhf_ppo", folder)
    real = layout()
    monkeypatch.setattr(
        build, "layout", lambda: real.__class__(**{**vars(real), "chapters_src": tmp_path})
    )
    return folder
