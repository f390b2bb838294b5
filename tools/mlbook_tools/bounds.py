"""A submission's JSON, bounded before it is parsed: one linear scan in C-speed passes (numpy).

Parsing is where an adversarial notebook costs the trusted side its time and memory: 18 MB of empty
dicts ``{}`` in one cell's metadata are six million Python objects, parsed, copied and validated
(two minutes and more). So before ``json.loads`` sees anything, ``scan`` reads the raw bytes once:

* which bytes lie inside strings (a quote not escaped toggles; escapes are paired first), and the
  nesting depth after every byte (``{``/``[`` outside strings open, ``}``/``]`` close);
* the JSON values of the file, counted as its ``{``, ``[`` and ``,`` outside strings (every value is
  one of these or the first item of a container);
* the top-level keys and, in the ``cells`` list, each cell's keys with the byte span of their
  values. ``nbformat`` must be 4: an nbformat 3 notebook (``worksheets``, code in ``input``) is
  refused with one line saying how to convert it (JupyterLab saves nbformat 4), never converted here.

What a notebook stores beside its code (each cell's ``outputs``, ``attachments`` and ``metadata``,
and the notebook's ``metadata``) is never graded: the grader re-executes the code. Such a part is
kept while the parts so far fit ``max_output_bytes`` bytes, ``max_json_values`` values and
``max_json_depth`` levels; a part that does not fit is replaced by an empty one (a cell's metadata
keeps its ``nbgrader`` entry, how the grader matches it to the course's cell) and a note says so.
Everything else (the structure, the cells' sources) past a bound refuses the file ("too large: ...")
as before: that is what cannot be graded. The text that is parsed is the kept one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from mlbook_tools.errors import CannotGrade, TooLarge
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits

STORED = {"outputs": b"[]", "attachments": b"{}", "metadata": b"{}"}  # kind -> its empty value
MAX_KEYS_PER_CELL = 16  # nbformat 4 cells have at most 7 keys; far more is not a notebook
MAX_TOP_KEYS = 64  # a notebook has 4 top-level keys
# a cell's nbgrader metadata kept from a stripped metadata (the course's: ~150 bytes)
NBGRADER_BYTES = 4096
V3 = "nbformat {version} notebook: open and save it in JupyterLab to convert it"
_NBGRADER = re.compile(rb'"nbgrader"\s*:')


class OldFormat(TooLarge):
    """Not nbformat 4 (an nbformat 3 notebook): refused before it is parsed, as a file past a bound."""


def mb(n: int) -> str:
    return f"{n / 1024**2:.1f} MB"


@dataclass
class Scanned:
    """What ``scan`` found: the text to parse and what was left out of it."""

    text: bytes
    values: int  # JSON values of the original file
    kept_values: int  # of ``text``
    notes: list[str] = field(default_factory=list)  # one per stripped part, for the instructor


@dataclass
class _Part:
    kind: str  # "outputs", "attachments", "metadata"
    cell: int | None  # its cell's number (1-based), None for the notebook's metadata
    start: int  # the value's bytes: raw[start:end]
    end: int
    nbytes: int = 0
    values: int = 0
    depth: int = 0  # deepest nesting inside, counted from the notebook's root


class _Layout:
    """The byte-level structure of one JSON text (numpy arrays over its bytes)."""

    def __init__(self, raw: bytes):
        self.raw = raw
        # an escaped backslash, then an escaped quote, hidden: every quote left toggles a string
        plain = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")
        self.plain = plain
        a = np.frombuffer(plain, dtype=np.uint8)
        outside = np.bitwise_xor.accumulate((a == 34).view(np.uint8)) == 0
        self.opens = ((a == 123) | (a == 91)) & outside
        closes = ((a == 125) | (a == 93)) & outside
        self.commas = (a == 44) & outside
        self.colons = (a == 58) & outside
        self.closes = closes
        self.depth = self.opens.astype(np.int32)  # after each byte: containers open (in place)
        self.depth -= closes
        np.cumsum(self.depth, out=self.depth)

    def count(self, start: int, end: int) -> int:
        """JSON values in raw[start:end] (its containers and its commas)."""
        return int(
            np.count_nonzero(self.opens[start:end]) + np.count_nonzero(self.commas[start:end])
        )

    def keys(self, start: int, end: int, depth: int) -> list[tuple[str, int]]:
        """(name, colon position) of the keys of the objects at ``depth`` within raw[start:end]."""
        at = np.flatnonzero(self.colons[start:end] & (self.depth[start:end] == depth)) + start
        return [(self.key_before(int(p)), int(p)) for p in at]

    def key_before(self, colon: int) -> str:
        q1 = self.plain.rfind(b'"', 0, colon)
        q0 = self.plain.rfind(b'"', 0, q1)
        text = self.raw[q0 : q1 + 1]
        try:
            name = json.loads(text) if b"\\" in text else text[1:-1].decode()
        except ValueError:
            return ""
        return name if isinstance(name, str) else ""

    def value_end(self, terminators: np.ndarray, colon: int) -> int:
        """The end of the value after ``colon``: its object's next ``,`` or its closing brace."""
        i = int(np.searchsorted(terminators, colon))
        return int(terminators[i]) if i < len(terminators) else len(self.raw)

    def terminators(self, start: int, end: int, depth: int) -> np.ndarray:
        """Where a member of an object at ``depth`` ends, within raw[start:end]."""
        d = self.depth[start:end]
        ends = (self.commas[start:end] & (d == depth)) | (self.closes[start:end] & (d == depth - 1))
        return np.flatnonzero(ends) + start


def _nbgrader(layout: _Layout, part: _Part) -> bytes | None:
    """The ``nbgrader`` entry of a cell's metadata (keys at depth 4), if small and shallow, else None."""
    for n, match in enumerate(_NBGRADER.finditer(layout.plain, part.start, part.end)):
        if n >= 100:  # a metadata made to be searched forever: nothing of it is kept
            return None
        colon = match.end() - 1
        if int(layout.depth[colon]) != 4:
            continue
        window = min(part.end, colon + NBGRADER_BYTES + 2)
        ends = layout.terminators(colon, window, 4)
        if not len(ends):
            return None  # larger than any nbgrader entry
        end = int(ends[0])
        if (
            layout.count(colon + 1, end) > 64
            or int(layout.depth[colon + 1 : end].max(initial=0)) > 6
        ):
            return None
        return layout.raw[colon + 1 : end].strip()
    return None


def scan(raw: bytes, limits: GradingLimits = DEFAULT_LIMITS) -> Scanned:
    """``raw`` bounded before parsing: the text to parse, or TooLarge / CannotGrade (see the module)."""
    if not raw.strip():
        raise CannotGrade("the file is not a readable notebook (JSONDecodeError: it is empty)")
    layout = _Layout(raw)
    depth = layout.depth
    if int(depth[-1]) != 0 or int(depth.min()) < 0:
        raise CannotGrade(
            "the file is not a readable notebook (JSONDecodeError: its brackets do not balance)"
        )
    values = layout.count(0, len(raw))
    n_top = int(np.count_nonzero(layout.colons & (depth == 1)))
    if n_top > MAX_TOP_KEYS:
        raise CannotGrade(f"the file is not a readable notebook ({n_top} keys at its top level)")
    top = layout.keys(0, len(raw), 1)
    top_ends = layout.terminators(0, len(raw), 1)
    parts: list[_Part] = []
    for name, colon in top:
        end = layout.value_end(top_ends, colon)
        if name == "nbformat":
            version = raw[colon + 1 : end].strip()[:20].decode(errors="replace")
            if version != "4":
                raise OldFormat(V3.format(version=version))
        elif name == "metadata":
            parts.append(_Part("metadata", None, colon + 1, end))
        elif name == "cells":
            parts += _cell_parts(layout, colon + 1, end, limits)
    return _keep(layout, parts, values, limits)


def _cell_parts(layout: _Layout, start: int, end: int, limits: GradingLimits) -> list[_Part]:
    """The stored parts of every cell in the ``cells`` list raw[start:end]."""
    cell_starts = np.flatnonzero(layout.opens[start:end] & (layout.depth[start:end] == 3)) + start
    if len(cell_starts) > limits.max_cells:
        raise TooLarge(
            f"too large: {len(cell_starts)} cells (limit {limits.max_cells}); nothing was run"
        )
    n_keys = int(np.count_nonzero(layout.colons[start:end] & (layout.depth[start:end] == 3)))
    if n_keys > MAX_KEYS_PER_CELL * (len(cell_starts) + 1):
        raise CannotGrade(
            f"the file is not a readable notebook ({n_keys} keys in {len(cell_starts)} cells)"
        )
    keys = layout.keys(start, end, 3)
    ends = layout.terminators(start, end, 3)
    parts = []
    for name, colon in keys:
        if name in STORED:
            cell = int(np.searchsorted(cell_starts, colon))
            parts.append(_Part(name, cell, colon + 1, layout.value_end(ends, colon)))
    return parts


def _keep(layout: _Layout, parts: list[_Part], values: int, limits: GradingLimits) -> Scanned:
    """Refuse what cannot be graded, strip the stored parts that do not fit, splice the rest."""
    raw, depth = layout.raw, layout.depth
    stored = np.zeros(len(raw), dtype=bool)
    for part in parts:
        part.nbytes = part.end - part.start
        part.values = layout.count(part.start, part.end)
        part.depth = int(depth[part.start : part.end].max(initial=0))
        stored[part.start : part.end] = True
    core_depth = int(depth[layout.opens & ~stored].max(initial=0))
    if core_depth > limits.max_json_depth:
        raise TooLarge(
            f"too large: JSON nested more than {limits.max_json_depth} levels deep; nothing was run"
        )
    core_values = values - sum(p.values for p in parts)
    if core_values > limits.max_json_values:
        raise TooLarge(
            f"too large: {core_values} JSON values outside stored outputs and metadata "
            f"(limit {limits.max_json_values}); nothing was run"
        )
    left_values, left_bytes = limits.max_json_values - core_values, limits.max_output_bytes
    pieces, at, notes, kept_values = [], 0, [], core_values
    for part in sorted(parts, key=lambda p: p.start):
        fits = (
            part.depth <= limits.max_json_depth
            and part.values <= left_values
            and part.nbytes <= left_bytes
        )
        if fits:
            left_values -= part.values
            left_bytes -= part.nbytes
            kept_values += part.values
            continue
        empty = STORED[part.kind]
        if part.kind == "metadata" and part.cell is not None:
            if (entry := _nbgrader(layout, part)) is not None:
                empty = b'{"nbgrader": ' + entry + b"}"
        pieces += [raw[at : part.start], empty]
        at = part.end
        kept_values += 1
        where = f"cell {part.cell}'s" if part.cell is not None else "the notebook's"
        notes.append(
            f"{where} stored {part.kind} ({mb(part.nbytes)}, {part.values} JSON values, "
            f"{part.depth} levels deep) left out: past the bounds on what a notebook stores "
            "beside its code (the grader runs the code, it never reads them)"
        )
    text = b"".join([*pieces, raw[at:]]) if pieces else raw
    return Scanned(text, values, kept_values, notes)
