"""Autograding with real nbgrader: one notebook outside a course, plus the feedback redaction.

``mlbook grade PATH.ipynb --json`` copies the course (``autograde/``) into a scratch folder,
runs ``nbgrader generate_assignment`` (which fills the gradebook from the source notebook; cached
per source version), places the notebook as a submission, runs ``nbgrader autograde`` and reads
the scores back from the gradebook. Grade ids starting with ``ex`` are the optional extra-credit exercises; they are
reported apart from the core score.
"""

from __future__ import annotations

import csv
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from nbconvert.preprocessors import Preprocessor
from nbgrader.plugins import ExportPlugin

from mlbook_tools.config import layout

CODE_STUB = '# YOUR CODE HERE\nraise NotImplementedError("replace this line with your implementation")'
EXTRA_PREFIX = "ex"


class RedactHiddenTests(Preprocessor):
    """For feedback: drop hidden-test regions and cut test-cell tracebacks down to ``Error: message``.

    nbgrader's ClearHiddenTests removes the hidden source, but an error's traceback quotes the
    hidden lines that raised it; students keep the message (written for them) and nothing else.
    """

    enabled = True
    begin, end = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            return cell, resources
        kept, hidden = [], False
        for line in cell.source.split("\n"):
            if self.begin in line:
                hidden = True
            elif self.end in line:
                hidden = False
            elif not hidden:
                kept.append(line)
        cell.source = "\n".join(kept)
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                out.traceback = [f"{out.ename}: {out.evalue}"]
        return cell, resources


def run_nbgrader(args: list[str], cwd: pathlib.Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run an nbgrader command in ``cwd`` with this interpreter (its bin/ first on PATH: nbgrader calls alembic)."""
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "nbgrader", *args, "--log-level=ERROR"]
    run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if check and run.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    return run


def submission_scores(submission) -> dict:
    """Per-cell scores of one nbgrader ``SubmittedAssignment``, core and extra credit summed apart."""
    grades: dict[str, dict[str, float]] = {}
    for nb in submission.notebooks:
        for grade in nb.grades:
            score = grade.score if grade.score is not None else 0.0
            grades[grade.name] = {"score": float(score), "max_score": float(grade.max_score)}
            if grade.needs_manual_grade and grade.cell_type == "code":
                grades[grade.name]["needs_manual_grade"] = True
    core = {k: v for k, v in grades.items() if not k.startswith(EXTRA_PREFIX)}
    extra = {k: v for k, v in grades.items() if k.startswith(EXTRA_PREFIX)}

    def total(part):
        return {"score": sum(g["score"] for g in part.values()), "max_score": sum(g["max_score"] for g in part.values())}

    return {**total(core), "grades": grades, "extra_credit": total(extra)}


def read_scores(gradebook: pathlib.Path, assignment: str, student: str) -> dict:
    """Scores of one submission from an nbgrader gradebook, as the JSON that ``mlbook grade`` prints."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook.resolve()}") as gb:
        return submission_scores(gb.find_submission(assignment, student))


class CoreExtraCsvExport(ExportPlugin):
    """``nbgrader export``: one row per student and assignment, core points and extra credit apart.

    nbgrader's own CSV adds the optional ``ex*`` cells into ``max_score``, which would penalise a
    student who skips the extra credit; here ``score``/``max_score`` are the core points only.
    """

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        keys = ["assignment", "student_id", "last_name", "first_name", "score", "max_score", "extra_credit",
                "extra_credit_max", "needs_manual_grade"]  # fmt: skip
        with open(self.to or "grades.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            for assignment in gradebook.assignments:
                for student in gradebook.students:
                    row = dict(assignment=assignment.name, student_id=student.id, last_name=student.last_name or "",
                               first_name=student.first_name or "")  # fmt: skip
                    try:
                        sub = gradebook.find_submission(assignment.name, student.id)
                    except MissingEntry:  # no submission: zero, like nbgrader's own export
                        sub = None
                    if sub is None:
                        scores = {"score": 0.0, "max_score": None, "extra_credit": {"score": 0.0, "max_score": None}}
                        manual = False
                    else:
                        scores, manual = submission_scores(sub), bool(sub.needs_manual_grade)
                    row.update(score=scores["score"], max_score=scores["max_score"], extra_credit=scores["extra_credit"]["score"],
                               extra_credit_max=scores["extra_credit"]["max_score"], needs_manual_grade=manual)  # fmt: skip
                    writer.writerow(row)


def _prepared_course(assignment: str, source_nb: pathlib.Path, course_dir: pathlib.Path) -> pathlib.Path:
    """A course folder with the assignment generated (gradebook filled), cached per source and config.

    ``generate_assignment`` costs about 9 s, so it runs once per version of the source notebook
    (the cache key hashes it and the course config); every grade then starts from a copy.
    """
    from importlib.metadata import version

    stamp = source_nb.read_bytes() + (course_dir / "nbgrader_config.py").read_bytes() + version("nbgrader").encode()
    key = hashlib.sha256(stamp).hexdigest()[:16]
    cache_root = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "mlbook" / "grade"
    cached = cache_root / f"{assignment}-{key}"
    if not (cached / "gradebook.db").exists():
        cache_root.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(dir=cache_root))
        shutil.copy(course_dir / "nbgrader_config.py", staging)
        shutil.copytree(source_nb.parent, staging / "source" / assignment)
        run_nbgrader(["generate_assignment", assignment, "--force"], staging)
        try:
            staging.rename(cached)  # atomic: a concurrent grader either wins or finds it done
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return cached


def grade_notebook(
    path: str | pathlib.Path, assignment: str = "rlhf_ppo", timeout: int | None = None, course: pathlib.Path | None = None
) -> dict:
    """Autograde one notebook with nbgrader in a scratch copy of ``course`` (default: the configured one)."""
    path = pathlib.Path(path).resolve()
    course_dir = pathlib.Path(course) if course else layout().course
    source_nb = course_dir / "source" / assignment / f"{assignment}.ipynb"
    if not source_nb.exists():
        raise FileNotFoundError(f"{source_nb} is missing: run `mlbook build` first")
    with tempfile.TemporaryDirectory() as tmp:
        course = pathlib.Path(tmp) / "course"
        shutil.copytree(_prepared_course(assignment, source_nb, course_dir), course)
        target = course / "submitted" / "student" / assignment / source_nb.name
        target.parent.mkdir(parents=True)
        shutil.copy(path, target)
        extra = [f"--Execute.timeout={timeout}"] if timeout else []
        run = run_nbgrader(["autograde", assignment, "--force", *extra], course, check=False)
        if not (course / "autograded" / "student" / assignment / source_nb.name).exists():
            # nbgrader could not even open it (not a notebook, bad JSON): zero points, and say why
            message = [line for line in run.stderr.splitlines() if line.strip()][-3:]
            return {"score": 0.0, "max_score": _max_score(course / "gradebook.db", assignment),
                    "grades": {}, "extra_credit": {"score": 0.0, "max_score": 0.0}, "error": " | ".join(message)}  # fmt: skip
        return read_scores(course / "gradebook.db", assignment, "student")


def _max_score(gradebook: pathlib.Path, assignment: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook.resolve()}") as gb:
        cells = gb.find_assignment(assignment).notebooks[0].grade_cells
        return float(sum(c.max_score for c in cells if not c.name.startswith(EXTRA_PREFIX)))
