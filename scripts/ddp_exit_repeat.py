"""Run the 2-rank DDP job many times under torchrun and count the runs that crashed (e.g. SIGABRT at exit).

    python scripts/ddp_exit_repeat.py [--runs 20] [--nproc 2]

Gloo + DDP can abort while the interpreter shuts down; ``mlbook_solutions.ddp.worker`` calls
``gc.collect()`` before ``destroy_process_group()`` to prevent it. torchrun (not the notebook's
``spawn`` helper, whose forked workers leave with ``os._exit``) exercises the real interpreter exit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [
        torchrun,
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        "-m",
        "mlbook_solutions.ddp",
        "--steps",
        "2",
        "--batch",
        "16",
    ]
    print("torchrun", " ".join(cmd[1:]))
    crashed = 0
    for i in range(1, args.runs + 1):
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True)
        bad = run.returncode != 0 or "SIGABRT" in run.stderr or "rank 1: checksum" not in run.stdout
        crashed += bad
        print(f"run {i:2d}: rc={run.returncode} {'CRASHED' if bad else 'ok'} ({time.perf_counter() - t0:.1f}s)", flush=True)
        if bad:
            print(run.stderr[-2000:])
    print(f"crashed at exit: {crashed}/{args.runs}")
    sys.exit(1 if crashed else 0)


if __name__ == "__main__":
    main()
