"""Plain nbgrader's scores for the fairness styles, computed once and stored with a fingerprint.

    .venv/bin/python tests/fairness_reference.py          # recompute the stale or missing styles, rewrite the file
    .venv/bin/python tests/fairness_reference.py --all    # recompute every style
    make fairness-reference                               # the first line

The reference score of a style (``fairness_styles.STYLES``) is what plain ``nbgrader autograde`` gives it:
the whole chapter executed in a real IPython kernel, 15-50 s a style on 2 cores. ``test_fairness`` reads
it from ``tests/data/fairness_reference.json`` instead. Each style's entry carries the fingerprint of what
its score depends on, and nothing else:

* the style's notebook: its code cells and their nbgrader metadata (markdown never runs);
* the nbgrader source notebook's code cells (plain nbgrader puts back its locked cells and hidden tests);
* the code the notebook imports from this checkout (packages ``mlbook`` and ``mlbook_solutions``;
  comments, docstrings and formatting ignored);
* the nbgrader and torch versions, and the configuration that makes a course plain nbgrader
  (``grading.KERNEL_AUTOGRADE``: its preprocessors and cell timeout).

A new style makes only its own entry stale; an edited chapter code cell makes them all stale, and
the command above brings them back. A stale entry is never trusted: ``make check`` fails at once
(tests/test_fairness_reference.py, "run `make fairness-reference`"), and ``test_fairness`` fails
rather than recompute it.
"""

import argparse
import ast
import copy
import hashlib
import importlib.util
import json
import pathlib
import shutil
import sys
import tempfile
import time

import nbformat
import torch
from fairness_styles import STYLES, style_notebook
from mlbook_tools.config import layout
from mlbook_tools.grading import KERNEL_AUTOGRADE, read_scores, run_nbgrader, use_kernel_autograde
from nbgrader.utils import determine_grade
from ppo_checks import CHECKS

ROOT = layout().root
NB = "rlhf_ppo"
PATH = pathlib.Path(__file__).parent / "data" / "fairness_reference.json"
REFRESH = "make fairness-reference"  # what to run when the file is stale
PACKAGES = ("mlbook", "mlbook_solutions")


def student(name: str) -> str:
    """The style's student id in a course: letters, digits and underscores."""
    return "style_" + "".join(ch if ch.isalnum() else "_" for ch in name)


def base_notebook():
    return nbformat.read(ROOT / "solutions" / "notebooks" / f"{NB}.ipynb", as_version=4)


def _code_cells(nb) -> list:
    """What runs and how it is scored: each code cell's source, nbgrader metadata and extra-credit points."""
    return [
        (c.source, c.metadata.get("nbgrader", {}), c.metadata.get("mlbook", {}))
        for c in nb.cells
        if c.cell_type == "code"
    ]


def _package_code(name: str) -> str:
    """sha256 of every module of an installed package, as its AST without docstrings."""
    from mlbook_solutions.exercises import _without_docstrings

    root = pathlib.Path(importlib.util.find_spec(name).origin).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        tree = _without_docstrings(ast.parse(path.read_text()))
        h.update(str(path.relative_to(root)).encode() + ast.dump(tree).encode())
    return h.hexdigest()


def shared_fingerprint() -> str:
    """What every style's score depends on: source notebook code, imported packages, versions."""
    import nbgrader

    source = nbformat.read(ROOT / "autograde" / "source" / NB / f"{NB}.ipynb", as_version=4)
    parts = [
        _code_cells(source),
        [_package_code(p) for p in PACKAGES],
        nbgrader.__version__,
        KERNEL_AUTOGRADE,
        torch.__version__,
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def fingerprints(base=None) -> dict[str, str]:
    """Style name -> the fingerprint its stored reference must carry."""
    base, shared = base or base_notebook(), shared_fingerprint()
    out = {}
    for name, style in STYLES.items():
        cells = _code_cells(style_notebook(base, style))
        out[name] = hashlib.sha256(json.dumps([shared, cells], sort_keys=True).encode()).hexdigest()
    return out


def _kernel_grades(course: pathlib.Path, sid: str) -> dict[str, float]:
    """Every graded cell's score under plain nbgrader: core from the gradebook; extra credit (0-point
    cells in nbgrader) from the executed notebook's test cells, at the points the registry gives them."""
    grades = {
        g: v["score"]
        for g, v in read_scores(course / "gradebook.db", NB, sid)["grades"].items()
        if g in CHECKS and not CHECKS[g].extra
    }
    nb = nbformat.read(course / "autograded" / sid / NB / f"{NB}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in CHECKS and CHECKS[gid].extra:
            cell = copy.deepcopy(cell)
            cell.metadata.nbgrader["points"] = CHECKS[gid].points
            grades[gid] = float(determine_grade(cell)[0] or 0.0)
    return grades


def compute(names: list[str], base=None) -> dict[str, dict]:
    """Grade ``names`` under plain nbgrader in one scratch course: style name -> {grade id: score}."""
    base = base or base_notebook()
    with tempfile.TemporaryDirectory(prefix="fairness-ref-") as tmp:
        course = pathlib.Path(tmp) / "kernel"
        course.mkdir()
        shutil.copy(ROOT / "autograde" / "nbgrader_config.py", course)
        shutil.copytree(ROOT / "autograde" / "source", course / "source")
        use_kernel_autograde(course)
        run_nbgrader(["generate_assignment", NB, "--force"], course)
        for name in names:
            target = course / "submitted" / student(name) / NB / f"{NB}.ipynb"
            target.parent.mkdir(parents=True)
            nbformat.write(style_notebook(base, STYLES[name]), target)
        try:
            run_nbgrader(["autograde", NB, "--force"], course)
        except (
            RuntimeError
        ):  # nbgrader stops at a notebook it cannot grade (a duplicated grade id):
            for name in names:  # the others one by one; that one scores nothing, as in nbgrader
                if not (course / "autograded" / student(name) / NB).exists():
                    try:
                        run_nbgrader(
                            ["autograde", NB, "--force", "--student", student(name)], course
                        )
                    except RuntimeError as err:
                        print(f"{name}: plain nbgrader cannot grade it ({str(err)[-300:]})")
        return {
            name: _kernel_grades(course, student(name))
            if (course / "autograded" / student(name) / NB / f"{NB}.ipynb").exists()
            else {g: 0.0 for g in CHECKS}
            for name in names
        }


def load() -> dict:
    return json.loads(PATH.read_text()) if PATH.exists() else {"styles": {}}


def stale(stored: dict, prints: dict[str, str]) -> list[str]:
    """The styles whose stored reference is missing or was computed from something else."""
    have = stored.get("styles", {})
    return [n for n, fp in prints.items() if have.get(n, {}).get("fingerprint") != fp]


class StaleReference(AssertionError):
    """The stored reference was computed from something else than what the styles are now."""


def references() -> dict[str, dict[str, float]]:
    """Style name -> {grade id: plain-nbgrader score}, as stored; a stale or missing entry raises
    ``StaleReference`` naming the command that recomputes it (never recomputed in a test)."""
    prints, stored = fingerprints(), load()
    if todo := stale(stored, prints):
        raise StaleReference(
            f"{PATH.relative_to(ROOT)} is stale or missing for {len(todo)} style(s): "
            f"{', '.join(todo)}; run `{REFRESH}`"
        )
    return {n: stored["styles"][n]["grades"] for n in prints}


def refresh(everything: bool = False) -> None:
    base = base_notebook()
    prints, stored = fingerprints(base), load()
    todo = list(prints) if everything else stale(stored, prints)
    kept = {n: v for n, v in stored.get("styles", {}).items() if n in prints and n not in todo}
    t0 = time.monotonic()
    fresh = compute(todo, base) if todo else {}
    styles = {**kept, **{n: {"fingerprint": prints[n], "grades": g} for n, g in fresh.items()}}
    import nbgrader

    data = {
        "nbgrader": nbgrader.__version__,
        "torch": torch.__version__,
        "styles": {n: styles[n] for n in prints},
    }
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(
        f"{PATH}: {len(todo)} style(s) recomputed in {time.monotonic() - t0:.0f} s, {len(kept)} kept"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all", action="store_true", help="recompute every style, not only the stale ones"
    )
    refresh(parser.parse_args().all)
    sys.exit(0)
