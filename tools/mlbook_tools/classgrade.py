"""Grade a whole class: every ``submitted/<student>/<assignment>/<nb>.ipynb`` of an nbgrader course.

N worker processes (default: the cores), one torch thread each, grade submissions with the
sandboxed engine; the parent alone writes the gradebook (no SQLite lock fights) and the
``autograded/`` notebooks. A submission whose text, checks and engine are unchanged since its
last grading is skipped (``--force`` regrades), so an interrupted run resumes where it stopped.

The workers are plain subprocesses (``python -m mlbook_tools.classgrade --worker``) that speak one
JSON object per line on their stdin/stdout: nothing is pickled, and the sandboxes they start
inherit no descriptor but their runner's pipes (``sandbox.Runner`` closes every other one), so no
student code can reach a worker's or the parent's channel. One thread in the parent drives each
worker. A worker that dies or reports an internal error (a sandbox that cannot start, an engine
bug) costs nothing: it is replaced and the submission is graded again; one that still cannot be
graded is reported UNGRADED, never recorded as a grade and never cached. The backstop holds for the
whole grading, the trusted side's reading, parsing and notebook writing too: a worker says
"started" when it takes a submission; one that has not answered by the submission's wall-clock
backstop (``wall_factor`` x the budget) + ``grace_seconds`` after that is killed and the submission
reported UNGRADED at once (a second try would only take as long again). The state lives in
``<course>/.mlbook_grading/<assignment>/`` (``Assignment.state``: outside ``source/``, never released).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
import traceback

from mlbook_tools import classentry, feedback, grading, manual_audit, sandbox, submission
from mlbook_tools.classentry import BadReply, ClassEntry, Outcome, WorkerReply
from mlbook_tools.config import assignment as configured
from mlbook_tools.config import source_in, state_in
from mlbook_tools.errors import TooLarge
from mlbook_tools.limits import GradingLimits
from mlbook_tools.result import is_extra

# ------------------------------------------------------------------------------ the worker process

STARTED = json.dumps({"status": "started"})  # a worker took a submission
WORKER = [sys.executable, "-m", "mlbook_tools.classgrade", "--worker"]


def worker_main() -> None:
    """Read {"init": ...} then {"student", "path"} lines on stdin; write one JSON line per submission."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the engine prints goes to stderr, never into the channel
    sys.stdout = sys.stderr
    import torch

    torch.set_num_threads(1)
    init = json.loads(sys.stdin.readline())
    init["limits"] = GradingLimits.from_dict(init["limits"])  # plain JSON in, every name checked
    source_nb, checks, secret = grading.load_course(
        pathlib.Path(init["course"]), init["assignment"]
    )
    for line in sys.stdin:
        job = json.loads(line)
        channel.write(STARTED + "\n")  # the parent's backstop counts from here
        channel.flush()
        reply = _grade_one(job["student"], job["path"], source_nb, checks, secret, init)
        channel.write(reply.to_json() + "\n")
        channel.flush()


def _grade_one(student, path, source_nb, checks, secret, init) -> WorkerReply:
    t0 = time.monotonic()
    try:
        import nbformat

        limits: GradingLimits = init["limits"]
        wall = t0 + limits.budget_seconds * limits.wall_factor  # counted from reading the file
        try:
            text = submission.read_submission(
                path, limits
            )  # bounded before it is read whole or parsed
        except TooLarge as err:
            result, plan = grading.refused_result(source_nb, err), None
        else:
            result, plan = grading.grade_submission(
                text,
                source_nb,
                checks,
                secret,
                student,
                trusted=init["trusted"],
                wall_deadline=wall,
                limits=limits,
                assignment=init.get("assignment"),  # None: the default assignment
            )
        notebook = nbformat.writes(feedback.autograded_notebook(source_nb, plan, result, limits))
    except Exception as err:  # noqa: BLE001 - not a grade: the parent retries, then reports it ungraded
        return WorkerReply.internal(
            f"{type(err).__name__}: {str(err)[:500]}", traceback.format_exc()[-2000:]
        )
    seconds = round(time.monotonic() - t0, 2)
    return WorkerReply.graded(dataclasses.replace(result, seconds=seconds), notebook)


class _Worker:
    """One worker subprocess and its JSON pipe, driven by one thread of the parent."""

    def __init__(self, init: dict):
        self.proc = subprocess.Popen(
            WORKER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            text=True,
        )
        self.proc.stdin.write(json.dumps(init) + "\n")
        self.proc.stdin.flush()
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def grade(self, student: str, path: str, start: float, backstop: float) -> WorkerReply:
        """The worker's reply; "internal" when it died, did not take the submission within ``start``
        seconds or wrote something that is not a reply (``WorkerReply.from_json`` says what);
        "backstop" when it did not answer within ``backstop`` seconds of taking it."""
        try:
            self.proc.stdin.write(json.dumps({"student": student, "path": path}) + "\n")
            self.proc.stdin.flush()
            line = self.lines.get(timeout=start)
        except queue.Empty:
            return WorkerReply.internal(f"the grading worker did not start within {start:.0f} s")
        except OSError:
            line = None
        if line is not None and line.strip() == STARTED:
            try:
                line = self.lines.get(timeout=backstop)
            except queue.Empty:
                return WorkerReply.backstop(
                    f"its grading did not end by its wall-clock backstop + grace ({backstop:g} s) and was stopped"
                )
        if line is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            return WorkerReply.internal(f"the grading worker died (exit {self.proc.returncode})")
        try:
            return WorkerReply.from_json(line)
        except BadReply as err:
            return WorkerReply.internal(f"the grading worker's reply: {err}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def _drive(
    init: dict, jobs: queue.Queue, done: queue.Queue, start: float, backstop: float, attempts: int
):
    """One parent thread: take jobs, grade them on its worker, retry what was not a grade (but a
    grading stopped at its backstop: a second try would take as long again)."""
    worker = None
    try:
        while True:
            try:
                student, path, fp, attempt = jobs.get_nowait()
            except queue.Empty:
                return
            if worker is None or not worker.alive():
                worker = _Worker(init)
            reply = worker.grade(student, path, start, backstop)  # checked: types, totals
            if reply.status == "graded":
                entry = ClassEntry(student, Outcome.GRADED, reply.result, fingerprint=fp)
                done.put((entry, reply.notebook))
                continue
            worker.kill()  # a fresh worker for the retry (and for whatever comes next)
            worker = None
            if attempt + 1 < attempts and reply.status != "backstop":
                jobs.put((student, path, fp, attempt + 1))
            else:
                tries = attempt + 1
                why = f"UNGRADED after {tries} attempt{'s' * (tries > 1)}: {reply.why}"
                entry = ClassEntry(
                    student, Outcome.UNGRADED, fingerprint=fp, problems=(why,), trace=reply.trace
                )
                done.put((entry, None))
    finally:
        if worker is not None:
            worker.stop()


def _head(path: pathlib.Path, limits: GradingLimits) -> bytes:
    """The file's bytes up to one past the bound, and its size: what a grading of it reads."""
    with open(path, "rb") as fh:
        head = fh.read(limits.max_notebook_bytes + 1)
        return head + f"\0{os.fstat(fh.fileno()).st_size}".encode()


def _fingerprint(text: bytes, checks: pathlib.Path, source: pathlib.Path) -> str:
    h = hashlib.sha256()
    engine = sorted(pathlib.Path(__file__).parent.rglob("*.py"))  # the grader, inside/ too
    for part in (text, checks.read_bytes(), source.read_bytes(), *(p.read_bytes() for p in engine)):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def grade_class(
    course: pathlib.Path,
    assignment: str | None = None,
    workers: int | None = None,
    force: bool = False,
    trusted: bool = False,
    budget: float | None = None,
    progress: bool = True,
    out=None,
    limits: GradingLimits | None = None,
) -> dict[str, ClassEntry]:
    """Grade every submission; returns {student: what this run did}, one entry per submission folder
    (``classentry.Outcome``). Writes the gradebook and the autograded notebooks.

    ``assignment``: a configured assignment's name (``config.assignment``; default: the first).

    ``limits``: by default the course config's (``grading.course_limits``); ``budget``, if given,
    replaces their ``budget_seconds``."""
    out = (
        out or sys.stdout
    )  # the stream at the call (a default bound at import would outlive a redirect)
    from nbgrader.api import Gradebook, MissingEntry

    course = pathlib.Path(course).resolve()
    this = configured(assignment)
    assignment = this.name
    require_course(course, assignment)  # before anything is written (a stray gradebook.db)
    limits = limits or grading.course_limits(course)
    if budget:
        limits = limits.replace(budget_seconds=float(budget))
    source = this.source(course)
    if not trusted:
        why = sandbox.check_available()
        if why:
            raise sandbox.SandboxUnavailable(
                f"{why}\nGrading stopped: student code would run unconfined. Pass --no-sandbox (or set MLBOOK_TRUSTED=1) "
                "only for submissions you trust."
            )
        no_cgroup = sandbox.cgroups_available()
        if no_cgroup:  # said once, where the instructor looks: some honest answers will lose points
            print(
                f"note: no cgroup for the sandboxes here ({no_cgroup}): student code that starts a "
                "process (`!` lines, %%bash, subprocess, multiprocessing) is refused. Run grade-class as "
                "root or in a cgroup delegated to you (`mlbook hub` gives its instructor one).",
                file=sys.stderr,
            )
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            gb.find_assignment(assignment)
        except MissingEntry:
            gb = None
    if (
        gb is None
    ):  # the assignment was never generated in this course: nbgrader fills the gradebook
        grading.run_nbgrader(["generate_assignment", assignment, "--force"], course)
    this.state(course).mkdir(parents=True, exist_ok=True)
    manual_audit.report(course, assignment, out)  # manual scores changed since the last run
    checks_path = this.checks
    results: dict[str, ClassEntry] = refused_ids(course, assignment)  # ids outside the safe set
    for entry in results.values():
        print(_line(entry, assignment), file=out)
    jobs, kept = [], []  # kept: unchanged since a grading (here or copied back)
    for nb_path in sorted(course.glob(f"submitted/*/{assignment}/{assignment}.ipynb")):
        student = nb_path.parts[-3]
        if student in results:
            continue
        fp = _fingerprint(_head(nb_path, limits), checks_path, source)
        old = None if force else classentry.saved(course, assignment, student)
        if (
            old is not None
            and old.result is not None
            and old.fingerprint == fp
            and _made_here(course, assignment, student, fp)
        ):
            kept.append(dataclasses.replace(old, outcome=Outcome.UNCHANGED))
            continue
        jobs.append((student, str(nb_path), fp))
    _fill_gradebook(course, assignment, kept)
    for entry in kept:  # a rerun says every score too, not only the regraded ones
        results[entry.student] = entry
        print(_line(entry, assignment), file=out)
    results.update(report_misnamed(course, assignment, out))
    report_extra_files(course, assignment, out)
    workers = workers or os.cpu_count() or 1
    source_nb, _, _ = grading.load_course(course, assignment)
    bar = None
    if progress and jobs:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"grading {assignment}", unit="nb", file=sys.stderr)
    init = {
        "course": str(course),
        "assignment": assignment,
        "trusted": trusted,
        "limits": limits.to_dict(),
    }
    start = limits.worker_slack_seconds  # a fresh worker: import torch, load the course
    backstop = limits.budget_seconds * limits.wall_factor + limits.grace_seconds
    todo: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    for student, path, fp in jobs:
        todo.put((student, path, fp, 0))
    threads = [
        threading.Thread(
            target=_drive, args=(init, todo, done, start, backstop, limits.attempts), daemon=True
        )
        for _ in range(min(workers, max(len(jobs), 1)))
    ]
    for t in threads:
        t.start()
    for _ in range(len(jobs)):
        entry, notebook = done.get()
        if entry.outcome is Outcome.GRADED:  # UNGRADED: never recorded, never cached (tried again)
            entry = _record(course, assignment, entry, source_nb, notebook)
        results[entry.student] = entry
        line = _line(entry, assignment)
        if bar is not None:
            bar.write(line, file=out)
            bar.update()
        else:
            print(line, file=out)
    for t in threads:
        t.join()
    if bar is not None:
        bar.close()
    from mlbook_tools.late import apply_late_penalties  # nbgrader's late-penalty plugin (late.py)

    apply_late_penalties(course, assignment, [s for s, e in results.items() if e.recorded], out)
    manual_audit.save(course, assignment)
    return results


def refused_ids(course: pathlib.Path, assignment: str) -> dict[str, ClassEntry]:
    """The submission folders whose student id is not a safe one (exchange.py): never read,
    graded, put in the gradebook or the exports."""
    from mlbook_tools.exchange import unsafe_ids

    refused = {}
    for student, why in unsafe_ids(course, assignment).items():
        refused[student] = ClassEntry(student, Outcome.REFUSED, problems=(why,))
    return refused


def _record(
    course: pathlib.Path, assignment: str, entry: ClassEntry, source_nb, notebook: str | None
) -> ClassEntry:
    """Record a grading in the gradebook and the state file; the entry as recorded (a failure to
    record is one more problem on the student's line)."""
    try:
        grading.record(
            course,
            assignment,
            entry.student,
            entry.result,
            source_nb,
            _marked(notebook, entry.fingerprint),
        )
    except Exception as err:  # noqa: BLE001
        why = f"could not record the grade: {type(err).__name__}: {err}"
        result = dataclasses.replace(entry.result, problems=[*(entry.result.problems or []), why])
        entry = dataclasses.replace(entry, result=result)
    state = state_in(course, assignment) / f"{entry.student}.json"
    state.write_text(json.dumps(entry.to_state(), default=str))
    return entry


def _fill_gradebook(course: pathlib.Path, assignment: str, kept: list[ClassEntry]) -> None:
    """Record the kept grading of each student the gradebook does not hold as it was graded.

    A grading done on another copy of the course (docs/scale.md, several machines) comes back as its
    autograded notebook and its state file; the gradebook here has not seen it. The notebook carries
    the fingerprint of that grading (``_made_here``), so its result is recorded as it stands, not
    regraded."""
    if not kept:
        return
    from nbgrader.api import Gradebook, MissingEntry

    missing = []
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for entry in kept:
            try:
                nb = gb.find_submission_notebook(assignment, assignment, entry.student)
            except MissingEntry:
                missing.append(entry)
                continue
            have = {g.name: g for g in nb.grades}
            for gid, g in entry.result.grades.items():
                got = have.get(gid)
                score = None if got is None else (got.auto_score or 0.0) + (got.extra_credit or 0.0)
                if score is None or abs(score - g.score) > 1e-9:
                    missing.append(entry)
                    break
    if not missing:
        return
    source_nb, _, _ = grading.load_course(course, assignment)
    for entry in missing:
        path = course / "autograded" / entry.student / assignment / f"{assignment}.ipynb"
        grading.record(course, assignment, entry.student, entry.result, source_nb, path.read_text())


class NotACourse(FileNotFoundError):
    """The folder grade-class was pointed at is not an nbgrader course folder."""


def require_course(course: pathlib.Path, assignment: str) -> None:
    """Stop, writing nothing, unless ``course`` is a course folder holding ``assignment``'s source."""
    source = source_in(course, assignment)
    if not (course / "nbgrader_config.py").is_file() or not source.is_file():
        missing = (
            "nbgrader_config.py"
            if not (course / "nbgrader_config.py").is_file()
            else str(source.relative_to(course))
        )
        raise NotACourse(
            f"{course} is not a course folder (no {missing}); nothing was written. Create one with "
            f"`mlbook new-course DIR`, put submissions at DIR/submitted/<student>/{assignment}/{assignment}.ipynb, "
            "then run `mlbook grade-class --course DIR` (or run it inside DIR)"
        )


def report_misnamed(course: pathlib.Path, assignment: str, out) -> dict[str, ClassEntry]:
    """A submission folder without ``<assignment>.ipynb`` (e.g. only ``<assignment>-Copy1.ipynb``) is a
    problem of that student, named in the results, the summary and both exports (the student is
    added to the gradebook with no submission, the status column names the file found)."""
    from nbgrader.api import Gradebook, MissingEntry

    from mlbook_tools.exchange import student_id_problem

    misnamed = {}
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        if (folder / f"{assignment}.ipynb").exists():
            continue
        student = folder.parent.name
        if student_id_problem(student):  # refused, said once (refused_ids)
            continue
        found = (
            sorted(p.name for p in folder.glob("*.ipynb"))
            or sorted(p.name for p in folder.iterdir())[:5]
        )
        what = ", ".join(found) if found else "an empty folder"
        why = f"no {assignment}.ipynb in {folder.relative_to(course)}: found {what}; rename it to {assignment}.ipynb and rerun"
        entry = ClassEntry(student, Outcome.MISNAMED, problems=(why,), found=tuple(found))
        misnamed[student] = entry
        state = state_in(course, assignment) / f"{student}.json"
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(entry.to_state()))
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            try:
                gb.find_student(student)
            except MissingEntry:
                gb.add_student(student, last_name=student, first_name="")
        print(_line(entry, assignment), file=out)
    return misnamed


EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")  # what nbgrader's exchange adds


def _extra_files(folder: pathlib.Path, assignment: str, most: int) -> tuple[list[str], int]:
    """The first ``most`` names in ``folder`` beside the notebook (sorted per folder; a folder that
    is a link is named, never entered), and how many more (visiting at most 50 x ``most`` entries)."""
    names, more, todo, visits = [], 0, [""], 50 * most
    while todo and visits > 0:
        rel = todo.pop()
        try:
            entries = sorted(os.scandir(folder / rel), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            visits -= 1
            path = os.path.join(rel, entry.name)
            if entry.is_dir(follow_symlinks=False):
                todo.append(path)
                continue
            if path in (f"{assignment}.ipynb", *EXCHANGE_FILES):
                continue
            if len(names) < most:
                names.append(path)
            else:
                more += 1
    return sorted(names), more


def report_extra_files(course: pathlib.Path, assignment: str, out, most: int = 20) -> dict:
    """One line per student whose submission folder holds more than the notebook (and the exchange's
    files): their names, printable, for the instructor to look at as text. They are never graded,
    copied or served (formgrader_guard answers 404 for a submission's files)."""
    found = {}
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        names, more = _extra_files(folder, assignment, most)
        if not names:
            continue
        found[folder.parent.name] = names
        shown = ", ".join(feedback.printable(n).replace("\n", "\ufffd")[:120] for n in names)
        print(
            f"{feedback.printable(folder.parent.name):20s} EXTRA FILES (not graded, never served; "
            f"open them only as text): {shown}" + (f" and {more} more" if more else ""),
            file=out,
        )
    return found


def _marked(notebook: str | None, fp: str) -> str | None:
    """The autograded notebook with the fingerprint of the grading that made it (in its metadata)."""
    if notebook is None:
        return None
    data = json.loads(notebook)
    mine = data.setdefault("metadata", {}).get("mlbook")
    data["metadata"]["mlbook"] = {
        **({"flag": mine["flag"]} if isinstance(mine, dict) and "flag" in mine else {}),
        "graded_by": "mlbook grade-class",
        "fingerprint": fp,
    }
    return (
        json.dumps(data, indent=1) + "\n"
    )  # ASCII: a lone surrogate in a cell is escaped, not fatal


def _made_here(course: pathlib.Path, assignment: str, student: str, fp: str) -> bool:
    """Whether the autograded notebook is still the one this grading wrote: `nbgrader autograde` (or
    formgrader's button) run since then replaced it and its gradebook rows, so the student is regraded."""
    path = course / "autograded" / student / assignment / f"{assignment}.ipynb"
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("mlbook", {})
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("fingerprint") == fp


def _line(entry: ClassEntry, assignment: str | None = None) -> str:
    """One student's line, by outcome. A grading (now or kept): core and extra credit, the failing
    checks by name, what awaits a person; a refused or unreadable file its flag instead (nothing of
    it was read: never "awaiting"). Not graded: why, and what to do. ``assignment``: its name
    (default: the default assignment's), which a misnamed submission's flag names."""
    from mlbook_tools.flags import from_entry

    name = f"{entry.student:20s} "
    if entry.outcome is Outcome.REFUSED:  # the id itself is unsafe: said escaped, never padded raw
        return feedback.printable("NOT GRADED: " + "; ".join(entry.problems))
    if entry.outcome is Outcome.UNGRADED:
        return name + feedback.printable("; ".join(entry.problems))
    if entry.outcome is Outcome.MISNAMED:
        return name + "NOT GRADED: " + feedback.printable("; ".join(entry.problems))
    result = entry.result
    core, ex = result.core, result.extra
    text = (
        f"{name}core {core.score:4g}/{core.max_score:g}  extra {ex.score:g}/{ex.max_score:g}  "
        f"{entry.seconds:6.1f} s"
    )
    flag = from_entry(assignment or configured().name, entry)
    if flag is not None:
        text += f"  {flag.line()}"
    else:
        failed = [
            g.grade_id for g in result.grades.values() if not g.passed and not is_extra(g.grade_id)
        ]
        if failed:
            text += "  failed: " + ", ".join(failed)
        waiting = [*core.awaiting_manual, *ex.awaiting_manual]
        if waiting:
            text += f"  awaiting manual grading: {len(waiting)}"
        if result.problems:
            text += "  problems: " + feedback.printable("; ".join(result.problems)[:300])
    return text + ("  (unchanged, kept)" if entry.outcome is Outcome.UNCHANGED else "")


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
