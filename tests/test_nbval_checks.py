"""The nbval checks bite: a perturbed stored number fails, the release raises only for missing answers.

`make test` runs nbval over the solved notebooks (outputs of cells tagged nbval-check-output are
compared, after tests/nbval_sanitize.cfg) and over the student release (cells tagged
raises-exception may raise). These tests show that those checks can fail, and check what nbval
itself cannot: that a release cell raises only NotImplementedError from an unwritten answer.
What the build stores for nbval, read without a kernel, is test_build.py's (unit).
"""

import ast
import re
import subprocess
import sys

import nbformat
import pytest
from mlbook_tools.build import RAISES
from nbclient import NotebookClient
from nbval_support import RELEASE, ROOT, SANITIZE
from nbval_support import checked as _checked
from nbval_support import code_cells as _code

pytestmark = pytest.mark.nbgrader


def _nbval(*targets, cwd):
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--nbval-lax",
        "--nbval-sanitize-with",
        str(SANITIZE),
        *targets,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_nbval_fails_on_a_perturbed_checked_number(tmp_path):
    """The first checked cell that prints a decimal number (found by its tag, not by its place or id) gets
    that number's last digit changed in a copy: nbval fails on that cell and passes the code cells before
    it, a checked one among them (the untouched notebook passes the same cells in `make test`)."""
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb", as_version=4)
    cells = _code(nb)  # nbval names code cells "Cell <i>"
    number = re.compile(r"\d+\.\d+")
    table = next(
        i
        for i, c in enumerate(cells)
        if _checked(c)
        and any(o.output_type == "stream" and number.search(o.text) for o in c.outputs)
    )
    assert any(_checked(c) for c in cells[:table]), "a checked cell runs before the perturbed one"
    stream = next(
        o for o in cells[table].outputs if o.output_type == "stream" and number.search(o.text)
    )
    old = number.search(stream.text).group()
    new = old[:-1] + str((int(old[-1]) + 1) % 10)
    stream.text = stream.text.replace(old, new, 1)
    copy = tmp_path / "perturbed.ipynb"
    nbformat.write(nb, copy)
    # nbval runs only the selected cells (in order, one kernel): everything up to the perturbed one.
    result = _nbval(*(f"{copy.name}::Cell {i}" for i in range(table + 1)), cwd=tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    assert f"1 failed, {table} passed" in report, report
    assert f"Cell {table}: Cell outputs differ" in report, report
    assert old in report and new in report, report


def _assigned(source):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def test_release_raises_only_for_unwritten_answers():
    """Every release cell tagged raises-exception raises; the error is the stub's NotImplementedError,
    or a NameError for a variable that an earlier raising cell defines in the solved notebook. Untagged cells
    must run cleanly (nbclient stops on their errors)."""
    solved = {
        c.id: c.source
        for c in _code(nbformat.read(ROOT / "solutions" / "notebooks" / RELEASE.name, as_version=4))
    }
    nb = nbformat.read(RELEASE, as_version=4)
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(RELEASE.parent)}},
    ).execute()
    tagged = [c for c in _code(nb) if RAISES in c.metadata.get("tags", [])]
    assert tagged, "no release cell is tagged raises-exception: nbgrader dropped the tags?"
    undefined_ok = set()  # names that a raising cell did not get to define
    for cell in _code(nb):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if RAISES not in cell.metadata.get("tags", []):
            assert not errors, f"{cell.id}: untagged cell raised {errors[0].ename}"
            continue
        assert errors, (
            f"{cell.id} is tagged {RAISES} but runs without error: drop needs_answers from its fragment"
        )
        err = errors[0]
        if err.ename == "NameError":
            missing = re.search(r"name '(\w+)' is not defined", err.evalue).group(1)
            assert missing in undefined_ok, (
                f"{cell.id}: NameError {missing!r} is not explained by a missing answer"
            )
        else:
            assert err.ename == "NotImplementedError", f"{cell.id}: {err.ename}: {err.evalue}"
        undefined_ok |= _assigned(solved[cell.id])  # what the cell defines once it is answered
