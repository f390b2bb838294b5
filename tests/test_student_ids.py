"""Student ids outside the documented safe set (``exchange.STUDENT_ID``) are refused on every way in.

Collection through the exchange (tests/test_exchange.py) and ``mlbook grade-class`` refuse them; so do
``nbgrader zip_collect`` (the course's ``SafeIdCollector``), ``nbgrader autograde`` (the course's
``SandboxedExecute``) and formgrader's Autograde button (``formgrader_guard.SafeIdAutograde``), each
with a message that states the rule. No root, no sandbox: the refusals come before either matters
(test_student_ids_nbgrader.py runs nbgrader's own zip_collect).
"""

import json
import logging

import pytest
from mlbook_tools import formgrader_guard as guard
from mlbook_tools.exchange import STUDENT_ID_RULE, SafeIdCollector

NB = "rlhf_ppo"
pytestmark = pytest.mark.unit

UNSAFE = ["x;=2+2", ".hidden", "-rf", "a<img src=x>", "a\x1b[2Jb", "..", "a" * 65]


def _collector() -> SafeIdCollector:
    return SafeIdCollector(named_regexp=r".*/(?P<student_id>[^/]+)__(?P<file_id>[^/]+\.ipynb)$")


def test_zip_collect_reader_keeps_safe_ids(tmp_path):
    info = _collector().collect(str(tmp_path / f"alice.b-2__{NB}.ipynb"))
    assert info == {"student_id": "alice.b-2", "file_id": f"{NB}.ipynb"}


@pytest.mark.parametrize("student", UNSAFE)
def test_zip_collect_reader_refuses_unsafe_ids_and_says_why(tmp_path, caplog, student):
    collector = _collector()
    with caplog.at_level(logging.ERROR, logger=collector.log.name):
        assert collector.collect(str(tmp_path / f"{student}__{NB}.ipynb")) is None
    said = caplog.text
    assert "REFUSED" in said and "not collected" in said and STUDENT_ID_RULE in said, said
    assert "\x1b" not in said


@pytest.mark.parametrize("student", ["x;=2+2", "a<img src=x>"])
def test_nbgrader_autograde_refuses_an_unsafe_id_before_anything_runs(student):
    import nbformat
    from mlbook_tools.plugins import SandboxedExecute

    resources = {"nbgrader": {"student": student, "assignment": NB}, "metadata": {"path": "."}}
    with pytest.raises(ValueError, match="not autograded: student id .* is not allowed"):
        SandboxedExecute().preprocess(nbformat.v4.new_notebook(), resources)


class _Request:
    """What the Autograde button's handler touches, with nbgrader's API behind it a recorder."""

    def __init__(self, course):
        self.written, self.graded = [], []
        self.settings = {"nbgrader_bad_setup": False}
        self.coursedir = type("Dir", (), {"root": str(course)})()  # a course with no flags
        self.xsrf_token = "t"
        self.current_user = "instructor"
        self.api = type(
            "Api", (), {"autograde": lambda _, a, s: self.graded.append((a, s)) or {}}
        )()

    def write(self, text):
        self.written.append(text)


@pytest.mark.parametrize("student", UNSAFE)
def test_the_autograde_button_refuses_an_unsafe_id_without_echoing_it(student, tmp_path):
    assert guard.REPLACE[guard.api.AutogradeHandler] is guard.SafeIdAutograde
    fake = _Request(tmp_path)
    guard.SafeIdAutograde.post.__wrapped__.__wrapped__.__wrapped__(fake, NB, student)
    assert fake.graded == []  # nbgrader's autograde (gradebook entry, folders) never reached
    reply = json.loads(fake.written[0])
    assert reply["success"] is False and STUDENT_ID_RULE in reply["error"]
    assert student not in reply["error"] and "<" not in reply["error"]


def test_the_autograde_button_grades_a_safe_id(tmp_path):
    fake = _Request(tmp_path)
    guard.SafeIdAutograde.post.__wrapped__.__wrapped__.__wrapped__(fake, NB, "alice")
    assert fake.graded == [(NB, "alice")]


def test_harden_puts_the_safe_autograde_route_in_place():
    from nbgrader.server_extensions.formgrader import apihandlers as api

    guard.harden(type("App", (), {"default_router": type("R", (), {"rules": []})()})())
    targets = [spec[1] for spec in api.default_handlers if isinstance(spec, tuple)]
    assert guard.SafeIdAutograde in targets and api.AutogradeHandler not in targets
