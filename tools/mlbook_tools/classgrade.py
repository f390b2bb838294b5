"""Grade a whole class: every ``submitted/<student>/<assignment>/<nb>.ipynb`` of an nbgrader course.

N worker processes (default: the cores), one torch thread each, grade submissions with the
sandboxed engine; the parent alone writes the gradebook (no SQLite lock fights) and the
``autograded/`` notebooks. A submission whose text, checks and engine are unchanged since its
last grading is skipped (``--force`` regrades), so an interrupted run resumes where it stopped.

The workers and the threads that drive them are ``classgrade_worker.py``: a submission that
cannot be graded is reported UNGRADED, never recorded as a grade and never cached; what each student's
line says, and what lies beside the submissions, is ``classreport.py``. The state lives in
``<course>/.mlbook_grading/<assignment>/`` (``Assignment.state``: outside ``source/``, never released).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import queue
import sys
import threading

from mlbook_tools import classentry, gradebook, grading, manual_audit, sandbox
from mlbook_tools.cgroups import refusal_note
from mlbook_tools.classentry import ClassEntry, Outcome
from mlbook_tools.classgrade_worker import drive
from mlbook_tools.classreport import entry_line, report_extra_files, report_misnamed
from mlbook_tools.config import assignment as configured
from mlbook_tools.config import source_in, state_in
from mlbook_tools.limits import GradingLimits


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
        why = sandbox.check_available(limits)
        if why:
            raise sandbox.SandboxUnavailable(
                f"{why}\nGrading stopped: student code would run unconfined. Pass --no-sandbox (or set MLBOOK_TRUSTED=1) "
                "only for submissions you trust."
            )
        note = refusal_note()
        if note:  # said once, where the instructor looks: some honest answers will lose points
            print(note, file=sys.stderr)
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
        print(entry_line(entry, assignment), file=out)
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
        print(entry_line(entry, assignment, _booked(course, assignment, entry)), file=out)
    results.update(report_misnamed(course, assignment, out))
    report_extra_files(course, assignment, out, said=results)
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
            target=drive, args=(init, todo, done, start, backstop, limits.attempts), daemon=True
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
        line = entry_line(entry, assignment, _booked(course, assignment, entry))
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
        gradebook.record(
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


def _booked(course: pathlib.Path, assignment: str, entry: ClassEntry) -> dict | None:
    """The gradebook's scores of a graded submission (what a person graded in formgrader included),
    for its line; None when it holds none (a submission the run did not record)."""
    from nbgrader.api import MissingEntry

    if entry.outcome not in (Outcome.GRADED, Outcome.UNCHANGED) or entry.result is None:
        return None
    try:
        return grading.read_scores(course / "gradebook.db", assignment, entry.student)
    except MissingEntry:
        return None


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
        gradebook.record(
            course, assignment, entry.student, entry.result, source_nb, path.read_text()
        )


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
