"""Each nbgrader plugin of the course (mlbook_tools/plugins.py) on a three-cell notebook built here with
nbformat, as nbgrader's own tests do: an answer cell, a core test with a hidden region, an
extra-credit test. In-process (nbgrader's preprocessors and its SQLite gradebook API), no nbgrader
command, no sandbox: the engine's grading is a stand-in returning a fixed ``GradingResult``; what is
tested is what each plugin does around it. The real ``nbgrader autograde`` through the sandbox is
test_bounds.py's and test_instructor_paths.py's.
"""

import io
import json

import gradebook_support
import nbformat
import pytest
from mlbook_tools import plugins
from mlbook_tools.config import layout
from mlbook_tools.feedback import HIDDEN_BEGIN, HIDDEN_END
from mlbook_tools.result import CellGrade, GradingResult
from nbgrader.api import Gradebook
from nbgrader.preprocessors import SaveCells
from notebook_support import cell
from traitlets.config import Config, Configurable

pytestmark = pytest.mark.unit

v4 = nbformat.v4
NB = "three"  # the assignment and its one notebook
VISIBLE = "assert double(1) == 2"
HIDDEN = "assert double(-3) == -6  # the hidden test"


def three_cells(answer: str = "def double(x):\n    return 2 * x"):
    """The answer, its core test (2 points, a hidden region) and an extra-credit test (0 nbgrader
    points; 1 point of extra credit, as ``mlbook build`` states it)."""
    test = f"{VISIBLE}\n{HIDDEN_BEGIN}\n{HIDDEN}\n{HIDDEN_END}"
    extra = cell("code", "assert double(0.5) == 1.0", "ex_double", grade=True, points=0)
    extra.metadata["mlbook"] = {"extra_credit": 1.0}
    return v4.new_notebook(
        cells=[
            cell("code", answer, "answer_double", solution=True),
            cell("code", test, "test_double", grade=True, points=2),
            extra,
        ]
    )


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course folder: the source and release notebooks, a gradebook that knows the assignment."""
    for folder in ("source", "release"):
        (tmp_path / folder / NB).mkdir(parents=True)
        nbformat.write(three_cells(), tmp_path / folder / NB / f"{NB}.ipynb")
    (tmp_path / "autograded" / "ann" / NB).mkdir(parents=True)
    gradebook_support.in_process(monkeypatch)  # no alembic subprocess
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(db) as gb:
        gb.add_assignment(NB)
    resources = {"nbgrader": {"db_url": db, "assignment": NB, "notebook": NB}}
    SaveCells().preprocess(three_cells(), resources)  # as generate_assignment records the cells
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _resources(course, student="ann"):
    return {
        "nbgrader": {
            "db_url": f"sqlite:///{course / 'gradebook.db'}",
            "assignment": NB,
            "notebook": NB,
            "student": student,
        },
        "metadata": {"path": str(course / "autograded" / student / NB)},
    }


GRADED = GradingResult(
    {
        "test_double": CellGrade("test_double", 0.0, 2.0, "double(-3) is 6"),
        "ex_double": CellGrade("ex_double", 1.0, 1.0, "passed"),
    },
    problems=["a note for the instructor <img src=/logout>"],
)


# ------------------------------------------------------------------------------ SandboxedExecute


def test_sandboxed_execute_writes_each_verdict_and_never_the_hidden_test(course, monkeypatch):
    calls = []

    def grade_submission(text, source_nb, checks, secret, student, **kw):
        calls.append((nbformat.reads(text, as_version=4), student, kw))
        return GRADED, None

    monkeypatch.setattr(plugins, "grade_submission", grade_submission)
    monkeypatch.setattr(plugins, "load_course", lambda root, a: (three_cells(), None, b"s"))
    monkeypatch.setenv("MLBOOK_TRUSTED", "1")  # no sandbox asked for: the engine is the stand-in
    pre = plugins.SandboxedExecute(config=Config({"SandboxedExecute": {"budget": 7.0}}))
    nb, res = pre.preprocess(three_cells(), _resources(course))
    (student_nb, student, kw) = calls[0]
    assert student == "ann" and kw["limits"].budget_seconds == 7.0
    assert [c.source for c in student_nb.cells] == [c.source for c in three_cells().cells]
    notes, answer, test, extra = nb.cells
    assert notes.cell_type == "markdown" and "&lt;img src=/logout&gt;" in notes.source
    assert "<img" not in notes.source
    assert answer.outputs == [] and answer.source.startswith("def double")
    assert HIDDEN not in test.source and HIDDEN_BEGIN not in test.source and VISIBLE in test.source
    (out,) = test.outputs
    assert out.output_type == "error" and out.evalue == "double(-3) is 6"
    assert extra.outputs[0].text == "passed (1 / 1)\n"
    assert res["mlbook_grades"] is GRADED.grades
    assert nb.metadata["mlbook"] == {"graded_by": "nbgrader autograde through the sandboxed engine"}


def test_sandboxed_execute_grades_nothing_of_a_refused_submission(course, monkeypatch):
    monkeypatch.setattr(plugins, "grade_submission", lambda *a, **k: pytest.fail("graded"))
    monkeypatch.setattr(plugins, "load_course", lambda root, a: (three_cells(), None, b"s"))
    refused = three_cells()
    refused.metadata["mlbook"] = {plugins.REFUSED: "too large: 60 MB (the limit is 50 MB)"}
    nb, res = plugins.SandboxedExecute().preprocess(refused, _resources(course))
    assert {g: v.score for g, v in res["mlbook_grades"].items()} == {
        "test_double": 0.0,
        "ex_double": 0.0,
    }
    assert "too large: 60 MB" in nb.cells[0].source  # the grading note
    assert "not graded: too large" in nb.cells[2].outputs[0].evalue


def test_sandboxed_execute_refuses_unknown_limits():
    from mlbook_tools.limits import UnknownLimit

    with pytest.raises(UnknownLimit, match="unknown grading limit 'memory_byte'"):
        plugins.SandboxedExecute(limits={"memory_byte": 1})


# ------------------------------------------------------------------------- BoundedNotebookExporter


class _Parent(Configurable):
    """nbgrader's converter app, as far as the plugins read it: its course folder, whether it sanitizes."""

    def __init__(self, root, sanitizing=True):
        super().__init__()
        self.coursedir = type("CourseDirectory", (), {"root": str(root)})()
        self._sanitizing = sanitizing


def _export(course, nb_text: str, limits=None, sanitizing=True):
    config = Config({"SandboxedExecute": {"limits": limits or {}}})
    exporter = plugins.BoundedNotebookExporter(config=config, parent=None)
    exporter.parent = _Parent(course, sanitizing)  # nbgrader's converter app, as autograde sets it
    out, _ = exporter.from_file(
        io.BytesIO(nb_text.encode()), resources={"nbgrader": {"assignment": NB, "notebook": NB}}
    )
    return nbformat.reads(out, as_version=4)


def test_bounded_exporter_reads_a_notebook_within_bounds_and_drops_student_written_marks(course):
    nb = three_cells()
    nb.metadata["mlbook"] = {plugins.REFUSED: "forged", plugins.LEFT_OUT: ["forged"], "mine": 1}
    read = _export(course, nbformat.writes(nb))
    assert [c.source for c in read.cells] == [c.source for c in nb.cells]
    assert read.metadata["mlbook"] == {"mine": 1}
    # generate_assignment's own reads (not sanitizing) keep what the course wrote
    assert (
        _export(course, nbformat.writes(nb), sanitizing=False).metadata["mlbook"][plugins.REFUSED]
        == "forged"
    )


def test_bounded_exporter_stands_the_release_in_for_a_notebook_past_a_bound(course):
    nb = three_cells(answer="x = 1\n" * 5000)
    read = _export(course, nbformat.writes(nb), limits={"max_source_bytes": 1000})
    assert read.cells[0].source == three_cells().cells[0].source  # the release's stub
    assert "too large" in read.metadata["mlbook"][plugins.REFUSED]


def test_bounded_exporter_leaves_out_stored_outputs_past_a_bound_and_says_so(course):
    nb = three_cells()
    nb.cells[0].outputs = [v4.new_output("stream", name="stdout", text="y" * 200_000)]
    read = _export(course, nbformat.writes(nb), limits={"max_output_bytes": 1000})
    assert read.cells[0].outputs == [] and read.cells[0].source == nb.cells[0].source
    assert read.metadata["mlbook"][plugins.LEFT_OUT], read.metadata


# ---------------------------------------------------------------------- SaveAutoGradesExtraCredit


def test_save_auto_grades_stores_extra_credit_apart_from_the_core_score(course):
    graded = three_cells()
    graded.cells[1].outputs = [
        v4.new_output("error", ename="AssertionError", evalue="no", traceback=[])
    ]
    graded.cells[2].outputs = [v4.new_output("stream", name="stdout", text="passed (1 / 1)\n")]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_student("ann")
        gb.add_submission(NB, "ann")
    resources = _resources(course)
    resources["mlbook_grades"] = GRADED.grades
    plugins.SaveAutoGradesExtraCredit().preprocess(graded, resources)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        core = gb.find_grade("test_double", NB, NB, "ann")
        extra = gb.find_grade("ex_double", NB, NB, "ann")
        assert (core.auto_score, core.extra_credit) == (0.0, None)
        assert (extra.auto_score, extra.extra_credit) == (0.0, 1.0)
        scores = GradingResult.from_submission(
            gb.find_submission(NB, "ann"), {"test_double": 2, "ex_double": 1}
        )
    assert (scores.core.score, scores.core.max_score, scores.extra.score) == (0.0, 2.0, 1.0)


# ---------------------------------------------------------------------------- CoreExtraCsvExport


def test_csv_export_keeps_core_and_extra_credit_apart_and_counts_the_unsubmitted(course):
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_student("ann", first_name="Ann")
        gb.add_student("bob")
        gb.add_submission(NB, "ann")
        core, extra = (gb.find_grade(g, NB, NB, "ann") for g in ("test_double", "ex_double"))
        core.auto_score, extra.auto_score, extra.extra_credit = 2.0, 0.0, 1.0
        core.needs_manual_grade = extra.needs_manual_grade = False  # as autograde leaves them
        gb.db.commit()
        plugins.CoreExtraCsvExport(to=str(course / "grades.csv"), parent=_Parent(course)).export(gb)
    rows = {r["student_id"]: r for r in __import__("csv").DictReader(open(course / "grades.csv"))}
    ann, bob = rows["ann"], rows["bob"]
    assert (ann["score"], ann["max_score"], ann["extra_credit"], ann["extra_credit_max"]) == (
        "2.0",
        "2.0",
        "1.0",
        "1.0",
    )
    assert ann["status"] == "graded" and ann["first_name"] == "Ann"
    assert (bob["score"], bob["max_score"], bob["status"]) == ("0.0", "2.0", "no submission")
    assert list(ann)[: len(plugins.STANDARD_COLUMNS)] == plugins.STANDARD_COLUMNS
    assert json.dumps(rows)  # plain text, no formula (test_export.py tries hostile names)


# the same on the solved chapter, read from a file as the Autograde button reads it


def test_a_student_cannot_write_the_refusal_mark(tmp_path):
    nb = nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4)
    nb.metadata["mlbook"] = {plugins.REFUSED: "too large: forged"}
    path = tmp_path / "forged.ipynb"
    nbformat.write(nb, path)
    text, _ = plugins.BoundedNotebookExporter(parent=_Parent(tmp_path)).from_filename(str(path))
    assert plugins.REFUSED not in json.loads(text)["metadata"].get("mlbook", {})


def test_the_autograde_path_carries_what_was_left_out_to_the_grading_notes(tmp_path):
    """The Autograde button reads through the exporter: what it left out reaches the notes (a
    student's own forged mark does not)."""
    nb = nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4)
    nb.metadata["mlbook"] = {plugins.LEFT_OUT: ["forged"]}
    nb.cells[0].metadata["colab"] = json.loads("[" * 80 + "]" * 80)
    path = tmp_path / "deep.ipynb"
    nbformat.write(nb, path)
    text, _ = plugins.BoundedNotebookExporter(parent=_Parent(tmp_path)).from_filename(str(path))
    notes = json.loads(text)["metadata"]["mlbook"][plugins.LEFT_OUT]
    assert notes and "forged" not in notes and all("left out" in n for n in notes), notes
