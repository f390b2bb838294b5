"""What `mlbook grade` does before and around the engine (issue 32: the command a student runs
again and again): it loads no notebook renderer, reads the sandbox's import roots as
``dist.files`` would, leaves no sandbox behind when the file is refused, and skips a grammar no
schema it validates uses. Its time is measured in `make bench`, never asserted here."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest
from mlbook_tools import cgroups, confine
from mlbook_tools.grading import grade_notebook
from mlbook_tools.limits import DEFAULT

pytestmark = pytest.mark.sandbox  # grades the solved notebook; starts sandboxes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_grade_path_imports_no_notebook_renderer():
    """nbconvert, nbgrader (and their jinja2, sqlalchemy) are a second of imports `mlbook grade`
    never uses: not on its trusted side, not in its report."""
    code = """
import sys
from mlbook_tools import cli
cli._without_iri_grammar()
from mlbook_tools import driver, grading, sandbox
from mlbook_tools.config import layout
from mlbook_tools.result import GradingResult
grading.course_limits(layout().course)  # the course config's limits, read without running it
driver._warm_up()
cli.print_report(GradingResult({}, {}, problems=["\\x1b[2J"], output="", seconds=0.0, cell_errors={}))
heavy = [m for m in ("nbconvert", "nbgrader", "jinja2", "sqlalchemy", "lark") if m in sys.modules]
print("HEAVY", heavy)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout, run.stdout
    assert "\x1b" not in run.stdout  # the report still passes student text through printable


def test_import_roots_read_from_record_match_dist_files():
    for dist in md.distributions():
        expected = {str(f).split("/", 1)[0] for f in dist.files or []}
        assert confine._top_names(dist) == expected, dist.metadata["Name"]


def test_no_schema_nbformat_validates_names_a_format():
    """`mlbook grade` marks rfc3987_syntax absent (its grammars cost 0.7 s to build): it serves only a
    format checker's "iri" formats, and nbformat's schemas use no format keyword at all."""
    import nbformat

    def formats(node):
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                yield node["format"]
            for value in node.values():
                yield from formats(value)
        elif isinstance(node, list):
            for value in node:
                yield from formats(value)

    folder = pathlib.Path(nbformat.__file__).parent
    schemas = sorted(folder.glob("v*/*.schema.json"))
    assert schemas
    for path in schemas:
        assert not list(formats(json.loads(path.read_text()))), path


def _children() -> set[int]:
    out = set()
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass
    return {p for p in out if cgroups.running(p)}


@pytest.mark.sandbox
def test_a_refused_file_closes_the_sandbox_started_for_it(tmp_path):
    """The sandbox starts before the file is read (``starting.Starting``); a refused file ends it."""
    before = _children()
    big = tmp_path / "big.ipynb"
    big.write_text(json.dumps({"cells": [], "metadata": {}, "pad": "x" * 4096}))
    result = grade_notebook(big, limits=DEFAULT.replace(max_notebook_bytes=1024))
    assert result.error and "too large" in result.error
    assert not [t for t in threading.enumerate() if t.name == "mlbook-sandbox-start"]
    assert _children() <= before
    for controller in ("memory", "pids", "cpuacct"):
        parent = cgroups.own_cgroup(controller)
        if parent is not None and parent.is_dir():
            assert not list(parent.glob(f"mlbook-sandbox-{os.getpid()}-*")), controller


@pytest.mark.sandbox
def test_the_solved_notebook_grades_in_one_runner_with_no_note():
    """Through the whole entry point (the runner started before the plan, ``starting.Starting``): full
    core points, no cell skipped, no restart. A runner made on a thread that then ends is killed by
    bubblewrap's --die-with-parent at the first cell: the first cell would be noted and skipped."""
    result = grade_notebook(ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb")
    assert result.core.score == result.core.max_score > 0
    assert result.problems == [] and result.cell_errors == {}, (result.problems, result.cell_errors)
