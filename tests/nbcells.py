"""Finding a notebook's cells by what they are, never by a heading, a phrase or a position."""

import ast


def defines(source: str) -> set[str]:
    """The functions and classes a code cell's source defines at top level (empty if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
