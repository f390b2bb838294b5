"""How long the chapter takes: execute the solved notebook, and grade one submission with nbgrader.

    python scripts/benchmark.py [--repeats 3]

Targets on a 2-core CPU: chapter execution <= 30 s (plus <= 30 s for the exercises), grading one
submission <= 20 s. Reports the median of --repeats runs of each (not a test: timings are noisy).
"""

import argparse
import pathlib
import statistics
import time

import nbformat
from mlbook_tools.grading import grade_notebook
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]


def execute(path: pathlib.Path) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    rows = []
    for nb in sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")):
        times = [execute(nb) for _ in range(args.repeats)]
        rows.append((f"execute {nb.name}", times))
    for label, path in (("grade solved submission", solved), ("grade untouched release", ROOT / "chapters" / "rlhf_ppo.ipynb")):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            grade_notebook(path)
            times.append(time.perf_counter() - t0)
        rows.append((label, times))
    for label, times in rows:
        print(f"{label:40s} median {statistics.median(times):6.1f} s   runs {', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    main()
