"""Tables in a notebook: ``show_table(columns, rows)`` renders them as Markdown tables, so a cell
says what its table holds instead of assembling Markdown text."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"^[-+−]?[\d.,]+(e[-+]?\d+)?%?$")


def _cell(value) -> str:
    text = str(value)
    if "\n" in text:
        raise ValueError(f"a table cell must be one line, got {text!r}")
    return text.replace("|", "&#124;")  # a | would end the cell early


def markdown_table(columns: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table: ``columns`` the header, ``rows`` one list of cells per row (numbers
    formatted by the caller). ``align``: one letter per column, ``l`` or ``r``; by default a column
    whose every cell is a number is right-aligned, any other left-aligned."""
    width = len(columns)
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} cells for {width} columns: {row!r}")
    cells = [[_cell(v) for v in row] for row in rows]
    if align is None:
        align = "".join(
            "r" if cells and all(_NUMBER.match(r[j]) for r in cells) else "l" for j in range(width)
        )
    if len(align) != width or set(align) - {"l", "r"}:
        raise ValueError(f"align must be one of l/r per column ({width}), got {align!r}")
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def show_table(columns: list[str], rows: list[list], align: str | None = None) -> None:
    """Display ``markdown_table(columns, rows, align)`` as the cell's output."""
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(columns, rows, align)))
