"""grade-class's worker (``classgrade_worker._grade_one``) and its parent thread (``drive``), in-process: what
a worker answers when the engine fails (not a grade: "internal", with the reason and a trace),
when a submission is past a bound (refused, graded 0 in a second), and what the parent does with an
"internal" answer (a fresh worker, one retry, then UNGRADED with the reason), and what `mlbook
grade` says of a file that is not a notebook. No sandbox starts:
the engine is replaced where it would start one; the parent's worker is a small stand-in process.
"""

import json
import queue
import sys

import nbformat
import pytest
from mlbook_tools import classgrade_worker, grading
from mlbook_tools.classentry import Outcome, WorkerReply
from mlbook_tools.classreport import entry_line
from mlbook_tools.config import layout
from mlbook_tools.limits import DEFAULT
from ppo_checks import CHECKS

pytestmark = pytest.mark.unit

ROOT = layout().root
NB = "rlhf_ppo"
SOURCE = ROOT / "autograde" / "source" / NB / f"{NB}.ipynb"
RELEASE = layout().release / f"{NB}.ipynb"
CORE = {g: c.points for g, c in CHECKS.items() if not c.extra}  # the six named tests


@pytest.fixture(scope="module")
def source_nb():
    return nbformat.read(SOURCE, as_version=4)


def _init(**limits):
    return {"limits": DEFAULT.replace(**limits) if limits else DEFAULT, "trusted": True}


def test_an_engine_failure_is_internal_with_its_reason_and_trace(source_nb, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("the engine broke " + "x" * 1000)

    monkeypatch.setattr(grading, "grade_submission", broken)
    reply = classgrade_worker._grade_one("ann", str(RELEASE), source_nb, None, b"s", _init())
    assert reply.status == "internal", reply
    assert reply.why.startswith("RuntimeError: the engine broke") and len(reply.why) < 600
    assert "broken" in reply.trace and len(reply.trace) <= 2000
    assert reply.result is None and reply.notebook is None  # nothing that could be recorded
    sent = json.loads(reply.to_json())
    assert "result" not in sent and "notebook" not in sent
    assert WorkerReply.from_json(reply.to_json()) == reply  # what the parent reads back


def test_an_unreadable_path_is_internal_not_a_grade(source_nb):
    reply = classgrade_worker._grade_one(
        "ann", "/nonexistent/x.ipynb", source_nb, None, b"s", _init()
    )
    assert reply.status == "internal" and "No such file" in reply.why, reply


def test_a_submission_past_a_bound_is_refused_without_grading(source_nb, monkeypatch):
    monkeypatch.setattr(grading, "grade_submission", lambda *a, **k: pytest.fail("graded"))
    small = _init(max_notebook_bytes=1000)
    reply = classgrade_worker._grade_one("ann", str(RELEASE), source_nb, None, b"s", small)
    assert reply.status == "graded", reply
    result = reply.result
    assert result.core.score == 0 and any("too large" in p for p in result.problems), result
    assert nbformat.reads(reply.notebook, as_version=4).cells  # the autograded notebook
    back = WorkerReply.from_json(reply.to_json())  # the line the parent reads, checked
    assert back.result.to_dict() == result.to_dict() and back.notebook == reply.notebook


INTERNAL = (  # a stand-in worker: takes the init line, then answers each job "internal"
    "import json, sys\n"
    "sys.stdin.readline()\n"
    "for line in sys.stdin:\n"
    "    print({started!r}, flush=True)\n"
    "    print(json.dumps({{'status': 'internal', 'why': 'RuntimeError: the engine broke',"
    " 'trace': 'Traceback ...'}}), flush=True)\n"
)


def test_the_parent_retries_an_internal_answer_once_then_reports_it_ungraded(monkeypatch):
    started = []

    class Worker(classgrade_worker._Worker):
        def __init__(self, init):
            started.append(1)
            super().__init__(init)

    monkeypatch.setattr(
        classgrade_worker,
        "WORKER",
        [sys.executable, "-c", INTERNAL.format(started=classgrade_worker.STARTED)],
    )
    monkeypatch.setattr(classgrade_worker, "_Worker", Worker)
    jobs, done = queue.Queue(), queue.Queue()
    jobs.put(("ann", "/x.ipynb", "fp", 0))
    classgrade_worker.drive({"init": True}, jobs, done, start=30, backstop=30, attempts=2)
    got, notebook = done.get_nowait()
    assert (got.student, got.fingerprint) == ("ann", "fp") and notebook is None, got
    assert got.outcome is Outcome.UNGRADED and got.result is None and not got.recorded
    assert got.problems == ("UNGRADED after 2 attempts: RuntimeError: the engine broke",)
    assert got.trace == "Traceback ..." and len(started) == 2  # a fresh worker for the retry
    assert done.empty() and jobs.empty()
    assert (
        entry_line(got)
        == "ann                  UNGRADED after 2 attempts: RuntimeError: the engine broke"
    )


def test_mlbook_grade_reports_a_file_that_is_not_a_notebook(tmp_path, capsys):
    from mlbook_tools.cli import main

    bad = tmp_path / "submission.ipynb"
    bad.write_text("this is not a notebook {")
    assert main(["grade", str(bad), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["score"] == 0 and result["max_score"] == sum(CORE.values())
    assert "JSON" in result["error"] and set(CORE) <= set(result["grades"])
    assert main(["grade", str(bad)]) == 1 and "cannot grade this file" in capsys.readouterr().out
