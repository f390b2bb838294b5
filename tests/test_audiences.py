"""One source, two renderings (``mlbook build``): the course's notebook speaks to a course student,
the self-paced copy in chapters/ keeps its own text, and the pages an instructor or a course student
reads (formgrader, feedback: the autograded notebook) carry no self-paced instruction.

Pure reads of the fragments and the generated files (test_audiences_release.py asks real
``nbgrader generate_assignment`` for the course's release)."""

import re

import nbformat
import pytest
from audience_support import (
    SELF_PACED_ONLY,
    assert_course_text,
    assert_self_paced_text,
    prose,
)
from mlbook_tools import build, driver, feedback, grading
from mlbook_tools.config import layout

pytestmark = pytest.mark.unit


def test_each_rendering_holds_its_own_instructions_only():
    assert_course_text(build.source_notebook("rlhf_ppo", build.COURSE), "the course rendering")
    assert_self_paced_text(
        build.source_notebook("rlhf_ppo", build.SELF_PACED), "the self-paced rendering"
    )


def test_the_generated_files_are_the_right_renderings():
    L = layout()
    course_source = nbformat.read(L.course / "source/rlhf_ppo/rlhf_ppo.ipynb", as_version=4)
    assert_course_text(course_source, "autograde/source (formgrader, every course release)")
    assert_self_paced_text(nbformat.read(L.release / "rlhf_ppo.ipynb", as_version=4), "chapters/")
    assert re.search(r"mlbook start", (L.release / "rlhf_ppo.py").read_text())


def test_both_renderings_share_every_cell_but_the_instructions():
    """Same grade ids and code everywhere: the grader treats a notebook of either kind alike."""
    course = build.source_notebook("rlhf_ppo", build.COURSE)
    alone = build.source_notebook("rlhf_ppo", build.SELF_PACED)

    def shared(nb):
        return [
            (c.id, c.cell_type, c.source)
            for c in nb.cells
            if not set(c.metadata.get("tags", [])) & set(build.AUDIENCES)
        ]

    assert shared(course) == shared(alone)
    code = [c for nb in (course, alone) for c in nb.cells if c.cell_type == "code"]
    assert not [c.id for c in code if set(c.metadata.get("tags", [])) & set(build.AUDIENCES)]
    only = {c.id for c in course.cells} ^ {c.id for c in alone.cells}
    assert only, "no cell differs: the renderings are one"
    with pytest.raises(ValueError, match="audience"):
        build.source_notebook("rlhf_ppo", "teacher")


def test_code_or_both_tags_for_one_audience_fail_the_build(fragments):
    path = fragments / "75_check_your_work.py"
    text = path.read_text()
    path.write_text(text.replace('# %% tags=["student-instructions"]\n', '# %% tags=["course"]\n'))
    with pytest.raises(ValueError, match="code tagged for one audience"):
        build.source_notebook("rlhf_ppo")
    path.write_text(text.replace('"student-instructions", "course"]', '"course", "self-paced"]'))
    with pytest.raises(ValueError, match="tagged both"):
        build.source_notebook("rlhf_ppo", build.SELF_PACED)


def test_feedback_and_formgrader_pages_carry_no_self_paced_instruction():
    """The autograded notebook (what formgrader and the feedback page show) follows the course's
    source, even for a self-paced copy handed in to a course: its own instruction cells carry
    grade ids the course does not have, and are left out."""
    L = layout()
    source = nbformat.read(L.course / "source/rlhf_ppo/rlhf_ppo.ipynb", as_version=4)
    solo = (L.release / "rlhf_ppo.ipynb").read_text()
    plan = driver.make_plan(source, solo)
    result = grading.refused_result(source, ValueError("not graded in this test"))
    page = feedback.autograded_notebook(source, plan, result)
    text = prose(page)
    assert not [w for w in SELF_PACED_ONLY if w in text]
    assert "Assignments tab" in text
