"""The course's release as nbgrader makes it (what the hub releases, what `mlbook student-dist` ships)
speaks to a course student (tests/test_audiences.py checks the fragments and generated files)."""

import nbformat
import pytest
from audience_support import assert_course_text
from mlbook_tools import build

pytestmark = pytest.mark.nbgrader


def test_the_course_release_speaks_to_a_course_student():
    """What the hub releases and `mlbook student-dist` ships: nbgrader over autograde/source."""
    release = nbformat.reads(build.course_release("rlhf_ppo"), as_version=4)
    assert_course_text(release, "the course's release")
    assert release.metadata["title"] == "RLHF with PPO"
