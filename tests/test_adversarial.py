"""The adversarial catalog through the class grader, in one shared run (``mlbook grade-class``'s engine).

One course in a temporary folder gets an honest student (alice, the solved notebook), an untouched
release (bob) and every entry of ``adversarial_catalog.ENTRIES`` as a student of its own. The class
is graded once, with two workers and short deadlines; every assertion below reads that run:
no cheat gains a point, correct work loses nothing to output, warnings or a crash elsewhere,
nobody else's data (gradebook, config, secret, submissions, hidden tests) is touched or leaked,
no process of a submission outlives its grading, and the run completes for everyone.
"""

import copy
import hashlib
import json
import os
import pathlib
import shutil
import time

import adversarial_catalog as adv
import nbformat
import pytest
from mlbook_tools import driver, grading, sandbox
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores, run_nbgrader

ROOT = layout().root
NB = "rlhf_ppo"
TOKEN = (
    "zq7xk" + "TOKEN" + "93b"
)  # never written literally into a submission's output by the graders
POINTS = {adv.SHAPED: 2, adv.GAE: 2, adv.CLIP: 2, adv.VALUE: 1, adv.KL: 1, adv.TRAIN: 2}
LIMITS = {"CELL_SECONDS": 8.0, "CALL_SECONDS": 5.0, "sandbox.memory_bytes": 1536 * 1024**2}
BUDGET = (
    45.0  # per submission in these runs (slow entries use all of it; honest work needs ~6 s quiet)
)
BOUND = (
    BUDGET + driver.GRACE_SECONDS + 20
)  # what one submission may take, sandbox start-up included
WORKERS = 2

pytestmark = pytest.mark.skipif(
    sandbox.check_available() is not None, reason="bubblewrap cannot start here"
)


def _fill(text: str, course: pathlib.Path) -> str:
    return (
        text.replace("{COURSE}", str(course)).replace("{REPO}", str(ROOT)).replace("{TOKEN}", TOKEN)
    )


def build_submission(entry: dict, course: pathlib.Path) -> str:
    if entry.get("raw") is not None:
        return entry["raw"]
    solved, release = (
        ROOT / "solutions" / "notebooks" / f"{NB}.ipynb",
        course / "release" / NB / f"{NB}.ipynb",
    )
    base = solved if entry["base"] == "solved" else release
    nb = nbformat.read(base, as_version=4)
    cells = nb.cells
    for cell in cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in entry.get("cells", {}):
            cell.source = _fill(entry["cells"][gid], course)
        if gid == "AdaptiveKLController" and entry.get("append"):
            cell.source += "\n\n\n" + "\n\n".join(_fill(a, course) for a in entry["append"])
    for k, source in enumerate(
        entry.get("add", [])
    ):  # the student's own cells at the end, run as a whole
        body = "\n".join("    " + line for line in _fill(source, course).splitlines())
        cells.append(
            nbformat.v4.new_code_cell(f"def _attack_{k}():\n{body}\n\n\n_r{k} = _attack_{k}()\n")
        )
    damage = entry.get("damage") or ""
    what, _, target = damage.partition(":")
    index = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(cells)}
    if what == "duplicate":
        cells.insert(index[target] + 1, copy.deepcopy(cells[index[target]]))
    elif what == "delete":
        del cells[index[target]]
    elif what == "rename":
        cells[index[target]].metadata["nbgrader"]["grade_id"] = target + "_renamed"
    elif what == "strip":
        del cells[index[target]].metadata["nbgrader"]
    elif what == "fake_train_ppo":
        for cell in cells:
            if "def train_ppo(" in cell.source:
                cell.source = (
                    "from types import SimpleNamespace\n\n\ndef train_ppo(*a, steps=30, **k):\n"
                    "    return [SimpleNamespace(reward=float(i), kl=1.0) for i in range(steps)]\n"
                )
    elif what == "metadata_list":
        odd = nbformat.v4.new_code_cell("x_odd = 1")
        odd.metadata["nbgrader"] = []
        cells.append(odd)
    elif what == "surrogate":
        cells.append(nbformat.v4.new_markdown_cell("a lone surrogate: \ud800 here"))
    elif what == "blank_tests":
        for cell in cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                cell.source = "pass"
    for cell in cells:
        cell.pop("id", None)
    return json.dumps(nbformat.from_dict(nb))


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    course = tmp_path_factory.mktemp("advcourse")
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "autograde" / "source", course / "source")
    run_nbgrader(["generate_assignment", NB, "--force"], course)
    driver.course_secret(course)
    subs = {
        "alice": (ROOT / "solutions" / "notebooks" / f"{NB}.ipynb").read_text(),
        "bob": (course / "release" / NB / f"{NB}.ipynb").read_text(),
    }
    subs.update({name: build_submission(entry, course) for name, entry in adv.ENTRIES.items()})
    for student, text in subs.items():
        target = course / "submitted" / student / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        target.write_text(text)
    protected = [course / "nbgrader_config.py", course / driver.SECRET_FILE, course / "source" / NB / f"{NB}.ipynb",
                 *sorted(course.glob(f"submitted/*/{NB}/{NB}.ipynb"))]  # fmt: skip
    before = {p: _digest(p) for p in protected}
    files_before = {p for p in course.rglob("*")}
    t0, started = time.monotonic(), time.time()
    lines = []

    class Out:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    results = grade_class(
        course, NB, workers=WORKERS, progress=False, out=Out(), limits=LIMITS, budget=BUDGET
    )
    seconds = time.monotonic() - t0
    time.sleep(5)  # longer than the daemon entry waits before it strikes
    return dict(course=course, results=results, before=before, files_before=files_before, seconds=seconds, started=started,
                lines="".join(lines), subs=subs)  # fmt: skip


def _core(run, student):
    return read_scores(run["course"] / "gradebook.db", NB, student)


def test_catalog_is_big_enough_and_covers_every_class():
    kinds = {}
    for entry in adv.ENTRIES.values():
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    assert len(adv.ENTRIES) >= 50 and set(kinds) == set(adv.KINDS), kinds


def test_the_class_run_completes_for_everyone(run):
    students = {"alice", "bob", *adv.ENTRIES}
    assert set(run["results"]) == students
    for student in students:
        assert (run["course"] / "autograded" / student / NB / f"{NB}.ipynb").exists(), student
        scores = _core(run, student)  # every one has a gradebook entry
        assert scores["max_score"] == 10, student
        assert student in run["lines"]


def test_student_text_reaches_no_terminal_and_breaks_no_file(run):
    """Escape sequences in an error message are replaced before anything prints or stores them; a lone
    surrogate or odd metadata in a notebook still gives a readable autograded notebook and a grade."""
    assert "\x1b" not in run["lines"]
    for name in ("terminal_escapes", "lone_surrogate", "nbgrader_metadata_list"):
        path = run["course"] / "autograded" / name / NB / f"{NB}.ipynb"
        nb = nbformat.read(path, as_version=4)
        assert "\x1b" not in json.dumps(nb, ensure_ascii=False), name
        assert not run["results"][name].get("ungraded"), (
            name,
            run["results"][name].get("problems"),
        )


def test_honest_students_keep_their_scores(run):
    assert _core(run, "alice")["score"] == 10
    assert _core(run, "bob")["score"] == 0


@pytest.mark.parametrize("name", sorted(adv.ENTRIES))
def test_entry_gets_exactly_what_it_earned(run, name):
    entry = adv.ENTRIES[name]
    scores = _core(run, name)
    if entry.get("base") != "solved":
        assert scores["score"] == 0, (name, {k: g["score"] for k, g in scores["grades"].items()})
        return
    assert run["results"][name]["seconds"] <= BOUND, (
        name
    )  # the per-submission bound holds for everyone
    lost = entry.get("lost", [])
    if lost is None:  # slow entries: whatever they score, they finished within the bound (above)
        return
    for test, points in POINTS.items():
        want = 0 if test in lost else points
        assert scores["grades"][test]["score"] == want, (
            name,
            test,
            run["results"][name]["grades"][test]["message"],
        )


def test_nobody_elses_data_is_touched(run):
    course = run["course"]
    for path, digest in run["before"].items():
        assert _digest(path) == digest, f"{path} changed"
    created = {p for p in course.rglob("*")} - run["files_before"]
    allowed = ("autograded", ".mlbook_grading", "gradebook.db", "feedback", "grades.csv")
    strays = [p for p in created if not p.relative_to(course).parts[0].startswith(allowed)]
    assert not strays, strays
    assert not list(course.glob("pwned*"))
    cache = (
        pathlib.Path.home() / ".cache" / "mlbook"
    )  # the old grader's course cache, if any: untouched
    for path in (p for p in cache.rglob("*.py") if p.is_file()):
        assert "Execute.enabled = False" not in path.read_text(errors="replace"), path


def test_no_process_of_a_submission_outlives_the_grading(run):
    alive = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if TOKEN.encode() in (proc / "cmdline").read_bytes():
                    alive.append(proc.name)
            except OSError:
                pass
    assert not alive


def test_nothing_hidden_leaks_into_what_students_see(run):
    course = run["course"]
    secret = (course / driver.SECRET_FILE).read_text().strip()
    for nb_path in course.glob(f"autograded/*/{NB}/{NB}.ipynb"):
        text = nb_path.read_text()
        assert len(text) < 1_500_000, nb_path  # a 50 MB print is capped
        for leak in (secret, "_brute_gae", "BEGIN HIDDEN TESTS", "check_gae(", "_last_index_loop"):
            assert leak not in text, (nb_path, leak[:20])
    student = "read_hidden_tests_and_secret"
    run_nbgrader(["generate_feedback", NB, "--force", f"--student={student}"], course)
    html = (course / "feedback" / student / NB / f"{NB}.html").read_text()
    for leak in (secret, "_brute_gae", "BEGIN HIDDEN TESTS", "check_gae("):
        assert leak not in html
    assert "Core: 0 / 10" in html and "Extra credit" in html


def test_problems_are_noted_for_that_student_only(run):
    problems = {name: " ".join(r.get("problems", [])) for name, r in run["results"].items()}
    assert "more than once" in problems["duplicated_graded_cell"]
    assert (
        "missing" in problems["deleted_answer_cell"]
        and "missing" in problems["renamed_answer_cell"]
    )
    assert "not a readable notebook" in problems["malformed_json"]
    assert "was edited" in problems["edited_locked_train_loop"]
    assert "did not finish" in problems["top_level_endless_loop"]
    assert "stopped the Python process" in problems["kernel_dies_in_gae_cell"]
    assert not problems["alice"] and not problems["bob"]


def test_export_keeps_core_and_extra_apart(run):
    import csv

    out = run["course"] / "grades.csv"
    run_nbgrader(["export", "--to", str(out)], run["course"])
    rows = {r["student_id"]: r for r in csv.DictReader(out.open())}
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 10
    assert float(rows["malformed_json"]["score"]) == 0


def test_regrading_is_resumable_and_gives_the_same_scores(run):
    again = grade_class(
        run["course"],
        NB,
        workers=2,
        progress=False,
        out=open(os.devnull, "w"),
        limits=LIMITS,
        budget=BUDGET,
    )
    timed = {
        n for n, e in adv.ENTRIES.items() if e.get("lost", []) is None
    }  # slow entries: load decides
    assert {k: v["score"] for k, v in again.items() if k not in timed} == {
        k: v["score"] for k, v in run["results"].items() if k not in timed
    }
    assert all("fingerprint" in v for v in again.values())


def test_five_gradings_of_one_submission_give_one_score(run):
    source_nb, checks, secret = grading.load_course(run["course"], NB)
    text = run["subs"]["correct_but_warns"]
    seen = set()
    for _ in range(5):  # one after the other: CPython 3.11's ast.parse is not safe across threads
        result, _ = grading.grade_submission(text, source_nb, checks, secret, "correct_but_warns")
        seen.add(
            json.dumps(
                {k: (g["score"], g["message"]) for k, g in result["grades"].items()}, sort_keys=True
            )
        )
    assert len(seen) == 1 and json.loads(seen.pop())[adv.TRAIN][0] == 2


def test_nothing_but_the_runner_pipes_reaches_a_sandbox_started_by_a_class_worker(run):
    """The escape probe ran inside a sandbox that a grade-class worker started: it saw only the
    runner's two pipes and stdin/stdout/stderr, and neither the repository nor the course is mounted."""
    output = run["results"]["escape_fd_and_mount_probe"]["output"]
    line = next(part for part in output.splitlines() if part.startswith(adv.FDPROBE))
    seen = json.loads(line[len(adv.FDPROBE) :])
    assert seen["fds"] == sorted([0, 1, 2, *seen["runner"]]), seen
    assert not seen["repo_mounted"] and not seen["course_mounted"]


def test_no_submission_is_left_ungraded_and_no_internal_error_is_a_grade(run):
    for name, result in run["results"].items():
        assert not result.get("ungraded"), (name, result.get("problems"))
        assert "internal" not in " ".join(result.get("problems", [])), name


@pytest.fixture(scope="module")
def alone(run, tmp_path_factory):
    """The same two honest submissions graded in a class of their own."""
    course = tmp_path_factory.mktemp("alonecourse")
    for part in ("nbgrader_config.py", driver.SECRET_FILE, "source"):
        src = run["course"] / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, course / part)
    run_nbgrader(["generate_assignment", NB, "--force"], course)
    for student in ("alice", "bob"):
        target = course / "submitted" / student / NB / f"{NB}.ipynb"
        target.parent.mkdir(parents=True)
        target.write_text(run["subs"][student])
    return grade_class(course, NB, workers=WORKERS, progress=False, out=open(os.devnull, "w"), limits=LIMITS,
                       budget=BUDGET)  # fmt: skip


def test_an_honest_grade_does_not_depend_on_who_else_is_in_the_class(run, alone):
    """Issue 16 section 5: alice (correct) and bob (untouched release) alone, and beside every attack class
    in one 2-worker run: identical verdicts, and the shared run within n x bound / workers."""
    kinds = {adv.ENTRIES[n]["kind"] for n in run["results"] if n in adv.ENTRIES}
    assert {"escape", "write-back forge", "memory", "processes", "slow", "malformed frame"} <= kinds
    for student in ("alice", "bob"):
        beside = {
            k: (g["score"], g["message"]) for k, g in run["results"][student]["grades"].items()
        }
        by_itself = {k: (g["score"], g["message"]) for k, g in alone[student]["grades"].items()}
        assert beside == by_itself, student
    assert run["results"]["alice"]["score"] == 10 and run["results"]["bob"]["score"] == 0
    assert run["seconds"] <= len(run["results"]) * BOUND / WORKERS


def test_an_internal_error_is_retried_then_left_ungraded_and_never_cached(tmp_path):
    """A grading that fails inside the engine (here: a deadline that is not a number) is no grade: the
    worker is replaced, the submission tried again, then reported UNGRADED, not recorded, not cached."""
    from nbgrader.api import Gradebook, MissingEntry

    course = tmp_path / "broken"
    course.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "autograde" / "source", course / "source")
    run_nbgrader(["generate_assignment", NB, "--force"], course)
    target = course / "submitted" / "alice" / NB / f"{NB}.ipynb"
    target.parent.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", target)
    out = []
    results = grade_class(course, NB, workers=1, progress=False, out=type("O", (), {"write": lambda s, t: out.append(t), "flush": lambda s: None})(),
                          limits={"CELL_SECONDS": "not a number"}, budget=BUDGET)  # fmt: skip
    assert results["alice"].get("ungraded") and "UNGRADED after 2 attempts" in "".join(out)
    assert not (course / ".mlbook_grading" / NB / "alice.json").exists()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        with pytest.raises(MissingEntry):
            gb.find_submission(NB, "alice")
