"""The outputs nbval compares (``make test``), as ``mlbook build`` stores them in the solved notebook.

A fragment cell tagged ``nbval-check-output`` (``CHECK_OUTPUT``) keeps its output in the solved
notebook: ``mlbook build`` executes the solved notebook and stores the outputs of those cells only
(``record_outputs``; every other cell stays unexecuted, so training curves, timings and figures
never enter the repository), with the parts that nbval's sanitizer masks already masked
(tests/nbval_sanitize.cfg), and nbval compares them with a fresh run. ``mlbook build --check``
does not execute anything: it reuses the stored outputs of checked cells whose source is unchanged
(``reuse_outputs``), so a checked cell that was never recorded, or whose source changed, shows up
as stale; whether the stored outputs still match the code is nbval's check.
"""

from __future__ import annotations

import pathlib
import re

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from mlbook_tools.config import layout

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CHECK_OUTPUT = "nbval-check-output"  # nbval compares this cell's stored output with a fresh run
NOT_RECORDED = "<output not recorded: run `mlbook build`>\n"
SANITIZER = "tests/nbval_sanitize.cfg"  # nbval's --nbval-sanitize-with file, relative to the root


def checked(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and CHECK_OUTPUT in cell.metadata.get("tags", [])


def _keep_checked_outputs(nb: nbformat.NotebookNode) -> None:
    """Drop every output but those of checked cells; number the checked cells 1, 2, ... (nbval
    compares only cells with an execution count; the numbers do not depend on other cells)."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if not checked(cell):
            cell.outputs, cell.execution_count = [], None
            continue
        n += 1
        cell.execution_count = n
        cell.outputs = coalesce_streams(cell.outputs)
        for out in cell.outputs:
            if out.output_type == "execute_result":
                out.execution_count = n


def coalesce_streams(outputs: list) -> list:
    """Consecutive stream outputs of one stream as one: the kernel splits a cell's printing into
    messages as its output buffer happens to flush, so the split varies from run to run."""
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (
            last is not None
            and out.output_type == last.output_type == "stream"
            and out.name == last.name
        ):
            last.text += out.text
        else:
            merged.append(out)
    return merged


def sanitize_outputs(nb: nbformat.NotebookNode, rules_file: pathlib.Path) -> None:
    """Apply nbval's sanitizer rules to the kept outputs, so that the stored text is the same on
    every machine (nbval applies the rules to both sides; a masked part stays masked)."""
    rules = re.findall(
        r"^regex: (.*)$\n^replace: (.*)$", rules_file.read_text(), flags=re.MULTILINE
    )

    def clean(text: str) -> str:
        for regex, replace in rules:
            text = re.sub(regex, replace, text)
        return text

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out.text = clean(out.text)
            for key, value in out.get("data", {}).items():
                if key.startswith("text/") and isinstance(value, str):
                    out.data[key] = clean(value)


def record_outputs(
    nb: nbformat.NotebookNode, folder: pathlib.Path, name: str
) -> nbformat.NotebookNode:
    """Execute the solved notebook in ``folder`` (where nbval runs it) and keep the checked outputs,
    sanitized."""
    if not any(checked(c) for c in nb.cells):
        return nb
    run = nbformat.from_dict(nb)
    client = NotebookClient(
        run,
        timeout=600,
        kernel_name=KERNELSPEC["name"],
        record_timing=False,
        resources={"metadata": {"path": str(folder)}},
    )
    try:
        client.execute()
    except CellExecutionError as err:
        raise RuntimeError(
            f"the solved notebook {name} fails while its outputs are recorded:\n{err}"
        ) from None
    run.metadata = (
        nb.metadata
    )  # not the kernel's language_info or widget state: they vary by machine
    _keep_checked_outputs(run)
    sanitize_outputs(run, layout().root / SANITIZER)
    return run


def reuse_outputs(nb: nbformat.NotebookNode, stored: pathlib.Path) -> nbformat.NotebookNode:
    """The outputs ``stored`` holds for checked cells whose source is unchanged; a checked cell with
    none gets a placeholder, so that the comparison with the stored file reports it."""
    old = {}
    if stored.exists():
        old = {c.id: c for c in nbformat.read(stored, as_version=4).cells if c.cell_type == "code"}
    out = nbformat.from_dict(nb)
    for cell in out.cells:
        if not checked(cell):
            continue
        prev = old.get(cell.id)
        if prev is not None and prev.source == cell.source and prev.execution_count is not None:
            cell.outputs = prev.outputs
        else:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=NOT_RECORDED)]
    _keep_checked_outputs(out)
    return out
