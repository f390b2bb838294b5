"""What "Check your work" and ``mlbook.handin`` say (pure functions on notebook files)."""

import json
import pathlib

import pytest
from mlbook_tools.config import layout

from mlbook.handin import CannotHandIn, read_notebook
from mlbook.selfcheck import is_extra, summary

pytestmark = pytest.mark.unit


def test_the_summary_counts_every_check_and_says_core_and_extra_credit_apart():
    results = {"gae": None, "check of ppo_clip_loss": "AssertionError", "ex4_grad": "ValueError"}
    line = summary(results, ["check of ex5_decoupled"])
    assert line.startswith("1 of 4 visible checks pass, 1 not run here"), line
    assert "(core 1 of 2; extra credit 0 of 2)." in line, line


def test_a_notebook_whose_only_failures_are_extra_credit_reads_full_core():
    line = summary({"gae": None, "test_kl": None, "ex3_pairwise": "AssertionError"})
    assert line == "2 of 3 visible checks pass (core 2 of 2; extra credit 0 of 1).", line


def test_extra_credit_is_the_ex_grade_ids_and_their_check_cells():
    assert is_extra("ex4_grad") and is_extra("check of ex5_decoupled")
    assert not is_extra("gae") and not is_extra("check of gae")


def _release_with(tmp_path, edit):
    doc = json.loads((layout().release / "rlhf_ppo.ipynb").read_text())
    edit(doc["cells"])
    path = tmp_path / "rlhf_ppo.ipynb"
    path.write_text(json.dumps(doc))
    return path


def _index(cells, grade_id):
    return next(
        i
        for i, c in enumerate(cells)
        if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id
    )


def test_handin_takes_an_answer_split_in_two_and_refuses_a_copied_test_cell(tmp_path):
    """JupyterLab's Ctrl+Shift+- copies the answer's metadata into both halves: graded whole, so
    handed in; a second copy of a test cell is a damaged notebook."""

    def split(cells):
        i = _index(cells, "gae")
        half = dict(cells[i], id="gae-2", source="def _helper():\n    return 0\n")
        cells.insert(i + 1, half)

    assert read_notebook(_release_with(tmp_path, split))

    def copy_test(cells):
        i = next(
            j
            for j, c in enumerate(cells)
            if c["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("test_gae")
        )
        cells.insert(i + 1, dict(cells[i], id="copy"))

    with pytest.raises(CannotHandIn, match="appears twice"):
        read_notebook(_release_with(tmp_path, copy_test))


def _tiny(path, assignment="tiny", test="assert 1 + 1 == 2"):
    """A notebook of another assignment: one graded test cell; its name in the metadata build writes."""
    cell = {
        "cell_type": "code",
        "id": "t",
        "metadata": {"nbgrader": {"grade": True, "grade_id": "test_tiny", "points": 1}},
        "source": test,
        "outputs": [],
        "execution_count": None,
    }
    meta = {"mlbook": {"assignment": assignment}} if assignment else {}
    path.write_text(
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": meta, "cells": [cell]})
    )
    return path


def test_the_notebook_and_its_upload_name_come_from_the_notebook_not_the_library(
    tmp_path, monkeypatch
):
    """handin and check find the notebook as Jupyter names it (``__session__``) or as the one in the
    folder named after its assignment, and hand it in under that assignment's name: nothing in the
    student library names this chapter's notebook."""
    import mlbook.handin
    import mlbook.selfcheck
    from mlbook.handin import handin
    from mlbook.selfcheck import assignment_of, this_notebook

    for module in (mlbook.handin, mlbook.selfcheck):
        assert "rlhf_ppo" not in pathlib.Path(module.__file__).read_text()
    copy = _tiny(tmp_path / "tiny-Copy1.ipynb")
    _tiny(tmp_path / "notes.ipynb", assignment=None)  # no assignment: never picked
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no assignment notebook in"):
        this_notebook()
    own = _tiny(tmp_path / "tiny.ipynb")
    assert this_notebook() == own
    assert this_notebook({"__session__": str(copy)}) == copy  # the kernel's own notebook first
    assert this_notebook({"__session__": str(tmp_path / "gone.ipynb")}) == own
    assert handin() == tmp_path / "to-upload" / "tiny.ipynb"
    written = handin(copy)  # a copy goes in under its assignment's name
    assert written == tmp_path / "to-upload" / "tiny.ipynb"
    assert written.read_bytes() == copy.read_bytes()
    assert handin(tmp_path / "notes.ipynb").name == "notes.ipynb"  # no metadata: its own name
    assert repr(written) == str(
        written
    )  # a cell ending in handin() shows the path, not PosixPath(...)
    for bad in ("../x", "a/b", "", 3, None):
        assert assignment_of({"metadata": {"mlbook": {"assignment": bad}}}) is None, bad
    _tiny(tmp_path / "other.ipynb", assignment="other")
    with pytest.raises(FileNotFoundError, match="2 assignment notebooks"):
        this_notebook()


def test_handin_counts_failing_checks_in_words(tmp_path, capsys):
    from mlbook.handin import handin

    handin(_tiny(tmp_path / "tiny.ipynb", test="assert 1 + 1 == 3"), namespace=None)
    assert (
        "(1 core check fails: test_tiny; the notebook earns what works)" in capsys.readouterr().out
    )


def test_the_built_notebooks_name_their_assignment():
    for folder in (layout().release, layout().solved):
        nb = json.loads((folder / "rlhf_ppo.ipynb").read_text())
        assert nb["metadata"]["mlbook"]["assignment"] == "rlhf_ppo", folder
    appendix = json.loads((layout().solved / "appendix_ddp.ipynb").read_text())
    assert "assignment" not in appendix["metadata"]["mlbook"]  # not an assignment
