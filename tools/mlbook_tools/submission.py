"""Reading and bounding a submission: its file read at most ``max_notebook_bytes``, its text bounded
before it is parsed (``bounds.scan``: size, cells, sources, JSON values and nesting), then parsed as
nbformat 4. Any damage is ``CannotGrade`` (``TooLarge`` past a bound) for this student, never a crash.
"""

from __future__ import annotations

import json
import os
import warnings

import nbformat

from mlbook_tools.bounds import V3, OldFormat, scan
from mlbook_tools.errors import CannotGrade, TooLarge
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS
from mlbook_tools.limits import GradingLimits


def _mb(n: int) -> str:
    return f"{n / 1024**2:.1f} MB"


def read_submission(path, limits: GradingLimits = DEFAULT_LIMITS) -> str:
    """The text of a submission file; a file past ``max_notebook_bytes`` is refused without reading it whole."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(limits.max_notebook_bytes + 1)
    except OSError as err:
        raise CannotGrade(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    _check_raw(head, size, limits)
    return head.decode("utf-8", errors="replace")


def _check_raw(raw: bytes | str, size: int, limits: GradingLimits = DEFAULT_LIMITS) -> None:
    """Size and cell count of the raw text (milliseconds, nothing parsed): TooLarge past a bound."""
    key = b'"cell_type"' if isinstance(raw, bytes) else '"cell_type"'
    cells = raw[: limits.max_notebook_bytes + 1].count(
        key
    )  # a key; inside a JSON string its quotes are escaped
    more = "+" if size > len(raw) else ""
    if cells > limits.max_cells:
        raise TooLarge(
            f"too large: {cells}{more} cells (limit {limits.max_cells}), {_mb(size)}; nothing was run"
        )
    if size > limits.max_notebook_bytes:
        raise TooLarge(
            f"too large: {_mb(size)} (limit {_mb(limits.max_notebook_bytes)}); nothing was run"
        )


def _check_parsed(data, limits: GradingLimits = DEFAULT_LIMITS) -> None:
    """Exact cell count and source bytes of the parsed JSON (``bounds.scan`` bounded the rest)."""
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        return
    if len(cells) > limits.max_cells:
        raise TooLarge(f"too large: {len(cells)} cells (limit {limits.max_cells}); nothing was run")
    sources = 0
    for cell in cells:
        src = cell.get("source", "") if isinstance(cell, dict) else ""
        sources += (
            sum(len(s) for s in src if isinstance(s, str))
            if isinstance(src, list)
            else len(str(src))
        )
    if sources > limits.max_source_bytes:
        raise TooLarge(
            f"too large: {_mb(sources)} of cell sources (limit {_mb(limits.max_source_bytes)}); nothing was run"
        )


def bounded(text: str | bytes, limits: GradingLimits = DEFAULT_LIMITS) -> tuple[dict, list[str]]:
    """A submission's text, bounded before it is parsed (``bounds.scan``), then parsed: (its JSON,
    notes on what it stored beside its code that was left out). Every cell's metadata but its
    ``nbgrader`` entry (what matches it to the course's cell) is dropped before anything copies it.
    TooLarge past a bound on what is graded, CannotGrade for a file that is not a notebook."""
    _check_raw(text, len(text), limits)
    raw = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
    scanned = scan(raw, limits)
    try:
        data = json.loads(scanned.text.decode("utf-8", errors="surrogatepass"))  # a few MB at most
    except RecursionError:
        raise TooLarge(
            f"too large: JSON nested more than {limits.max_json_depth} levels deep; nothing was run"
        ) from None
    except ValueError as err:
        raise CannotGrade(
            f"the file is not a readable notebook ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    _check_parsed(data, limits)
    cells = data.get("cells") if isinstance(data, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and isinstance(cell.get("metadata"), dict):
            entry = cell["metadata"].get("nbgrader")
            cell["metadata"] = {"nbgrader": entry} if entry is not None else {}
    return data, scanned.notes


def check_bounds(text: str | bytes, limits: GradingLimits = DEFAULT_LIMITS) -> str:
    """Every bound of ``limits`` (max_*) on a submission's text, checked before it is parsed (TooLarge,
    CannotGrade); returns the text to read: what it stored beside its code past a bound left out."""
    data, _ = bounded(text, limits)
    return json.dumps(data, ensure_ascii=False)


def parse_submission(
    text: str, limits: GradingLimits = DEFAULT_LIMITS
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The student's notebook (nbformat 4), bounded before it is parsed (``bounded``), and the notes."""
    data, notes = bounded(text, limits)
    try:
        major, minor = nbformat.reader.get_version(data)
        if major != 4:
            raise OldFormat(V3.format(version=major))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbformat's notes about missing cell ids
            nb = nbformat.versions[4].to_notebook_json(data, minor=minor)
            try:
                nbformat.validate(nb)
            except nbformat.ValidationError:
                pass  # nbformat.reads only logs it: what the plan needs is checked there
        if not isinstance(nb.cells, list):
            raise ValueError("no cell list")
    except CannotGrade:
        raise
    except Exception as err:  # noqa: BLE001 - wrong schema, binary junk: all cannot-grade
        raise CannotGrade(
            f"the file is not a readable notebook ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    return nb, notes
