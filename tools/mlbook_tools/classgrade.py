"""Grade a whole class: every ``submitted/<student>/<assignment>/<nb>.ipynb`` of an nbgrader course.

N worker processes (default: the cores), one torch thread each, grade submissions with the
sandboxed engine; the parent alone writes the gradebook (no SQLite lock fights) and the
``autograded/`` notebooks. A submission whose text, checks and engine are unchanged since its
last grading is skipped (``--force`` regrades), so an interrupted run resumes where it stopped.
One submission can never stop the run: anything that goes wrong is a problem noted for that
student. The state lives in ``<course>/.mlbook_grading/`` (outside ``source/``, never released).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import pathlib
import sys
import time
import traceback

from mlbook_tools import driver, grading, sandbox

_WORKER: dict = {}


def _init(course: str, assignment: str, trusted: bool, budget: float, limits: dict):
    import torch

    torch.set_num_threads(1)
    for key, value in limits.items():  # e.g. {"CELL_SECONDS": 8}: shorter deadlines for tests
        setattr(driver, key, value)
    source_nb, checks, secret = grading.load_course(pathlib.Path(course), assignment)
    _WORKER.update(
        source_nb=source_nb, checks=checks, secret=secret, trusted=trusted, budget=budget
    )


def _grade_one(student: str, path: str) -> dict:
    t0 = time.monotonic()
    try:
        text = pathlib.Path(path).read_text(errors="replace")
        result, plan = grading.grade_submission(text, _WORKER["source_nb"], _WORKER["checks"], _WORKER["secret"], student,
                                                trusted=_WORKER["trusted"], budget=_WORKER["budget"])  # fmt: skip
        notebook = grading.autograded_notebook(_WORKER["source_nb"], plan, result)
        import nbformat

        result["notebook"] = nbformat.writes(notebook)
    except Exception as err:  # noqa: BLE001 - the engine itself must never stop the class
        result = {"score": 0.0, "grades": {}, "problems": [f"internal grading error: {type(err).__name__}: {err}"],
                  "trace": traceback.format_exc()[-2000:]}  # fmt: skip
    result["seconds"] = round(time.monotonic() - t0, 2)
    return result


def _fingerprint(text: bytes, checks: pathlib.Path, source: pathlib.Path) -> str:
    h = hashlib.sha256()
    engine = sorted(pathlib.Path(driver.__file__).parent.glob("*.py"))  # the grader's own code
    for part in (text, checks.read_bytes(), source.read_bytes(), *(p.read_bytes() for p in engine)):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def grade_class(course: pathlib.Path, assignment: str = "rlhf_ppo", workers: int | None = None, force: bool = False,
                trusted: bool = False, budget: float = driver.BUDGET_SECONDS, progress: bool = True,
                out=sys.stdout, limits: dict | None = None) -> dict:  # fmt: skip
    """Grade every submission; returns {student: result summary}. Writes gradebook and autograded notebooks."""
    from nbgrader.api import Gradebook, MissingEntry

    course = pathlib.Path(course).resolve()
    source = course / "source" / assignment / f"{assignment}.ipynb"
    if not trusted:
        why = sandbox.check_available()
        if why:
            raise sandbox.SandboxUnavailable(
                f"{why}\nGrading stopped: student code would run unconfined. Pass --no-sandbox (or set MLBOOK_TRUSTED=1) "
                "only for submissions you trust."
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
    state_dir = course / ".mlbook_grading" / assignment
    state_dir.mkdir(parents=True, exist_ok=True)
    checks_path = grading.layout().checks
    jobs, results = [], {}
    for nb_path in sorted(course.glob(f"submitted/*/{assignment}/{assignment}.ipynb")):
        student = nb_path.parts[-3]
        fp = _fingerprint(nb_path.read_bytes(), checks_path, source)
        state = state_dir / f"{student}.json"
        if not force and state.exists():
            try:
                old = json.loads(state.read_text())
                if old.get("fingerprint") == fp and _made_here(course, assignment, student, fp):
                    results[student] = old
                    continue
            except (OSError, ValueError):
                pass
        jobs.append((student, str(nb_path), fp))
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        if not (folder / f"{assignment}.ipynb").exists():
            print(
                f"{folder.parent.name:20s} no {assignment}.ipynb in the submission folder: nothing to grade",
                file=out,
            )
    workers = workers or os.cpu_count() or 1
    source_nb, _, _ = grading.load_course(course, assignment)
    bar = None
    if progress and jobs:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"grading {assignment}", unit="nb", file=sys.stderr)
    ctx = multiprocessing.get_context("forkserver")
    init = (str(course), assignment, trusted, budget, limits or {})
    with cf.ProcessPoolExecutor(
        min(workers, max(len(jobs), 1)), ctx, initializer=_init, initargs=init
    ) as pool:
        futures = {pool.submit(_grade_one, s, p): (s, fp) for s, p, fp in jobs}
        for fut in cf.as_completed(futures):
            student, fp = futures[fut]
            try:
                result = fut.result()
            except Exception as err:  # noqa: BLE001 - a dead worker costs this submission only
                why = f"grading worker died: {type(err).__name__}"
                result = {"score": 0.0, "grades": {}, "problems": [why], "seconds": 0}
            notebook = _marked(result.pop("notebook", None), fp)
            try:
                grading.record(course, assignment, student, result, source_nb, notebook)
            except Exception as err:  # noqa: BLE001
                result.setdefault("problems", []).append(
                    f"could not record the grade: {type(err).__name__}: {err}"
                )
            result["fingerprint"] = fp
            kept = {k: v for k, v in result.items() if k != "output"}
            (state_dir / f"{student}.json").write_text(json.dumps(kept, default=str))
            results[student] = result
            line = _line(student, result)
            if bar is not None:
                bar.write(line, file=out)
                bar.update()
            else:
                print(line, file=out)
    if bar is not None:
        bar.close()
    return results


def _marked(notebook: str | None, fp: str) -> str | None:
    """The autograded notebook with the fingerprint of the grading that made it (in its metadata)."""
    if notebook is None:
        return None
    data = json.loads(notebook)
    data.setdefault("metadata", {})["mlbook"] = {
        "graded_by": "mlbook grade-class",
        "fingerprint": fp,
    }
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def _made_here(course: pathlib.Path, assignment: str, student: str, fp: str) -> bool:
    """Whether the autograded notebook is still the one this grading wrote: `nbgrader autograde` (or
    formgrader's button) run since then replaced it and its gradebook rows, so the student is regraded."""
    path = course / "autograded" / student / assignment / f"{assignment}.ipynb"
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("mlbook", {})
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("fingerprint") == fp


def _line(student: str, result: dict) -> str:
    ex = result.get("extra_credit", {})
    problems = result.get("problems", [])
    failed = [
        k
        for k, g in result.get("grades", {}).items()
        if g["score"] < g["max_score"] and not k.startswith("ex")
    ]
    text = (f"{student:20s} core {result.get('score', 0):4g}/{result.get('max_score', 0):g}  extra {ex.get('score', 0):g}/"
            f"{ex.get('max_score', 0):g}  {result.get('seconds', 0):6.1f} s")  # fmt: skip
    if failed:
        text += f"  failed: {len(failed)}"
    waiting = [*result.get("awaiting_manual", []), *ex.get("awaiting_manual", [])]
    if waiting:
        text += f"  awaiting manual grading: {len(waiting)}"
    if problems:
        text += "  problems: " + "; ".join(problems)[:300]
    return text
