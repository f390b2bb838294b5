"""The code a notebook cell holds, read by name from the modules that define it (``mlbook build``).

A fragment's header names code instead of copying it: ``include="pkg.mod:A,b"`` (``object_source``:
the objects' source, ``imports`` for the module's imports) and ``stub=`` (the same with the bodies
of functions or of named methods wrapped in nbgrader's solution ``MARKERS``). A test cell's hidden
code is its graded check read from the checks module (``load_registry``, ``hidden_check``: the
check and every helper it needs, then its call).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

MARKERS = (
    "### BEGIN SOLUTION",
    "### END SOLUTION",
    "### BEGIN HIDDEN TESTS",
    "### END HIDDEN TESTS",
)


def _module_path(module: str) -> pathlib.Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find module {module!r}")
    return pathlib.Path(spec.origin)


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    named = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            named[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    named[target.id] = node
    return named


def _segment(lines: list[str], node: ast.stmt) -> list[str]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return lines[start - 1 : node.end_lineno]


def _imports(tree: ast.Module, lines: list[str], skip: set[str] = frozenset()) -> list[str]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) and not (
            isinstance(node, ast.ImportFrom) and node.module in ("__future__", *skip)
        ):
            if isinstance(node, ast.Import) and {a.name for a in node.names} <= skip:
                continue
            out += _segment(lines, node)
    return out


def _stubbed(lines: list[str], fn: ast.FunctionDef) -> list[str]:
    """The function's lines with its body (after the docstring and leading validate_* calls) marked as solution."""
    body = list(fn.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body.pop(0)
    while body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call):
        func = body[0].value.func
        if not (isinstance(func, ast.Name) and func.id.startswith("validate")):
            break
        body.pop(0)
    first = body[0].lineno
    seg_start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    seg = _segment(lines, fn)
    split = first - seg_start
    indent = re.match(r"\s*", seg[split]).group(0)
    return seg[:split] + [indent + MARKERS[0]] + seg[split:] + [indent + MARKERS[1]]


def object_source(spec: str, stub: bool = False, stub_methods: str = "") -> tuple[str, list[str]]:
    """``"pkg.mod:A,b"`` -> (source text, names). ``imports`` as a name gives the module's imports.

    With ``stub`` the bodies of functions (for a class: of the methods in ``stub_methods``) are
    wrapped in solution markers.
    """
    module, names = spec.split(":")
    path = _module_path(module)
    text = path.read_text()
    lines, tree = text.splitlines(), ast.parse(text)
    named = _top_level(tree)
    chunks = []
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    for name in wanted:
        if name == "imports":
            chunks.append("\n".join(_imports(tree, lines)))
            continue
        if name not in named:
            raise ValueError(f"{module} has no top-level {name!r}")
        node = named[name]
        if stub and isinstance(node, ast.FunctionDef):
            chunks.append("\n".join(_stubbed(lines, node)))
        elif stub and isinstance(node, ast.ClassDef):
            seg = _segment(lines, node)
            offset = node.lineno - 1
            methods = {m.strip() for m in stub_methods.split(",")}
            for item in sorted(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in methods),
                key=lambda n: -n.lineno,
            ):
                a, b = item.lineno - 1 - offset, item.end_lineno - offset
                seg[a:b] = _stubbed(lines, item)
            chunks.append("\n".join(seg))
        else:
            chunks.append("\n".join(_segment(lines, node)))
    return "\n\n\n".join(chunks), wanted


def load_registry(path: pathlib.Path) -> dict:
    """The graded checks declared with ``@graded`` in the checks module ``path``: grade id -> ``Check``."""
    spec = importlib.util.spec_from_file_location("mlbook_graded_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CHECKS


def hidden_check(check, path: pathlib.Path) -> str:
    """The source of ``check`` (its decorator left out) plus every helper it needs, in file order,
    then its call; ``path``: the checks module it is declared in."""
    text = path.read_text()
    lines, tree = text.splitlines(), ast.parse(text)
    named = _top_level(tree)
    start = check.fn.__name__
    needed, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in needed or name not in named:
            continue
        needed.add(name)
        node = named[name]
        parts = [node] if not getattr(node, "decorator_list", None) else [*node.body, node.args]
        todo += [n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)]
    body = [stmt for stmt in tree.body if stmt in {named[n] for n in needed}]

    def segment(stmt):  # without the @graded line: the notebook has no registry
        return "\n".join(
            lines[stmt.lineno - 1 : stmt.end_lineno]
            if stmt is named[start]
            else _segment(lines, stmt)
        )

    parts = ["\n".join(_imports(tree, lines, skip={"inspect", "dataclasses"}))] + [
        segment(s) for s in body
    ]
    call = check.call_source()
    quiet_call = f"with warnings.catch_warnings():\n    warnings.simplefilter('ignore')\n    {call}"
    return "\n\n\n".join(parts + [quiet_call])
