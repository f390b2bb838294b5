"""Execute a notebook and print the slowest cells: python scripts/time_cells.py NOTEBOOK.ipynb [N]."""

import sys
import time

import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True)
times = []
with client.setup_kernel():
    t_all = time.perf_counter()
    for i, cell in enumerate(nb.cells):
        t0 = time.perf_counter()
        if cell.cell_type == "code":
            client.execute_cell(cell, i)
        times.append((time.perf_counter() - t0, i, cell.source.split("\n")[0][:70]))
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            print(f"cell {i} error: {errors[0].ename}: {errors[0].evalue[:200]}")
    total = time.perf_counter() - t_all
for dt, i, head in sorted(times, reverse=True)[: int(sys.argv[2]) if len(sys.argv) > 2 else 8]:
    print(f"{dt:6.2f}s  cell {i:3d}  {head}")
print(f"total {total:.1f}s")
