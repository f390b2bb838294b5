"""Execute notebooks as ``jupyter nbconvert --to notebook --execute`` does, with progress.

    python -m mlbook_tools.execute --timeout 600 --output-dir build/executed a.ipynb b.ipynb

The same exporter and ``ExecutePreprocessor`` as nbconvert (same kernel, working folder, timeout
and output file ``<output-dir>/<name>.ipynb``), so what ``make html`` renders next is unchanged.
What it adds: where the run is. When a person watches (``mlbook_tools.progress.enabled``: a
terminal, a ``!`` cell) a line on stderr at each section heading the kernel reaches, with the
code-cell count; otherwise one line per notebook, as nbconvert's own log has.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert.exporters import NotebookExporter
from traitlets.config import Config

from mlbook_tools import progress
from mlbook_tools.cells import is_blank


def heading(cell) -> str | None:
    """The first ``#``/``##``/``###`` heading line of a markdown cell, without the hashes."""
    if cell.cell_type != "markdown":
        return None
    for line in cell.source.splitlines():
        marks, _, title = line.partition(" ")
        if marks and set(marks) == {"#"} and len(marks) <= 3 and title.strip():
            return title.strip()
    return None


class Progress:
    """The ``on_cell_start`` hook: remembers the last heading, reports it at its first code cell."""

    def __init__(self, name: str, nb: nbformat.NotebookNode, show: bool):
        self.name, self.show = name, show
        self.total = sum(c.cell_type == "code" and not is_blank(c) for c in nb.cells)
        self.done = 0
        self.section: str | None = None
        self.reported: str | None = None

    def __call__(self, cell, cell_index: int) -> None:
        title = heading(cell)
        if title:
            self.section = title
            return
        if cell.cell_type != "code" or is_blank(cell):
            return
        self.done += 1
        if self.show and self.section != self.reported:
            self.reported = self.section
            where = f"{self.name}: cell {self.done}/{self.total}  {self.section or ''}"
            progress.stage(where.rstrip())


# The kernel's channels encrypted with CurveZMQ keys the kernel manager provisions (the kernelspec
# declares `supported_encryption: curve`): no plain-text traffic on 127.0.0.1, and so no "Kernel is
# running over TCP without encryption" warning from ipykernel on every run.
KERNEL_ENCRYPTION = "auto"


def execute(path: pathlib.Path, out_dir: pathlib.Path, timeout: int) -> pathlib.Path:
    """Run every cell of ``path`` (in its own folder) and write the result to ``out_dir``."""
    nb = nbformat.read(path, as_version=4)
    hook = Progress(path.stem, nb, progress.enabled())
    c = Config()
    c.ExecutePreprocessor.enabled = True
    c.ExecutePreprocessor.timeout = timeout
    c.ExecutePreprocessor.on_cell_start = hook
    c.KernelManager.transport_encryption = KERNEL_ENCRYPTION
    if hook.show:
        progress.stage(f"{path.stem}: executing {hook.total} code cells ({path})")
    body, _ = NotebookExporter(config=c).from_filename(str(path))
    target = out_dir / f"{path.stem}.ipynb"
    out_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(body, encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlbook_tools.execute",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path)
    parser.add_argument("--output-dir", type=pathlib.Path, required=True)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        t0 = time.monotonic()
        try:
            target = execute(path, args.output_dir, args.timeout)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
            print(f"error: {path} failed while executing:\n{err}", file=sys.stderr)
            return 1
        print(f"executed {path} -> {target} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
