"""Reading an ``Assignment`` from its one ``[tool.mlbook.assignments.<name>]`` table (config.py):
the chapter's, and a second book's (tests/assignment_support.py), whose grading is
tests/test_second_assignment.py."""

import importlib

import assignment_support as tiny
import pytest
from mlbook_tools import hub_config
from mlbook_tools.config import assignment, assignments, course_id, layout
from traitlets.config.loader import PyFileConfigLoader

pytestmark = pytest.mark.unit


@pytest.fixture
def book(tmp_path, monkeypatch):
    """The tiny book, and every command pointed at it (``$MLBOOK_ROOT``)."""
    tiny.write_book(tmp_path)
    monkeypatch.setenv("MLBOOK_ROOT", str(tmp_path))
    return tmp_path


def test_the_chapter_is_the_default_and_its_values_are_what_its_tools_read():
    chapter = assignment()
    assert list(assignments()) == [chapter.name]
    L = layout()
    assert chapter.source(L.course).is_file() and chapter.release.is_file()
    assert chapter.release.parent == L.release and chapter.source(L.course).stem == chapter.name
    assert chapter.state(L.course) == L.course / ".mlbook_grading" / chapter.name
    assert chapter.checks.is_file() and hasattr(importlib.import_module(chapter.reference), "gae")
    # the course id read without running the course config is the one nbgrader reads by running it
    config = PyFileConfigLoader("nbgrader_config.py", path=str(L.course)).load_config()
    assert chapter.course_id == config.CourseDirectory.course_id


def test_a_second_book_reads_every_value_from_its_one_table(book):
    (only,) = assignments().values()
    assert assignment() == assignment(tiny.NAME) == only
    assert only.name == tiny.NAME and only.course_id == tiny.COURSE_ID
    assert only.checks == book / "tiny_checks.py" and only.reference == tiny.REFERENCE
    assert only.release == book / "release" / f"{tiny.NAME}.ipynb"
    assert only.source(book / "course") == book / "course" / "source" / "tiny" / "tiny.ipynb"
    assert only.state(book / "course") == book / "course" / ".mlbook_grading" / "tiny"


def test_the_first_table_is_the_default(book):
    second = tiny.PYPROJECT.replace(f"assignments.{tiny.NAME}]", "assignments.other]")
    (book / "pyproject.toml").write_text(second + "\n" + tiny.PYPROJECT.split("\n\n")[1])
    assert list(assignments()) == ["other", tiny.NAME]
    assert assignment().name == "other" and assignment(tiny.NAME).name == tiny.NAME


def test_an_unknown_name_a_bad_table_or_none_at_all_is_one_clear_error(book):
    with pytest.raises(ValueError, match=r"no assignment 'rlhf_ppo'.*configured: tiny"):
        assignment("rlhf_ppo")
    text = tiny.PYPROJECT
    (book / "pyproject.toml").write_text(text.replace("checks =", "check ="))
    with pytest.raises(
        ValueError, match=r"assignments.tiny.*unknown key\(s\) check; missing checks"
    ):
        assignment()
    (book / "pyproject.toml").write_text(text.split("\n\n")[0] + "\n")
    with pytest.raises(ValueError, match=r"no \[tool.mlbook.assignments.<name>\] table"):
        assignment()


def test_the_course_id_must_be_a_literal_in_the_course_config(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text(
        'c = get_config()\nc.CourseDirectory.course_id = "x-1"\n'
    )
    assert course_id(tmp_path) == "x-1"
    (tmp_path / "nbgrader_config.py").write_text("c.CourseDirectory.course_id = make_id()\n")
    with pytest.raises(ValueError, match="sets no c.CourseDirectory.course_id"):
        course_id(tmp_path)


def test_the_hub_names_the_course_by_the_assignments_course_id(book, tmp_path):
    hub_config.write_configs(tmp_path / "hub", "teacher", book / "course", ["ann"])
    for role in ("student", "instructor"):
        text = (tmp_path / "hub" / "etc" / role / "nbgrader_config.py").read_text()
        assert f"c.CourseDirectory.course_id = {tiny.COURSE_ID!r}" in text, text
