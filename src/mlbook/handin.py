"""Hand in: check the saved notebook and write exactly the file to upload.

    python -m mlbook.handin NOTEBOOK.ipynb          # a terminal, in your work folder
    from mlbook.handin import handin; handin()      # or a cell of the notebook itself

Steps, each said in one line: the file is saved (in a cell: every answer the kernel runs is the one
in the saved file), named as the course expects (``<assignment>.ipynb``, the assignment that
``mlbook build`` wrote in the notebook's metadata; a copy such as ``<assignment>-Copy1.ipynb`` is
handed in under the expected name), still a readable notebook whose graded cells are all there
once, then the visible checks run (in a terminal: against the answers and definitions of the saved
file only; checks that need the notebook's run are left to the "Check your work" cell). Last it
writes ``to-upload/<assignment>.ipynb`` beside the notebook: the saved bytes, unchanged. Problems
with the file stop it before anything is written; failing checks do not (a partly done notebook
still earns the points of what works). Without a path: the kernel's own notebook in a cell, the
working folder's assignment notebook in a terminal.
"""

from __future__ import annotations

import ast
import json
import pathlib
import shutil
import sys
import time

UPLOAD_DIR = "to-upload"


class CannotHandIn(RuntimeError):
    """The saved file cannot be handed in as it is (unreadable, graded cells missing, unsaved)."""


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _python(src: str) -> str:
    """A cell's code with IPython's magics and ``!`` lines made plain Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(src)
    except ImportError:
        lines = src.split("\n")
        return "\n".join("pass" if ln.lstrip().startswith(("!", "%")) else ln for ln in lines)


def read_notebook(path: pathlib.Path) -> dict:
    """The notebook's JSON, or :class:`CannotHandIn` saying what is wrong with the file."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        why = f"{type(err).__name__}: {err}"
        raise CannotHandIn(f"{path} is not a readable notebook ({why})") from None
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        raise CannotHandIn(f"{path} is not a Jupyter notebook (nbformat 4)")
    seen, problems = set(), []
    for cell in nb["cells"]:
        meta = (cell.get("metadata") or {}).get("nbgrader")
        if not isinstance(meta, dict):
            continue
        gid = meta.get("grade_id")
        # an answer split in two (JupyterLab's Ctrl+Shift+- copies its metadata into both halves)
        # is graded whole, both halves in order; a second copy of a read-only or test cell is not
        if gid in seen and not meta.get("solution"):
            problems.append(f"the cell {gid!r} appears twice (delete the copy)")
        seen.add(gid)
        if cell.get("cell_type") == "code" and meta.get("solution"):
            try:
                ast.parse(_python(_source(cell)))
            except SyntaxError as err:
                where = f"line {err.lineno}: {err.msg}"
                problems.append(
                    f"your answer {gid!r} has a syntax error, {where} (to hand in the rest, "
                    "comment that cell's code out: select it, Ctrl+/, save)"
                )
    if not any(g for g in seen if g and g.startswith("test_")):
        problems.append("it has no graded cells: hand in your copy of the course's notebook")
    if problems:
        raise CannotHandIn(f"{path.name}: " + "; ".join(problems))
    return nb


def _defs(src: str) -> dict[str, str]:
    """Top-level function and class names of ``src`` -> their ast dump (code without comments)."""
    try:
        tree = ast.parse(_python(src))
    except SyntaxError:
        return {}
    return {
        n.name: ast.dump(n)
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }


def unsaved_answers(nb: dict, history: list[str]) -> list[str]:
    """Answers whose code in the kernel (its input ``history``, last definition wins) is not the
    code in the saved file: edited and not saved, or saved and not run again."""
    ran: dict[str, str] = {}
    for src in history:
        ran.update(_defs(src))
    out = []
    for cell in nb["cells"]:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if cell.get("cell_type") != "code" or not meta.get("solution"):
            continue
        for name, code in _defs(_source(cell)).items():
            if name in ran and ran[name] != code:
                out.append(name)
    return out


def _definitions(nb: dict) -> dict:
    """A namespace with every import, function and class of the saved file (nothing else runs)."""
    ns: dict = {"__name__": "__handin__"}
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(_python(_source(cell)))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef):
                try:
                    exec(compile(ast.Module([node], []), "<handin>", "exec"), ns)  # noqa: S102
                except Exception:  # noqa: BLE001 - a definition that needs the run: its checks say so
                    pass
    return ns


def handin(
    notebook: str | pathlib.Path | None = None,
    expected: str | None = None,
    namespace: dict | None = None,
) -> pathlib.Path:
    """Check ``notebook`` (default: :func:`mlbook.selfcheck.this_notebook`) and write
    ``to-upload/<expected>`` beside it (default: its assignment's name); returns that path."""
    from mlbook.selfcheck import assignment_of, check, is_extra, this_notebook

    if namespace is None:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        namespace = shell.user_ns if shell is not None else None
    if notebook is None:
        try:
            notebook = this_notebook(namespace)
        except FileNotFoundError as err:
            raise CannotHandIn(str(err)) from None
    path = pathlib.Path(notebook).expanduser().resolve()
    if not path.is_file():
        raise CannotHandIn(f"{path} not found: give the path of your notebook")
    saved = path.read_bytes()
    nb = read_notebook(path)
    if expected is None:
        name = assignment_of(nb)
        expected = f"{name}.ipynb" if name else path.name
    age = time.time() - path.stat().st_mtime
    print(f"✓ {path.name} is a readable notebook, saved {age / 60:.0f} min ago")
    if namespace is not None:
        stale = unsaved_answers(nb, list(namespace.get("In", [])))
        if stale:
            raise CannotHandIn(
                f"the saved file and this kernel disagree about {', '.join(stale)}: save (Ctrl+S), "
                "run all cells again (Run > Run All Cells), then hand in"
            )
        print("✓ every answer this kernel ran is the one in the saved file")
    else:
        print("  (save in JupyterLab first, Ctrl+S: this reads the file as it is on disk)")
    if path.name != expected:
        print(f"! the course expects the name {expected}; this file is {path.name}")
        print(f"  it is handed in under the expected name, {expected}")
    else:
        print(f"✓ named {expected}, as the course expects")
    print("Visible checks:")
    if namespace is None:
        results = check(path, _definitions(nb), definitions_only=True)
    else:
        results = check(path, namespace)
    out_dir = path.parent / UPLOAD_DIR
    out_dir.mkdir(exist_ok=True)
    target = out_dir / expected
    if target.exists() and target.read_bytes() != saved:  # an earlier hand-in: kept, renamed
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(target.stat().st_mtime))
        shutil.move(target, out_dir / f"{target.stem}.earlier-{stamp}{target.suffix}")
    target.write_bytes(saved)
    failed = [k for k, v in results.items() if v is not None]
    core = [k for k in failed if not is_extra(k)]
    if core:
        why = f" ({_count(core, 'core check')}: {', '.join(core)}; the notebook earns what works)"
    elif failed:
        why = f" (every core check passes; {_count(failed, 'extra-credit check')})"
    else:
        why = ""
    print(f"\nwrote {target}: upload this file{why}")
    return Written(target)


def _count(names: list[str], what: str) -> str:
    """``1 core check fails`` / ``2 core checks fail``."""
    return f"{len(names)} {what} fails" if len(names) == 1 else f"{len(names)} {what}s fail"


class Written(type(pathlib.Path())):
    """The path ``handin`` wrote: a ``pathlib.Path`` that a notebook cell shows as the plain path
    (``/home/you/work/to-upload/chapter.ipynb``), not as ``PosixPath('...')``."""

    def __repr__(self) -> str:
        return str(self)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m mlbook.handin [NOTEBOOK.ipynb]", file=sys.stderr)
        return 2
    try:
        handin(args[0] if args else None)
    except CannotHandIn as err:
        print(f"cannot hand in: {err}; nothing was written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
