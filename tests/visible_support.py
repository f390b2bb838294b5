"""The visible check cells of the solved notebook run on an answer (not a test module): shared by
test_visible_checks.py (the catalog through them) and test_student_work.py (their hints)."""

import math

import grading_catalog as cat
import nbformat
import torch
from mlbook_solutions import ppo_lm
from mlbook_tools.config import layout
from nbcells import defines
from ppo_checks import CHECKS, EXTRA_PREFIX

SOLVED = layout().solved / "rlhf_ppo.ipynb"  # what `mlbook build` generated from the fragments


def visible_checks() -> dict[str, list[str]]:
    """Graded test id -> sources of the plain code cells between the answer cells and that graded cell."""
    checks, pending = {}, []
    for cell in nbformat.read(SOLVED, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        if meta.get("solution"):  # an answer cell: its checks are the plain cells after it
            pending = []
        elif meta.get("grade"):
            checks[meta["grade_id"]] = pending
            pending = []
        elif not cell.source.lstrip().startswith(("def ", "class ", "@", "import ", "from ")):
            pending.append(cell.source)  # a check cell (read-only code that defines nothing)
    return checks


def answer_symbols() -> set[str]:
    """The functions and classes the answer cells of §3 define (core answers: grade ids not ex*)."""
    out = set()
    for cell in nbformat.read(SOLVED, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution") and not meta.get("grade"):
            if not meta["grade_id"].startswith(EXTRA_PREFIX):
                out |= set(defines(cell.source))
    return out


CHECK_CELLS = visible_checks()
# The core graded tests whose checks call an answer (their visible checks are found in the notebook)
ANSWERED_TESTS = [
    gid for gid, c in CHECKS.items() if not c.extra and set(c.names) & answer_symbols()
]
ALL_WRONG = {**cat.WRONG, **cat.WRONG_IN_TRAINING}


def run_visible(source: str, test: str) -> None:
    """Execute an answer cell, then the visible checks that follow the answer cells for ``test``."""
    ns = dict(vars(ppo_lm)) | {"torch": torch, "math": math}
    exec(compile(source, "<answer cell>", "exec"), ns)
    for check in CHECK_CELLS[test]:
        exec(compile(check, "<check cell>", "exec"), ns)


SECTION = {
    symbol: tests[0] for symbol, tests in cat.USES.items()
}  # answer -> the graded test that calls it


def visible_test_for(name: str) -> str:
    _, symbol, _ = ALL_WRONG[name]
    return SECTION[symbol]


def caught(name: str) -> bool:
    _, _, source = ALL_WRONG[name]
    try:
        run_visible(source, visible_test_for(name))
    except AssertionError as err:
        return len(str(err)) > 20  # a message a student can act on
    return False
