"""The grading driver's pure parts, no sandbox (test_engine.py runs the catalog through one): the
plan restores locked cells and runs read-only cells whole, the seed repeats per student and test,
and a malformed reply is refused.
"""

import json

import grading_catalog as cat
import nbformat
import pytest
from mlbook_tools import driver
from mlbook_tools.config import layout
from nbcells import defines

pytestmark = pytest.mark.unit

ROOT = layout().root
SECRET = b"test-secret"


def test_driver_rejects_malformed_tensors():
    from mlbook_tools.inside import protocol

    bad = [
        {"dtype": "float32", "shape": [2, 2], "nbytes": 8},  # 4 floats need 16 bytes
        {"dtype": "object", "shape": [2, 2], "nbytes": 16},
        {"dtype": "float32", "shape": [-1, 4], "nbytes": 16},
        {"dtype": "float32", "shape": [2, 2.0], "nbytes": 16},
    ]
    for meta in bad:
        with pytest.raises(protocol.ProtocolError, match="malformed"):
            protocol.check_tensor_meta(meta)
    with pytest.raises(protocol.ProtocolError):  # a reply may not ask the driver to build anything
        driver._codec(None).decode({"module": {"type": "mlbook.x.Y"}}, [], [])
    remote = driver._codec(None).decode({"handle": 3, "type": "Liar"}, [], [])
    assert isinstance(remote, driver.Remote) and remote.handle == 3
    t = driver._codec(None).decode(
        {"tensor": 0}, [b"\0" * 16], [{"dtype": "float32", "shape": [2, 2], "nbytes": 16}]
    )
    assert type(t) is __import__("torch").Tensor and t.shape == (2, 2)


def test_seeds_differ_per_student_and_test_but_repeat():
    a = driver.check_seed(SECRET, "alice", cat.GAE)
    assert a == driver.check_seed(SECRET, "alice", cat.GAE)
    assert a != driver.check_seed(SECRET, "bob", cat.GAE) and a != driver.check_seed(
        SECRET, "alice", cat.CLIP
    )
    assert a != driver.check_seed(b"other course", "alice", cat.GAE)


def test_plan_restores_locked_cells_and_notes_damage():
    source_nb = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    nb = json.loads((ROOT / "chapters" / "rlhf_ppo.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "train_ppo" in defines("".join(cell["source"])):
            cell["source"] = "def train_ppo(*a, **k):\n    return []\n"
    plan = driver.make_plan(source_nb, json.dumps(nb))
    assert any("was edited" in p for p in plan.problems)
    trusted = "\n".join(src for _, src, trusted in plan.cells if trusted)
    assert "def train_ppo(" in trusted and "return []" not in trusted
    assert "BEGIN HIDDEN" not in trusted and "check_gae" not in trusted
    with pytest.raises(driver.CannotGrade):
        driver.make_plan(source_nb, "not json {")


def test_plan_runs_every_read_only_cell_whole_unless_the_notebook_flags_it():
    """No static filter: each read-only code cell of the source runs as written, in notebook order, unless
    the course tags it `demo` (metadata, so the reader sees no grader plumbing)."""
    source_nb = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    release = nbformat.read(ROOT / "chapters" / "rlhf_ppo.ipynb", as_version=4)
    plan = driver.make_plan(source_nb, nbformat.writes(release))
    planned = {gid: src for gid, src, _ in plan.cells}
    read_only = [
        c
        for c in source_nb.cells
        if c.cell_type == "code"
        and not c.metadata["nbgrader"].get("grade")
        and not c.metadata["nbgrader"].get("solution")
    ]
    for cell in read_only:
        gid = cell.metadata["nbgrader"]["grade_id"]
        if driver.is_demo_cell(cell):
            assert gid in plan.skipped and gid not in planned
        else:
            assert planned[gid] == cell.source, gid
    tagged = {c.metadata["nbgrader"]["grade_id"] for c in release.cells if driver.is_demo_cell(c)}
    assert set(plan.skipped) <= tagged  # the student's copy carries every tag the grader honours
    assert not [c for c in release.cells if driver.is_demo(c.source)]  # no flag line to read
    order = [c.metadata["nbgrader"]["grade_id"] for c in source_nb.cells]
    assert [order.index(g) for g in planned] == sorted(order.index(g) for g in planned)


def test_a_demonstration_answer_is_skipped_by_the_courses_tag_and_the_legacy_flag():
    """The course's `demo` tag skips an answer cell whatever the student's copy holds (a
    submission's metadata other than nbgrader's is never read); an answer cell without it runs, unless
    its first line is the flag earlier releases wrote."""
    source_nb = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    release = nbformat.read(ROOT / "chapters" / "rlhf_ppo.ipynb", as_version=4)
    cell = next(c for c in release.cells if c.metadata["nbgrader"]["grade_id"] == "ex4_demo")
    assert driver.DEMO_TAG in cell.metadata["tags"]
    assert "ex4_demo" in driver.make_plan(source_nb, nbformat.writes(release)).skipped
    cell.metadata["tags"].remove(driver.DEMO_TAG)
    cell.source = "x = 1"
    assert "ex4_demo" in driver.make_plan(source_nb, nbformat.writes(release)).skipped
    answer = next(c for c in release.cells if c.metadata["nbgrader"]["grade_id"] == "gae")
    answer.source = "x = 2"
    plan = driver.make_plan(source_nb, nbformat.writes(release))
    assert "gae" not in plan.skipped and ("gae", "x = 2", False) in plan.cells
    answer.source = driver.DEMO_FLAG + "\nx = 2"
    assert "gae" in driver.make_plan(source_nb, nbformat.writes(release)).skipped
