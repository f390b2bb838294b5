"""What "Check your work" and ``mlbook.handin`` say (pure functions on notebook files)."""

import json

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
