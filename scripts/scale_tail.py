"""The tail of grading and what one machine holds (docs/scale.md), measured on this machine.

    python scripts/scale_tail.py [--workers 2] [--budget 30] [--exhausting 10] [--styles 40]

1. Tail: one `grade-class` run over the fairness catalog's correct styles and the adversarial
   catalog's slow-but-honest entries (kind "slow", keeping every point); per-submission seconds as
   the engine reports them (charged seconds) and wall seconds per submission, p50/p95/p99.
   The honest class runs under the default limits (what an instructor runs).
2. Budget-exhausting submissions: N copies of a top-level endless loop (each spends its whole
   budget), graded alone at a small budget (--budget); the run's wall time next to N x budget /
   workers. They are independent jobs, so what they add to any class run scales with the budget.
3. One student's kernel in a synchronous lab: "Run all" on the solved notebook in a fresh kernel,
   its CPU seconds and peak resident memory (the kernel process, polled), hence students per core
   when everyone runs everything within a five-minute window.

Prints the load average before and after: on a shared machine every figure is an upper bound.
Not a test: timings are noisy. Uses the test suite's catalogs (tests/), read-only.
"""

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

import nbformat
import psutil
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.limits import GradingLimits
from nbclient import NotebookClient

ROOT = layout().root
sys.path.insert(0, str(ROOT / "tests"))
import adversarial_catalog as adv  # noqa: E402
import graded_class as gc  # noqa: E402
from fairness_styles import STYLES, style_notebook  # noqa: E402

LAB_WINDOW = 300.0  # seconds in which every student of a synchronous lab presses "Run all"


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


def honest_class(course: pathlib.Path, styles: int) -> dict[str, str]:
    base = nbformat.read(gc.SOLVED, as_version=4)
    subs = {
        f"style{k:02d}": nbformat.writes(style_notebook(base, style))
        for k, style in enumerate(list(STYLES.values())[:styles])
    }
    for name, entry in adv.ENTRIES.items():
        if entry["kind"] == "slow" and entry.get("lost") is None:
            subs[name] = gc.build_submission(entry, course)
    return subs


def run_class(root: pathlib.Path, subs: dict[str, str], limits, workers: int) -> tuple[dict, float]:
    course = gc.new_course(root)
    for student, text in subs.items():
        gc.submit(course, student, text)
    t0 = time.monotonic()
    with open(os.devnull, "w") as null:
        results = grade_class(
            course, gc.NB, workers=workers, progress=False, out=null, limits=limits
        )
    return results, time.monotonic() - t0


def kernel_run_all() -> tuple[float, float]:
    """CPU seconds and peak RSS (bytes) of a fresh kernel executing the solved notebook."""
    nb = nbformat.read(gc.SOLVED, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3")
    peak, stop = [0], threading.Event()
    with client.setup_kernel():
        proc = psutil.Process(client.km.provisioner.process.pid)

        def poll():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except psutil.Error:
                    return
                time.sleep(0.05)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        cpu0 = sum(proc.cpu_times()[:2])
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        stop.set()
        t.join()
    return cpu, float(peak[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--budget", type=float, default=30.0, help="budget of the exhausting run, seconds"
    )
    ap.add_argument("--exhausting", type=int, default=10)
    ap.add_argument("--styles", type=int, default=len(STYLES))
    args = ap.parse_args()
    limits = GradingLimits().replace(budget_seconds=args.budget)
    print(
        f"load average before: {os.getloadavg()}; {args.workers} workers, budget {args.budget:g} s"
    )
    with tempfile.TemporaryDirectory(prefix="scale-tail-") as tmp:
        tmp = pathlib.Path(tmp)
        subs = honest_class(tmp / "probe", args.styles)
        shutil.rmtree(tmp / "probe", ignore_errors=True)
        results, wall = run_class(tmp / "honest", subs, limits, args.workers)
        secs = [e.seconds for e in results.values()]
        lost = [  # lost points, or no grade at all
            s
            for s, e in results.items()
            if e.result is None or e.result.core.score != e.result.core.max_score
        ]
        print(
            f"1. {len(subs)} honest submissions in {wall:.0f} s wall ({wall * args.workers / len(subs):.1f} s per submission per worker)"
        )
        for q in (50, 95, 99):
            print(f"   p{q}: {percentile(secs, q):6.1f} s charged")
        print(
            f"   slowest: {max(results, key=lambda s: results[s].seconds)}; lost points: {lost or 'none'}"
        )
        loop = gc.build_submission(adv.ENTRIES["top_level_endless_loop"], tmp / "honest")
        more = {f"exhaust{k:02d}": loop for k in range(args.exhausting)}
        small = limits.replace(budget_seconds=args.budget)
        _, wall2 = run_class(tmp / "exhausting", more, small, args.workers)
        print(
            f"2. {args.exhausting} budget-exhausting submissions at a {args.budget:g} s budget: "
            f"{wall2:.0f} s wall (N x budget / workers = {args.exhausting * args.budget / args.workers:.0f} s); "
            f"at the default {limits.budget_seconds:g} s they add ~{wall2 * limits.budget_seconds / args.budget:.0f} s"
        )
    cpu, rss = kernel_run_all()
    print(
        f"3. Run all in one kernel: {cpu:.1f} CPU s, peak {rss / 2**20:.0f} MiB; a lab where everyone "
        f"runs everything within {LAB_WINDOW:.0f} s: {LAB_WINDOW / cpu:.0f} students per core, "
        f"{rss / 2**20:.0f} MiB each"
    )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
