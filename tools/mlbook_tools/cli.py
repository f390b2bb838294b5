"""``mlbook``: build the notebooks from their sources, grade one notebook, or grade a class.

mlbook start [DIR]                           copy the released notebooks to your own folder (default
                                             ~/<course id>-work); no other command ever writes there
mlbook build [--check]                       generate autograde/source, chapters/ and solutions/notebooks
                                             (executes the solved notebooks to record the outputs nbval checks)
mlbook grade PATH.ipynb [--json]             grade one notebook with the sandboxed engine (no gradebook)
mlbook handin [PATH.ipynb]                   check your saved notebook, run the visible checks, write
                                             to-upload/<name>.ipynb beside it (python -m mlbook.handin)
mlbook student-dist [--out D]                write what students get: the library wheel and the released notebooks
mlbook new-course DIR                        create an nbgrader course folder (config + source notebook)
mlbook grade-class [--course DIR] [--workers N] [--force]
                                             grade every submission of an nbgrader course into its gradebook
mlbook limits [--markdown]                   every grading limit, its default and what it bounds
mlbook doctor                                can this machine grade safely: bubblewrap, seccomp, the
                                             cgroup back end (v1/v2, delegated or not), user namespaces
mlbook hub --instructor U --students A,B     (root) a JupyterHub course on this machine: users, exchange,
                                             the course folder, both environments (README "On a JupyterHub")

`--assignment NAME` (grade, grade-class) names one of pyproject.toml's [tool.mlbook.assignments];
the default is the first there (config.py).

Grading runs student code only inside a bubblewrap sandbox; if the sandbox cannot start, grading
stops and says why. --no-sandbox (or MLBOOK_TRUSTED=1) runs it unconfined, for trusted files only.

Grading limits (time, memory, sizes; mlbook_tools/limits.py) come from the course config
(c.SandboxedExecute.limits in nbgrader_config.py), then `--limit NAME=VALUE` (repeatable) on
`grade` and `grade-class` (`--budget S` is `--limit budget_seconds=S`). An unknown name is
refused. `mlbook limits` lists them.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one command; anything that stops it is one line on stderr (exit 1), never a traceback."""
    # nbgrader runs `alembic` as a program: this interpreter's bin/ first, activated venv or not.
    bindir = str(pathlib.Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one clear line, the class of problem and what to do
        from mlbook_tools.workcopy import HoldsAnswers

        name = "refused" if isinstance(err, HoldsAnswers) else "error"
        print(f"{name}: {err}".replace("\n", " ").strip()[:2000], file=sys.stderr)
        return 1


def script() -> None:
    """The ``mlbook`` command. ``mlbook grade``, which a student runs again and again, then leaves
    without tearing the interpreter down (torch's teardown alone is ~0.4 s of a 4 s command): its
    sandbox is closed and nothing it wrote is open by then; the output is flushed first."""
    code = main()
    if sys.argv[1:2] == ["grade"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mlbook", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="generate every notebook form from solutions/chapter")
    b.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a generated file is stale"
    )
    b.add_argument(
        "--no-execute",
        action="store_true",
        help="keep the stored outputs of unchanged checked cells",
    )
    st = sub.add_parser("start", help="copy the released notebooks into your own work folder")
    st.add_argument(
        "dir", nargs="?", default=None, help="your folder (default: ~/<course id>-work)"
    )
    h = sub.add_parser("handin", help="check your saved notebook and write the file to upload")
    h.add_argument("path", nargs="?", default=None, help="default: the assignment's <name>.ipynb")
    nc = sub.add_parser("new-course", help="create an nbgrader course folder outside the checkout")
    nc.add_argument("dir")
    g = sub.add_parser("grade", help="grade one notebook with the sandboxed engine")
    g.add_argument("path")
    g.add_argument("--assignment", default=None, help="default: the first configured")
    _budget_option(g, "--timeout")
    _limit_option(g)
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument(
        "--no-sandbox", action="store_true", help="run the code unconfined (trusted files only)"
    )
    c = sub.add_parser(
        "grade-class", help="grade every submission of an nbgrader course, in parallel"
    )
    c.add_argument(
        "--course", default=None, help="the nbgrader course folder (default: the repo's autograde/)"
    )
    c.add_argument("--assignment", default=None, help="default: the first configured")
    c.add_argument(
        "--workers", type=int, default=None, help="parallel gradings (default: the number of cores)"
    )
    c.add_argument(
        "--force", action="store_true", help="regrade submissions already graded and unchanged"
    )
    _budget_option(c)
    _limit_option(c)
    c.add_argument(
        "--no-sandbox", action="store_true", help="run the code unconfined (trusted files only)"
    )
    d = sub.add_parser(
        "student-dist", help="write the student distribution (library wheel + released notebooks)"
    )
    d.add_argument(
        "--out", default=None, help="output folder (default: [tool.mlbook] student-dist)"
    )
    h = sub.add_parser(
        "hub", help="set up and run the course on a JupyterHub on this machine (root)"
    )
    h.add_argument(
        "--dir", default="/srv/mlbook-hub", help="the hub's folder (exchange, environments, config)"
    )
    h.add_argument("--instructor", required=True, help="the instructor's user name")
    h.add_argument("--students", required=True, help="comma-separated user names")
    h.add_argument(
        "--passwords",
        default=None,
        help="file of user:password lines (PAM passwords, via chpasswd)",
    )
    h.add_argument("--ip", default="127.0.0.1")
    h.add_argument("--port", type=int, default=8000)
    h.add_argument("--setup-only", action="store_true", help="set up, do not start the hub")
    lim = sub.add_parser("limits", help="every grading limit, its default and what it bounds")
    lim.add_argument(
        "--markdown", action="store_true", help="as the README's table (generated from the fields)"
    )
    sub.add_parser(
        "doctor", help="can this machine grade safely: sandbox, seccomp, cgroup back end"
    )
    args = ap.parse_args(argv)

    if args.command == "doctor":
        from mlbook_tools.doctor import report

        return report()

    if args.command == "limits":
        from mlbook_tools.limits import help_text, markdown_table

        print(markdown_table() if args.markdown else help_text(), end="\n" * (not args.markdown))
        return 0

    if args.command == "hub":
        from mlbook_tools import hub
        from mlbook_tools.config import layout

        folder = pathlib.Path(args.dir)
        students = [s.strip() for s in args.students.split(",") if s.strip()]
        pw = pathlib.Path(args.passwords) if args.passwords else None
        course = hub.setup(folder, args.instructor, students, args.ip, args.port, pw)
        for path in hub.exposed(layout().root):
            print(
                f"warning: every user of this machine, students too, can read {path} (the reference "
                f"solutions, the graded checks): chmod o-rwx {layout().root}, or keep the checkout "
                "under /root",
                file=sys.stderr,
            )
        print(
            f"course folder {course} (user {args.instructor}); exchange {folder.resolve() / 'exchange'}"
        )
        if args.setup_only:
            print(
                f"start the hub: mlbook hub ... (or jupyterhub -f {folder.resolve() / 'jupyterhub_config.py'})"
            )
            return 0
        print(f"JupyterHub on http://{args.ip}:{args.port} (Ctrl+C stops it)")
        hub.serve(folder.resolve())  # never returns
        return 0

    if args.command == "start":
        from mlbook_tools.workcopy import start

        out, copied, kept = start(args.dir)
        for name in copied:
            print(f"copied {name} to {out}")
        for name in kept:
            print(f"kept your {out / name} (never overwritten)")
        from mlbook_tools.config import assignment
        from mlbook_tools.workcopy import lab_command

        print(f"work there: {lab_command(out, f'{assignment().name}.ipynb')}")
        return 0
    if args.command == "handin":
        from mlbook.handin import main as handin_main

        return handin_main([args.path] if args.path else [])
    if args.command == "new-course":
        from mlbook_tools.course import new_course

        out = new_course(args.dir)
        print(_next_commands(out))
        return 0
    if args.command == "student-dist":
        from mlbook_tools.dist import student_dist

        print(f"wrote {student_dist(args.out)}")
        return 0
    if args.command == "build":
        from mlbook_tools.build import build
        from mlbook_tools.progress import stage

        stage("mlbook build: checking that no generated file holds someone's work")

        return build(check=args.check, execute=not args.no_execute)

    from mlbook_tools import confine  # light: torch and nbformat come with the engine, later
    from mlbook_tools.errors import CannotGrade, SandboxUnavailable
    from mlbook_tools.grading import course_limits

    trusted = confine.trusted_mode(args.no_sandbox)
    if trusted:
        print(
            "warning: grading WITHOUT the sandbox (--no-sandbox / MLBOOK_TRUSTED=1): trusted files only",
            file=sys.stderr,
        )
    if args.command == "grade-class":
        from mlbook_tools.classgrade import grade_class
        from mlbook_tools.classreport import class_summary

        course = _course_folder(args.course)
        limits = course_limits(course).with_options(_limit_changes(args))
        try:
            results = grade_class(
                course,
                args.assignment,
                args.workers,
                args.force,
                trusted,
                limits=limits,
            )
        except SandboxUnavailable as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return class_summary(results)

    from mlbook_tools.config import layout
    from mlbook_tools.grading import grade_notebook
    from mlbook_tools.progress import stage

    limits = course_limits(layout().course).with_options(_limit_changes(args))
    _without_iri_grammar()

    stage(
        f"grading {args.path}: the course's checks, then your answers in the sandbox (about a minute)"
    )
    if not trusted:
        from mlbook_tools.cgroups import refusal_note

        if note := refusal_note():
            print(note, file=sys.stderr)
    try:
        result = grade_notebook(args.path, args.assignment, trusted=trusted, limits=limits)
    except SandboxUnavailable as err:
        print(
            f"error: {err}\nGrading stopped: use --no-sandbox only for a notebook you trust.",
            file=sys.stderr,
        )
        return 2
    except (CannotGrade, FileNotFoundError) as err:
        said = str(err)  # names the file once ("cannot read <path>: ..." already does)
        print(
            f"error: {said if str(args.path) in said else f'cannot grade {args.path}: {said}'}",
            file=sys.stderr,
        )
        return 1
    stage(f"graded in {result.seconds or 0:.0f} s")
    if args.json:
        print(result.to_json(indent=2))
    else:
        print_report(result)
    return 1 if result.error else 0


def _without_iri_grammar() -> None:
    """jsonschema (which nbformat imports) imports ``rfc3987_syntax`` if it can, and that package
    compiles its lark grammars at import: about 0.7 s of CPU on a quiet machine, a third of what
    ``mlbook grade`` spends outside the sandbox. It serves only a format checker's "iri" formats;
    nbformat validates without a format checker (and its schemas name no format), so this process
    never uses it. Marked absent (jsonschema then leaves those two formats unchecked), here only."""
    sys.modules.setdefault("rfc3987_syntax", None)


def _budget_option(parser, *aliases: str) -> None:
    """``--budget S``: the one command-line spelling of ``budget_seconds`` (``--timeout``: the old
    name on ``mlbook grade``, kept as an alias)."""
    parser.add_argument(
        "--budget",
        *aliases,
        dest="budget",
        type=float,
        default=None,
        metavar="S",
        help="budget_seconds: seconds of the sandbox's own time for the whole submission (CPU, or "
        "running or sleeping; not waiting for a busy machine's CPUs); the wall-clock backstop is "
        "wall_factor x it. Same as --limit budget_seconds=S",
    )


def _limit_option(parser) -> None:
    """``--limit NAME=VALUE``; the command's ``--help`` ends with every limit (from the fields)."""
    from mlbook_tools.limits import help_text

    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change one grading limit (repeatable; over the course config's "
        "c.SandboxedExecute.limits); the names, defaults and meanings are listed below",
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "grading limits (NAME = default: what it bounds):\n" + help_text()


def _limit_changes(args) -> list[str]:
    """``--limit`` options, ``--budget`` last (it wins, as it did)."""
    budget = [f"budget_seconds={args.budget}"] if args.budget else []
    return list(args.limit) + budget


def _course_folder(given: str | None) -> pathlib.Path:
    """--course, else the working directory when it is a course folder; never the checkout's own
    autograde/ by accident (it has no submissions: "0 graded" would look like success)."""
    if given:
        return pathlib.Path(given)
    here = pathlib.Path.cwd()
    if (here / "nbgrader_config.py").is_file():
        return here
    raise ValueError(
        f"which course? {here} is not a course folder (no nbgrader_config.py). Run grade-class inside "
        "the course folder, or pass --course DIR; `mlbook new-course DIR` creates one"
    )


def _next_commands(out: pathlib.Path) -> str:
    """What an instructor types next, in order (README "Instructors"), with this checkout's tools."""
    from mlbook_tools.config import assignment

    bin_ = pathlib.Path(sys.executable).parent
    nbgrader, nb = bin_ / "nbgrader", assignment().name
    return (
        f"course folder {out}\nNext:\n"
        f"  cd {out}\n"
        f"  {nbgrader} generate_assignment {nb} --force   # release/{nb}/{nb}.ipynb\n"
        f"  # collect: put each submission at submitted/<student>/{nb}/{nb}.ipynb (nbgrader collect does;\n"
        f"  #   or {nbgrader} zip_collect {nb} from downloaded/{nb}/archive/<student>__{nb}.ipynb)\n"
        f"  {bin_ / 'mlbook'} grade-class                    # sandboxed; fills gradebook.db and autograded/\n"
        f"  {bin_ / 'jupyter'} lab                           # Nbgrader > Formgrader (as root: --allow-root)\n"
        f"  {nbgrader} generate_feedback {nb} --force   # feedback/<student>/...html (--force: a regrade reaches it)\n"
        f"  {nbgrader} export --to grades.csv\n"
        f"  {nbgrader} export --exporter mlbook_tools.export.WideCsvExport --to grades_wide.csv"
    )


def print_report(result) -> None:
    """Every check's message in the student's terms; manual cells marked as awaiting grading.

    Messages carry text from the student's code (an exception's message): control characters are
    replaced, so no escape sequence can rewrite what the terminal shows."""
    from mlbook_tools.inert import printable

    if result.error:
        print(f"cannot grade this file: {printable(result.error)}")
    for problem in result.problems or []:
        if problem != result.error:  # a refused file ("too large: ...") is said once, above
            print(f"note: {printable(problem)}")
    for name, g in result.grades.items():
        mark = "ok  " if g.passed else "FAIL"
        print(f"{mark} {name:50s} {g.score:4g} / {g.max_score:g}")
        if not g.passed:
            print("       " + printable(g.message or "").replace("\n", "\n       "))
    for name in [] if result.error else result.manual:  # a refused file lists none (as before)
        print(f"...  {name:50s} awaiting manual grading")
    for name in result.blank:
        print(f"-    {name:50s} left blank: 0, nothing to grade by hand")
    core = result.core
    print(
        f"core total: {core.score:g} / {core.max_score:g}    "
        + _part("extra credit", result.extra, waiting=not result.error)
    )


def _part(label: str, part, waiting: bool = True) -> str:
    """``extra credit: 3 / 9 (awaiting manual grading: 6 points)``: the numbers feedback and export
    show; a file that could not be graded has nothing awaiting a person (``waiting=False``)."""
    text = f"{label}: {part.score:g} / {part.max_score:g}"
    return text + (
        f" (awaiting manual grading: {len(part.awaiting_manual)} answers)"
        if part.awaiting_manual and waiting
        else ""
    )


if __name__ == "__main__":
    script()
