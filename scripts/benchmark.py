"""How long the chapter takes: execute the solved notebook, grade one submission, grade a class.

    python scripts/benchmark.py [--repeats 3] [--only grading]

Targets on a 2-core CPU: chapter execution <= 30 s (plus <= 30 s for the exercises); grading one
correct submission with the sandboxed engine <= 10 s (median); a class of 16 mixed submissions
graded by `mlbook grade-class` >= 1.8x faster than sequential `nbgrader autograde` on the same
submissions, both measured in this run. Reports medians (not a test: timings are noisy).
"""

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import nbformat
from mlbook_tools.classgrade import grade_class
from mlbook_tools.grading import grade_notebook, run_nbgrader
from nbclient import NotebookClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import grading_catalog as cat  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def execute(path: pathlib.Path) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    return time.perf_counter() - t0


def _class_of_16(course: pathlib.Path) -> None:
    """4 solved, 4 untouched releases, 4 with classic mistakes, 4 with equivalent correct forms."""
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    wrong = sorted(cat.WRONG)
    correct = sorted(cat.CORRECT)
    for i in range(16):
        nb = nbformat.read(solved if i % 4 != 1 else course / "release" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4)
        answers = {}
        if i % 4 == 2:
            answers = {cat.WRONG[w][1]: cat.WRONG[w][2] for w in wrong[i::7][:2]}
        elif i % 4 == 3:
            answers = dict(cat.CORRECT[c] for c in correct[i % len(correct) :][:2])
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell.source = answers[gid]
        target = course / "submitted" / f"s{i:02d}" / "rlhf_ppo" / "rlhf_ppo.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)


def _fresh_course(tmp: pathlib.Path, name: str) -> pathlib.Path:
    course = tmp / name
    course.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "autograde" / "source", course / "source")
    run_nbgrader(["generate_assignment", "rlhf_ppo", "--force"], course)
    _class_of_16(course)
    return course


def grading_rows(repeats: int) -> list:
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    rows = []
    for label, path in (("grade one correct submission (sandboxed)", solved),
                        ("grade the untouched release (sandboxed)", ROOT / "chapters" / "rlhf_ppo.ipynb")):  # fmt: skip
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            grade_notebook(path)
            times.append(time.perf_counter() - t0)
        rows.append((label, times))
    with tempfile.TemporaryDirectory() as tmp:
        ours = _fresh_course(pathlib.Path(tmp), "engine")
        theirs = _fresh_course(pathlib.Path(tmp), "nbgrader")
        t0 = time.perf_counter()
        grade_class(ours, "rlhf_ppo", progress=False, out=open(os.devnull, "w"))
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_nbgrader(["autograde", "rlhf_ppo", "--force"], theirs, check=False)
        t_theirs = time.perf_counter() - t0
    rows.append((f"class of 16: mlbook grade-class ({os.cpu_count()} workers)", [t_ours]))
    rows.append(("class of 16: sequential nbgrader autograde", [t_theirs]))
    rows.append((f"class of 16: speed-up {t_theirs / t_ours:.2f}x (target >= 1.8x)", [t_theirs / t_ours]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["grading", "chapter"], default=None)
    args = ap.parse_args()
    rows = []
    if args.only != "grading":
        for nb in sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")):
            times = [execute(nb) for _ in range(args.repeats)]
            rows.append((f"execute {nb.name}", times))
    if args.only != "chapter":
        rows += grading_rows(args.repeats)
    for label, times in rows:
        print(f"{label:55s} median {statistics.median(times):6.1f}   runs {', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    main()
