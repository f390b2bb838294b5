"""``mlbook``: build the notebooks from their sources, or grade one notebook with nbgrader.

mlbook build [--check]          generate autograde/source, chapters/ and solutions/notebooks
                                (executes the solved notebooks to record the outputs nbval checks)
mlbook grade PATH.ipynb --json  autograde one notebook, print {"score", "max_score", "grades"}
mlbook student-dist [--out D]   write what students get: the library wheel and the released notebooks
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mlbook", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="generate every notebook form from solutions/chapter")
    b.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated file is stale")
    b.add_argument("--no-execute", action="store_true", help="keep the stored outputs of unchanged checked cells")
    g = sub.add_parser("grade", help="autograde one notebook with nbgrader")
    g.add_argument("path")
    g.add_argument("--assignment", default="rlhf_ppo")
    g.add_argument("--timeout", type=int, default=None, help="per-cell timeout in seconds (default: the course's)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    d = sub.add_parser("student-dist", help="write the student distribution (library wheel + released notebooks)")
    d.add_argument("--out", default=None, help="output folder (default: [tool.mlbook] student-dist)")
    args = ap.parse_args(argv)

    if args.command == "student-dist":
        from mlbook_tools.dist import student_dist

        print(f"wrote {student_dist(args.out)}")
        return 0
    if args.command == "build":
        from mlbook_tools.build import build

        return build(check=args.check, execute=not args.no_execute)
    from mlbook_tools.grading import grade_notebook

    result = grade_notebook(args.path, args.assignment, args.timeout)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, g in result["grades"].items():
            print(f"{name:50s} {g['score']:5.1f} / {g['max_score']:.1f}")
        print(f"{'core total':50s} {result['score']:5.1f} / {result['max_score']:.1f}")
        print(f"{'extra credit':50s} {result['extra_credit']['score']:5.1f} / {result['extra_credit']['max_score']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
