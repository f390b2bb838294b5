"""What grade-class knows about a submission it could not grade (flags.py), as each place says it:
grade-class's line, formgrader's API and Autograde answer, the submission page and the feedback page.
(tests/test_browser.py reads the same flags in formgrader as an instructor sees them.)"""

import json

import nbformat
import pytest
from mlbook_tools import flags
from mlbook_tools.classentry import ClassEntry, Outcome
from mlbook_tools.classreport import entry_line
from mlbook_tools.feedback import CoreExtraSummary
from mlbook_tools.result import CellGrade, GradingResult

NB = "rlhf_ppo"

pytestmark = pytest.mark.unit


def _result(error=None) -> GradingResult:
    """Three core checks (one passed), one extra-credit check, three core and two extra written
    answers awaiting a person."""
    grades = {
        gid: CellGrade(gid, score, top)
        for gid, score, top in (
            ("test_a", 0.0, 2.0),
            ("test_b", 1.0, 1.0),
            ("test_c", 0.0, 1.0),
            ("ex_pairwise_loss_test", 0.0, 1.0),
        )
    }
    written = {"w1": 1.0, "w2": 1.0, "w3": 1.0, "ex1": 2.5, "ex2": 2.5}
    return GradingResult(
        grades,
        written,
        problems=[error] if error else [],
        output="",
        seconds=3.0,
        cell_errors={},
        error=error,
    )


def _graded(student, error=None) -> ClassEntry:
    return ClassEntry(student, Outcome.GRADED, _result(error), fingerprint="fp")


def test_refused_and_unreadable_are_told_apart_in_oneentry_line():
    refused = flags.from_error("too large: 2001 cells (limit 2000), 1.0 MB; nothing was run")
    unreadable = flags.from_error(
        "the file is not a readable notebook (JSONDecodeError: it is empty)"
    )
    assert refused.kind == "refused" and unreadable.kind == "unreadable"
    for flag in (refused, unreadable):
        line = flag.line()
        assert "\n" not in line and line.startswith(flag.kind.upper() + ": ")
        assert "grade-class" in flag.todo  # what to do, said
        assert "scored 0" in flag.reason  # never a silent 0
    assert "Clear" in refused.todo or "clear" in refused.todo
    shown = flags.from_error("x\n\x1b[2Jy").reason  # one printable line: no newline, no escape
    assert shown.startswith("x \ufffd[2Jy") and "\x1b" not in shown


def test_grade_class_line_flags_a_refused_file_and_names_failing_checks():
    line = entry_line(_graded("carol", "too large: 2001 cells (limit 2000); nothing was run"), NB)
    assert "REFUSED: too large" in line and "awaiting manual grading" not in line
    graded = entry_line(_graded("dave"), NB)
    assert "failed: test_a, test_c" in graded  # the failing core checks by name, not a count
    assert "ex_pairwise_loss_test" not in graded  # extra credit is not a failure
    assert "awaiting manual grading: 5" in graded
    unreadable = entry_line(_graded("bob", "the file is not a readable notebook (x)"), NB)
    assert "UNREADABLE" in unreadable and "awaiting" not in unreadable


def test_flag_of_reads_the_folder_and_the_saved_state(tmp_path):
    course = tmp_path
    folder = course / "submitted" / "alice" / NB
    folder.mkdir(parents=True)
    (folder / f"{NB}-Copy1.ipynb").write_text("{}")
    flag = flags.flag_of(course, NB, "alice")
    assert flag.kind == "misnamed" and f"{NB}-Copy1.ipynb" in flag.reason
    assert f"Rename the notebook to {NB}.ipynb" in flag.todo
    state = course / ".mlbook_grading" / NB
    state.mkdir(parents=True)
    (state / "alice.json").write_text(json.dumps({"misnamed": [f"{NB}-Copy1.ipynb"]}))
    (folder / f"{NB}-Copy1.ipynb").rename(folder / f"{NB}.ipynb")
    assert flags.flag_of(course, NB, "alice") is None  # renamed: it needs grading, not a flag
    (state / "bob.json").write_text(_result("too large: 30.0 MB (limit 20.0 MB)").to_json())
    (state / "carol.json").write_text(_result().to_json())
    (state / "dora.json").write_text(json.dumps({"score": 10}))  # not a result: nothing saved
    assert flags.flag_of(course, NB, "bob").kind == "refused"
    assert flags.flag_of(course, NB, "carol") is None
    assert flags.flag_of(course, NB, "dora") is None
    assert set(flags.flags_of(course, NB, ["alice", "bob", "carol", "dora"])) == {"bob"}


def test_live_flag_checks_the_file_as_it_is_now(tmp_path):
    pytest.importorskip("nbgrader")
    from mlbook_tools.formgrader_guard import live_flag

    course = tmp_path
    folder = course / "submitted" / "carol" / NB
    folder.mkdir(parents=True)
    state = course / ".mlbook_grading" / NB
    state.mkdir(parents=True)
    (state / "carol.json").write_text(_result("too large: 2001 cells").to_json())
    cells = [nbformat.v4.new_code_cell("x = 1") for _ in range(2001)]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"{NB}.ipynb")
    flag = live_flag(course, NB, "carol")
    assert flag.kind == "refused" and "2001 cells" in flag.reason
    nbformat.write(nbformat.v4.new_notebook(cells=cells[:3]), folder / f"{NB}.ipynb")
    assert live_flag(course, NB, "carol") is None  # handed in again: Autograde grades it


def test_feedback_says_not_graded_never_awaiting():
    nb = nbformat.v4.new_notebook()
    for gid, kind in (("test_a", "code"), ("ex1_larger_beta", "markdown")):
        cell = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)("")
        cell.metadata["nbgrader"] = {
            "grade": True,
            "grade_id": gid,
            "points": 2 if kind == "code" else 0,
            "score": 0.0,
            "needs_manual_grade": kind == "markdown",
            "solution": kind == "markdown",
        }
        nb.cells.append(cell)
    plain, _ = CoreExtraSummary().preprocess(nbformat.from_dict(json.loads(json.dumps(nb))), {})
    assert "Awaiting manual grading: ex1_larger_beta" in plain.cells[0].source
    nb.metadata["mlbook"] = {"flag": flags.from_error("too large: 2001 cells").to_dict()}
    flagged, _ = CoreExtraSummary().preprocess(nb, {})
    head = flagged.cells[0].source
    assert head.startswith("**Not graded (refused):** too large: 2001 cells")
    assert "Awaiting" not in head and "Clear its outputs" in head
    assert not any(c.metadata["nbgrader"].get("needs_manual_grade") for c in flagged.cells[1:])


def test_written_extra_max_of_the_course():
    from mlbook_tools.config import layout

    course = layout().course
    # the source's written answers: ex1 1, ex2 1, ex3 2, ex4 1, ex5 1 (metadata.mlbook.extra_credit)
    nb = nbformat.read(course / "source" / NB / f"{NB}.ipynb", as_version=4)
    expected = sum(
        float(c.metadata.get("mlbook", {}).get("extra_credit", 0))
        for c in nb.cells
        if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("grade")
    )
    assert expected > 0 and flags.written_extra_max(course, NB) == expected


def test_grade_report_of_an_unreadable_file_names_it_once_and_awaits_nothing(tmp_path, capsys):
    """`mlbook grade` on a missing file named its path three times; on an unreadable one it said
    "awaiting manual grading: 5 answers" for answers nobody will read."""
    from mlbook_tools.cli import main, print_report
    from mlbook_tools.config import layout
    from mlbook_tools.errors import CannotGrade
    from mlbook_tools.grading import refused_result

    missing = tmp_path / "nowhere.ipynb"
    code = main(
        ["grade", str(missing)]
    )  # the command in-process: nothing to grade, nothing started
    err = capsys.readouterr().err
    assert code == 1 and err.count(str(missing)) == 1, err
    assert "No such file or directory" in err
    source = nbformat.read(layout().course / "source" / NB / f"{NB}.ipynb", as_version=4)
    print_report(refused_result(source, CannotGrade("the file is not a readable notebook (x)")))
    said = capsys.readouterr().out
    assert "cannot grade this file" in said and "awaiting" not in said, said
