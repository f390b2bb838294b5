"""Check your work before you hand it in: every visible check of the notebook, in one summary.

    from mlbook.selfcheck import check
    check()                      # this kernel's notebook; or check("path/to/notebook.ipynb")

Runs every visible check of the notebook file (the check cell after each function and the visible
part of the graded cells; the file is only read, never written) against the functions defined in
the running kernel, and prints one line per check: ✓, or what is wrong. The hidden tests are not
in a student's copy: they run when the course grades the notebook. With the full checkout, the
same grading runs on your saved notebook with the command this prints (it uses the kernel's own
interpreter, so it works from a notebook cell, ``!...``, or from any terminal).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import pathlib
import sys
import warnings


def _check_cells(path: pathlib.Path) -> list[tuple[str, str, bool]]:
    """(name, source, holds hidden tests) of every visible check, in notebook order.

    A visible check is a read-only code cell with an ``assert`` that runs on your answers: the check
    cell after each function (tagged ``raises-exception`` until the answers exist) and the visible
    part of a graded cell. The name says which answer it checks, or, for a check after the prose,
    the section it is in and the functions of yours it calls (never a cell number: cells move).
    """
    out, last, previous_was_answer, section, answers = [], None, False, "the notebook", set()
    for cell in json.loads(path.read_text()).get("cells", []):
        meta = cell.get("metadata", {})
        nbg = meta.get("nbgrader", {})
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") == "markdown":
            heading = next((ln for ln in src.split("\n") if ln.startswith("#")), None)
            if heading:
                section = heading.lstrip("#").strip()
            continue
        if cell.get("cell_type") != "code":
            continue
        if nbg.get("solution"):
            last, previous_was_answer = nbg.get("grade_id"), True
            answers |= _defined(src)
            continue
        graded = bool(nbg.get("grade"))
        try:
            asserts = any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(src)))
        except SyntaxError:
            asserts = False
        if asserts and (graded or "raises-exception" in meta.get("tags", [])):
            if graded:
                name = nbg.get("grade_id", f"graded check in {section}")
            elif previous_was_answer:
                name = f"check of {last}"
            else:
                used = sorted(answers & _called(src))
                name = f"check in {section}" + (f" (uses {', '.join(used)})" if used else "")
            hidden = "hidden-tests" in meta.get("tags", [])  # the solved notebook
            out.append((name, src, hidden))
        previous_was_answer = False
    return out


def _defined(src: str) -> set[str]:
    try:
        body = ast.parse(src).body
        return {n.name for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    except SyntaxError:
        return set()


def _called(src: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def is_extra(name: str) -> bool:
    """An extra-credit check (grade ids ``ex*``, or the check cell after an ``ex*`` answer)."""
    return name.startswith("ex") or "of ex" in name


def summary(results: dict, not_run: list[str] = ()) -> str:
    """One count for "Check your work" and ``mlbook.handin``: every visible check of the notebook,
    the core and the extra credit said apart (a check not run here counts in the total)."""
    total = len(results) + len(not_run)
    passed = sum(v is None for v in results.values())
    line = f"{passed} of {total} visible checks pass"
    if not_run:
        line += f", {len(not_run)} not run here (the Check your work cell runs them)"
    parts = []
    for label, extra in (("core", False), ("extra credit", True)):
        ids = [k for k in [*results, *not_run] if is_extra(k) == extra]
        if ids:
            ok = sum(results.get(k, 0) is None for k in ids)
            parts.append(f"{label} {ok} of {len(ids)}")
    return line + (f" ({'; '.join(parts)})." if parts else ".")


def _namespace() -> dict:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:
        raise RuntimeError("run check() in the notebook's kernel, after running the cells above")
    return shell.user_ns


def assignment_of(nb: dict) -> str | None:
    """The assignment a notebook belongs to: the name ``mlbook build`` writes in its metadata."""
    name = ((nb.get("metadata") or {}).get("mlbook") or {}).get("assignment")
    ok = isinstance(name, str) and name.replace("_", "").replace("-", "").isalnum()
    return name if ok else None


def this_notebook(
    namespace: dict | None = None, folder: pathlib.Path | None = None
) -> pathlib.Path:
    """The notebook being worked on: the kernel's own (Jupyter names it in ``__session__``), or
    the one notebook in ``folder`` (default: the working folder) named after its assignment."""
    session = (namespace or {}).get("__session__")
    if isinstance(session, str) and session.endswith(".ipynb") and pathlib.Path(session).is_file():
        return pathlib.Path(session)
    folder = pathlib.Path.cwd() if folder is None else folder
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        try:
            name = assignment_of(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue
        if name is not None and path.name == f"{name}.ipynb":
            found.append(path)
    if len(found) != 1:
        what = "no assignment notebook" if not found else f"{len(found)} assignment notebooks"
        raise FileNotFoundError(f"{what} in {folder}: give the path of your notebook")
    return found[0]


def check(
    notebook: str | pathlib.Path | None = None,
    namespace: dict | None = None,
    definitions_only: bool = False,
) -> dict:
    """Run the visible checks of ``notebook`` (default: :func:`this_notebook`) in ``namespace``
    (default: this kernel), print them.

    Returns {grade_id: None if the check passed, else its message}. With ``definitions_only`` (the
    namespace holds the file's imports, functions and classes, nothing it computed: in a terminal,
    ``mlbook.handin``) a check that needs a value the notebook's run computes is listed as not run.
    """
    ns = _namespace() if namespace is None else namespace
    try:
        path = pathlib.Path(notebook) if notebook is not None else this_notebook(ns)
    except FileNotFoundError as err:  # said, not raised: Run All goes on
        print(f"{err}: run check('path/to/your/notebook.ipynb')")
        return {}
    if not path.exists():  # said, not raised: Run All goes on, and the line says what to do
        print(f"{path.resolve()} not found: run check('path/to/your/notebook.ipynb')")
        return {}
    results, not_run, hidden_seen = {}, [], False
    for grade_id, src, hidden in _check_cells(path):
        hidden_seen |= hidden
        if hidden:  # a solved notebook: its test cells already ran the hidden tests above
            continue
        extra = " (extra credit)" if is_extra(grade_id) else ""
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                # a copy of the namespace: a check's own variables (e.g. a tensor named like one of
                # your functions) never replace your definitions, nor leak into the next check
                exec(compile(src, f"<check {grade_id}>", "exec"), dict(ns))  # noqa: S102 - the notebook's own cell
            results[grade_id] = None
            print(f"✓ {grade_id}{extra}")
        except NameError as err:
            if not definitions_only:
                results[grade_id] = f"NameError: {err}"
                print(f"✗ {grade_id}{extra}: NameError: {err} (run the cells above first)")
                continue
            not_run.append(grade_id)
            print(f"- {grade_id}{extra}: not run here (it needs the notebook's run: {err})")
        except Exception as err:  # noqa: BLE001 - report every check, not only the first failure
            message = f"{type(err).__name__}: {err}".strip().split("\n")[0][:300]
            results[grade_id] = message
            print(f"✗ {grade_id}{extra}: {message}")
    print("\n" + summary(results, not_run), end=" ")
    if definitions_only:
        print()
        return results
    if hidden_seen:
        print("This notebook holds the hidden tests; they ran in its graded cells.")
        return results
    print(
        "The hidden tests are not in your copy: they run when the notebook is graded, and they "
        "probe more cases than these checks. Written answers are graded by a person."
    )
    if importlib.util.find_spec("mlbook_tools") is not None:  # the full checkout: grade it yourself
        print(
            "Grade your saved notebook as the course will (save first, Ctrl+S), in a cell (with !) "
            f"or a terminal:\n    !{sys.executable} -m mlbook_tools.cli grade {path.resolve()}"
        )
    return results
