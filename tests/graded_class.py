"""The one graded class that test_autograde, test_adversarial and test_fairness read.

``tests/conftest.py`` builds it once per session (fixture ``graded_class``): one scratch course
outside the checkout, the real ``nbgrader generate_assignment`` release, and ONE ``grade_class`` run
(what ``mlbook grade-class`` runs) with two workers and the short deadlines below. Its students:

* the course workflow (test_autograde): alice (the solved notebook), bob (the untouched release),
  frank (three classic mistakes); a process that dies, a file that is not a notebook and correct
  answers written differently are catalog entries and styles below;
* every entry of ``adversarial_catalog.ENTRIES`` (test_adversarial), under its own name;
* every style of ``fairness_styles.STYLES`` (test_fairness), as ``fairness_reference.student(name)``;

the entries and styles of the tiers the session's tests need (``FULL_ENTRIES``, ``FULL_STYLES``: only
``make test-full`` grades those).

Right after the run the fixture records what the adversarial tests compare with (digests of the
files no submission may touch, the files the run created, its duration). Tests that change the
course afterwards (nbgrader autograde of another student, a regrade) work on a copy of it; feedback
pages and exports are written once, into folders the run's record already excludes.
"""

import copy
import csv
import dataclasses
import hashlib
import json
import pathlib
import shutil
import time

import adversarial_catalog as adv
import grading_catalog as cat
import nbformat
from fairness_reference import student as style_student
from fairness_styles import STYLES, style_notebook
from mlbook_tools import driver
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores, run_nbgrader
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from nbcells import defines
from ppo_checks import CHECKS

ROOT = layout().root
NB = "rlhf_ppo"
SOLVED = ROOT / "solutions" / "notebooks" / f"{NB}.ipynb"
TOKEN = (
    "zq7xk" + "TOKEN" + "93b"
)  # never written literally into a submission's output by the graders
# The run's limits: short, so that the catalog's slow entries cost 45 s each, not the default 300.
# budget_seconds: per submission (slow entries use all of it; honest work needs ~6 s on a quiet core)
LIMITS = dataclasses.replace(
    DEFAULT_LIMITS,
    cell_seconds=8.0,
    call_seconds=5.0,
    memory_bytes=1536 * 1024**2,
    budget_seconds=45.0,
)
BUDGET = LIMITS.budget_seconds
# What one submission may take, sandbox start-up included: the budget counts the sandbox's own CPU
# time, so on a busy machine a submission may run to its wall-clock backstop (wall_factor x the
# budget), and the watchdog kills it grace_seconds after that.
BOUND = BUDGET * LIMITS.wall_factor + LIMITS.grace_seconds + 20
WORKERS = 2

MISTAKES = ["gae_lambda_ignored", "value_clip_around_returns", "controller_without_clip"]
WORKFLOW = ["alice", "bob", "frank"]

# The two tiers of the class. `make test` grades the workflow, most of the adversarial catalog (every
# kind of attack) and four correct styles; `make test-full` (CI, right after) grades the rest: the
# costliest entries of kinds that keep a cheaper one in `make test` (a whole budget each, or a runner
# that dies and is retried) and the other styles. Their own tests carry the marker `full`; the session
# fixture (tests/conftest.py) grades the students of the tiers the selected tests need, so a run of
# both tiers (`pytest tests/test_adversarial.py`) is one class of everyone, as before.
FULL_ENTRIES = {
    # slow: each spends the whole budget (slow_every_call stays in make test)
    "slow_busy_threads",
    "slow_cells_just_under_a_second",
    "slow_property_read_in_a_loop",
    # resource abuse: a whole budget, ~20 s (top_level_endless_loop, fork_bomb, disk_filler ... stay)
    "cpu_loop_ignoring_sigint",
    "memory_hog_in_gae",
    # a raw vfork through ctypes hangs its own runner until the cell's budget (~60 s since processes
    # are allowed within the cgroup); processes_fork and the fork bomb stay
    "processes_raw_clone",
    # malformed frame: the runner dies, the submission is retried (deep nesting stays)
    "runner_replies_patched",
    "runner_dies_on_defined",
    "malformed_frame_in_correct_work",
    "malformed_oversize_length",
    "malformed_infinity",
    "malformed_wrong_types",
    # memory: ~20 s of filling a memfd, a reply of huge lists (the tmpfs, /dev/shm and top-level hogs stay)
    "memory_memfd_hog_in_gae",
    "reply_of_empty_lists",
    # page-size: 18 MB of {} in an added cell's metadata, built and read (~10 s)
    "metadata_of_empty_dicts",
}
FAST_STYLES = {  # the correct styles graded in make test (magics, %%writefile, a syntax error)
    "reference",
    "magics and shell escapes",
    "%%writefile helper package",
    "controller cell left unfinished (syntax error)",
}
FULL_STYLES = set(STYLES) - FAST_STYLES


def tier_param(name: str, full: set):
    """A pytest parameter for a student of the class, marked ``full`` when only make test-full grades it."""
    import pytest

    return pytest.param(name, marks=pytest.mark.full) if name in full else name


def _fill(text: str, course: pathlib.Path) -> str:
    return (
        text.replace("{COURSE}", str(course)).replace("{REPO}", str(ROOT)).replace("{TOKEN}", TOKEN)
    )


def solved_with(answers: dict[str, str]) -> str:
    """The solved notebook with some answer cells (by grade_id) replaced."""
    nb = nbformat.read(SOLVED, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nbformat.writes(nb)


def build_submission(entry: dict, course: pathlib.Path) -> str:
    """An adversarial catalog entry as the notebook file a student would hand in."""
    if entry.get("raw") is not None:
        return entry["raw"]
    base = SOLVED if entry["base"] == "solved" else course / "release" / NB / f"{NB}.ipynb"
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
    what, _, target = (entry.get("damage") or "").partition(":")
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
            if cell.cell_type == "code" and "train_ppo" in defines(cell.source):
                cell.source = (
                    "from types import SimpleNamespace\n\n\ndef train_ppo(*a, steps=30, **k):\n"
                    "    return [SimpleNamespace(reward=float(i), kl=1.0) for i in range(steps)]\n"
                )
    elif what == "split":  # JupyterLab's Ctrl+Shift+-: both halves keep the cell's metadata
        first, _, second = cells[index[target]].source.partition("\n\n\n")
        cells[index[target]].source = first
        cells.insert(index[target] + 1, copy.deepcopy(cells[index[target]]))
        cells[index[target] + 1].source = second
    elif what == "metadata_dicts":  # ~18 MB of {} (four bytes each), within every byte bound
        odd = nbformat.v4.new_code_cell("x_meta = 1")
        odd.metadata["junk"] = [{}] * 4_500_000
        cells.append(odd)
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


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def new_course(root: pathlib.Path) -> pathlib.Path:
    """The checkout's course (config and source) copied to ``root``, released by nbgrader, with a secret."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "autograde" / "source", root / "source")
    run_nbgrader(["generate_assignment", NB, "--force"], root)
    driver.course_secret(root)
    return root


def submit(course: pathlib.Path, student: str, text: str) -> None:
    target = course / "submitted" / student / NB / f"{NB}.ipynb"
    target.parent.mkdir(parents=True)
    target.write_text(text)


@dataclasses.dataclass
class GradedClass:
    course: pathlib.Path
    results: dict  # student -> grade_class's summary
    lines: str  # what grade_class printed, as the instructor reads it
    subs: dict  # student -> the submitted text
    before: dict  # protected file -> digest before the run
    after: dict  # the same, right after the run
    created: set  # files the run created
    seconds: float
    _feedback: dict = dataclasses.field(default_factory=dict)
    _exports: dict = dataclasses.field(default_factory=dict)

    def scores(self, student: str) -> dict:
        return read_scores(self.course / "gradebook.db", NB, student)

    def feedback(self, student: str) -> str:
        """nbgrader's generate_feedback page of one student (written once, into feedback/)."""
        if student not in self._feedback:
            run_nbgrader(["generate_feedback", NB, "--force", f"--student={student}"], self.course)
            self._feedback[student] = (
                self.course / "feedback" / student / NB / f"{NB}.html"
            ).read_text()
        return self._feedback[student]

    def export(self, exporter: str | None = None) -> dict[str, dict]:
        """``nbgrader export`` (the course's CSV, or ``exporter``'s) as student id -> row, written once."""
        if exporter not in self._exports:
            out = self.course / "exports" / f"{exporter or 'grades'}.csv"
            out.parent.mkdir(exist_ok=True)
            run_nbgrader(
                ["export", "--to", str(out), *(["--exporter", exporter] if exporter else [])],
                self.course,
            )
            self._exports[exporter] = {r["student_id"]: r for r in csv.DictReader(out.open())}
        return self._exports[exporter]

    def copy(self, dest: pathlib.Path) -> pathlib.Path:
        """A copy of the graded course, for a test that changes it."""
        shutil.copytree(self.course, dest, symlinks=True)
        return dest


def submissions(course: pathlib.Path, fast: bool = True, full: bool = True) -> dict[str, str]:
    """The students of the shared class and the text they hand in: the workflow, and the adversarial
    entries and styles of the tiers asked for (``fast``: make test's, ``full``: make test-full's)."""
    subs = {
        "alice": SOLVED.read_text(),
        "bob": (course / "release" / NB / f"{NB}.ipynb").read_text(),
        "frank": solved_with({cat.WRONG[name][1]: cat.WRONG[name][2] for name in MISTAKES}),
    }
    assert not set(subs) & set(adv.ENTRIES)
    assert FULL_ENTRIES <= set(adv.ENTRIES) and FAST_STYLES <= set(STYLES)

    def wanted(name, full_tier):
        return full if name in full_tier else fast

    subs.update(
        {
            name: build_submission(entry, course)
            for name, entry in adv.ENTRIES.items()
            if wanted(name, FULL_ENTRIES)
        }
    )
    base = nbformat.read(SOLVED, as_version=4)
    for name, style in STYLES.items():
        if wanted(name, FULL_STYLES):
            subs[style_student(name)] = nbformat.writes(style_notebook(base, style))
    names = [*WORKFLOW, *adv.ENTRIES, *map(style_student, STYLES)]
    assert len(set(names)) == len(names), "two students share a name"
    return subs


def grade(root: pathlib.Path, fast: bool = True, full: bool = True) -> GradedClass:
    course = new_course(root)
    subs = submissions(course, fast, full)
    for student, text in subs.items():
        submit(course, student, text)
    protected = [
        course / "nbgrader_config.py",
        course / driver.SECRET_FILE,
        course / "source" / NB / f"{NB}.ipynb",
        *sorted(course.glob(f"submitted/*/{NB}/{NB}.ipynb")),
    ]
    before = {p: digest(p) for p in protected}
    files_before = set(course.rglob("*"))
    lines = []

    class Out:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    t0 = time.monotonic()
    results = grade_class(
        course, NB, workers=WORKERS, progress=False, out=Out(), limits=LIMITS, budget=BUDGET
    )
    seconds = time.monotonic() - t0
    _wait_until_no_process_names(TOKEN)  # a daemon that outlived grading strikes before the check
    after = {p: digest(p) for p in protected}
    created = set(course.rglob("*")) - files_before
    return GradedClass(course, results, "".join(lines), subs, before, after, created, seconds)


def _wait_until_no_process_names(token: str, timeout: float = 60.0) -> None:
    """Until no process on this machine has ``token`` in its command line (the catalog's daemon
    carries it; the sandbox's cgroup kills it at close, so this returns at once when the bound
    holds). One that escaped is waited for: it strikes (or not) before the files are compared."""
    mine = token.encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            try:
                if mine in (proc / "cmdline").read_bytes():
                    alive.append(proc.name)
            except OSError:  # gone meanwhile, or not ours to read
                continue
        if not alive:
            return
        time.sleep(0.2)
    raise TimeoutError(f"processes {alive} naming {token} still run {timeout:.0f} s after grading")


# Points, from the one registry (``ppo_checks.CHECKS``, ``@graded``) and the source notebook's metadata.
CORE = {g: c.points for g, c in CHECKS.items() if not c.extra}  # the six named tests
EXTRA_AUTO = sum(c.points for c in CHECKS.values() if c.extra)  # the autograded extra credit


def written_answers() -> dict[str, float]:
    """The answers a person grades (grade id -> extra-credit points), by metadata: graded solution cells."""
    from mlbook_tools.cells import points as cell_points

    source = nbformat.read(ROOT / "autograde" / "source" / NB / f"{NB}.ipynb", as_version=4)
    return {
        c.metadata.nbgrader["grade_id"]: cell_points(c)
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("grade") and c.metadata.nbgrader.get("solution")
    }
