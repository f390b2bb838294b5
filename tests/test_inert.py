"""inert.py's one rule for a student's cell (``sanitize_cell``), on small nbformat notebooks
(nbgrader's own style): what it keeps, and that both autograded notebooks (``mlbook grade-class``'s
and the Autograde button's) keep the same of a cell the student added."""

import copy

import nbformat
import pytest
from mlbook_tools.inert import capped, sanitize_cell
from mlbook_tools.limits import DEFAULT
from mlbook_tools.plugins import InertStudentCells

pytestmark = pytest.mark.unit

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def _added_cells():
    """A code cell with active outputs and a markdown cell with an SVG, a PNG and a missing image."""
    v4 = nbformat.v4
    code = v4.new_code_cell(
        "print(1)",
        metadata={"tags": ["<img src=x>"], "widgets": {"x": 1}},
        outputs=[
            v4.new_output("display_data", data={"text/html": "<script>x</script>"}),
            v4.new_output(
                "display_data",
                data={"text/plain": "\x1b[2Jplot", "image/png": PNG},
                metadata={"isolated": True},
            ),
            v4.new_output("stream", name="evil", text="z" * (DEFAULT.shown_chars + 5)),
        ],
    )
    text = "![a](attachment:a.png) ![b](attachment:b.svg) ![c](attachment:gone.png)"
    markdown = v4.new_markdown_cell(
        text,
        attachments={"a.png": {"image/png": PNG}, "b.svg": {"image/svg+xml": "<svg/>"}},
    )
    return [code, markdown]


def test_a_course_config_from_before_the_move_still_imports_the_preprocessor():
    """Course configs written before ``InertStudentCells`` joined plugins.py import it from inert.py.
    An ImportError there would make nbgrader drop the whole config, the sandbox with it: the old name
    still works (that inert.py alone loads no nbconvert: test_grade_startup, in a fresh interpreter)."""
    from mlbook_tools import inert

    assert inert.InertStudentCells is InertStudentCells
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        inert.NoSuchName  # noqa: B018


def test_an_added_cell_keeps_plain_text_and_rasters_and_no_metadata():
    code, markdown = _added_cells()
    sanitize_cell(code, added=True)
    sanitize_cell(markdown, added=True)
    assert code.metadata == {} and markdown.metadata == {}
    html, plot, stream = code.outputs
    assert html["data"] == {"text/plain": "[output not shown]"}
    assert plot["data"] == {"image/png": PNG, "text/plain": "\ufffd[2Jplot"} and not plot.metadata
    assert stream["name"] == "stdout" and stream["text"] == capped("z" * (DEFAULT.shown_chars + 5))
    assert stream["text"].endswith("\n... [5 more characters not shown]")
    assert set(markdown.attachments) == {"a.png", "b.svg", "gone.png"}  # every name the text uses
    assert markdown.attachments["a.png"] == {"image/png": PNG}
    assert list(markdown.attachments["b.svg"]) == ["image/png"]  # the SVG is gone: a blank PNG


def test_a_course_cell_keeps_its_nbgrader_metadata_only_and_the_caps_are_the_limits():
    cell = nbformat.v4.new_code_cell(
        "x = 1",
        metadata={"nbgrader": {"grade_id": "answer", "solution": True}, "tags": ["t"]},
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="abcdef")] * 5,
    )
    sanitize_cell(cell, added=False, limits=DEFAULT.replace(shown_chars=3, shown_cell_outputs=2))
    assert cell.metadata == {"nbgrader": {"grade_id": "answer", "solution": True}}
    assert [o["text"] for o in cell.outputs] == ["abc\n... [3 more characters not shown]"] * 2


def test_both_autograded_notebooks_keep_the_same_of_an_added_cell():
    """``feedback.autograded_notebook`` (grade-class) and ``InertStudentCells`` (the Autograde
    button) pass an added cell through the same ``sanitize_cell``: the same cell comes out."""
    from mlbook_tools import driver, feedback
    from mlbook_tools.config import layout
    from mlbook_tools.result import GradingResult

    source = nbformat.read(layout().course / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", 4)
    student = nbformat.read(layout().release / "rlhf_ppo.ipynb", as_version=4)
    student.cells[1:1] = _added_cells()
    plan = driver.make_plan(source, nbformat.writes(student))
    graded = feedback.autograded_notebook(source, plan, GradingResult(problems=[]))
    button, _ = InertStudentCells().preprocess(copy.deepcopy(student), {})

    def added(nb):
        return [
            (c.cell_type, c.source, c.get("outputs"), c.get("attachments"), c.metadata)
            for c in nb.cells
            if c.source.startswith(("print(1)", "![a]"))
        ]

    assert len(added(graded)) == 2 and added(graded) == added(button)
