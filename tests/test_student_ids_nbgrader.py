"""nbgrader's own ``zip_collect``, with the course's config as ``new-course`` writes it (its file-name
pattern included; no sandbox), files only safe student ids
(tests/test_student_ids.py tests the collector and the other ways in, in-process)."""

import os
import sys

import pytest
from mlbook_tools.exchange import STUDENT_ID_RULE

pytestmark = pytest.mark.nbgrader

NB = "rlhf_ppo"


def test_nbgrader_zip_collect_files_only_safe_ids(tmp_path, monkeypatch):
    from mlbook_tools.course import new_course
    from mlbook_tools.grading import run_nbgrader

    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    course = new_course(tmp_path / "course")
    run_nbgrader(["generate_assignment", NB, "--force"], course)
    archive = course / "downloaded" / NB / "archive"
    archive.mkdir(parents=True)
    release = (course / "release" / NB / f"{NB}.ipynb").read_text()
    for student in ("alice", "x;=2+2", ".hidden"):  # the course's default names: <id>__<notebook>
        (archive / f"{student}__{NB}.ipynb").write_text(release)
    run = run_nbgrader(["zip_collect", NB], course)
    said = run.stdout + run.stderr
    filed = sorted(p.name for p in (course / "submitted").iterdir())
    assert filed == ["alice"], (filed, said)
    assert said.count("REFUSED") == 2 and STUDENT_ID_RULE in said, said
