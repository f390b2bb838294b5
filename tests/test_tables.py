"""``mlbook.tables``: the chapter's tables from columns and rows, not from Markdown text."""

import pytest

from mlbook.tables import markdown_table

pytestmark = pytest.mark.unit


def test_numbers_align_right_text_left_and_pipes_are_escaped():
    text = markdown_table(
        ["step", "token", "share"], [[1, "a|b", "12%"], [10, "<code>x</code>", "-0.5"]]
    )
    assert text.splitlines() == [
        "| step | token | share |",
        "|---:|---|---:|",
        "| 1 | a&#124;b | 12% |",
        "| 10 | <code>x</code> | -0.5 |",
    ]


def test_explicit_alignment_and_bad_input_are_refused_with_the_reason():
    assert markdown_table(["", "a"], [["x", "1"]], align="ll").splitlines()[1] == "|---|---|"
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        markdown_table(["a", "b"], [["1"]])
    with pytest.raises(ValueError, match="align"):
        markdown_table(["a"], [["1"]], align="c")
    with pytest.raises(ValueError, match="one line"):
        markdown_table(["a"], [["1\n2"]])
