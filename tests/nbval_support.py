"""The notebooks nbval runs and the cells it checks (not a test module): shared by test_build.py
(what the build stores, unit) and test_nbval_checks.py (nbval and a kernel on them)."""

from mlbook_tools.config import layout
from mlbook_tools.recorded import CHECK_OUTPUT

ROOT = layout().root
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
SOLVED = sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb"))
RELEASE = ROOT / "chapters" / "rlhf_ppo.ipynb"


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def checked(cell) -> bool:
    """Tagged nbval-check-output: nbval compares its stored outputs."""
    return CHECK_OUTPUT in cell.metadata.get("tags", [])
