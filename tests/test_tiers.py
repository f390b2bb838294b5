"""The tiers hold: every test has a kind, and ``make test`` keeps at least one test of every kind.

Collects what ``make test`` collects (tests/ and the notebooks nbval runs) in a subprocess that
writes each test's kinds (tests/conftest.py, ``MLBOOK_KINDS_TO``), then reads them.
"""

import json
import os
import subprocess
import sys

from conftest import KIND_NAMES
from mlbook_tools.config import layout

ROOT = layout().root


def test_every_test_has_a_kind_and_make_test_runs_every_kind(tmp_path):
    out = tmp_path / "kinds.json"
    notebooks = [
        str(p.relative_to(ROOT))
        for p in (
            *sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")),
            *sorted((ROOT / "chapters").glob("*.ipynb")),
        )
    ]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "--nbval-lax",
            "tests",
            *notebooks,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MLBOOK_KINDS_TO": str(out)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kinds = json.loads(out.read_text())
    assert len(kinds) > 300 and any(node.endswith(".ipynb::Cell 0") for node in kinds), len(kinds)
    kindless = [node for node, ks in kinds.items() if not set(ks) & KIND_NAMES]
    assert not kindless, kindless[:5]
    in_make_test = {k for ks in kinds.values() if "full" not in ks for k in ks}
    assert in_make_test >= KIND_NAMES, KIND_NAMES - in_make_test
    assert any("full" in ks for ks in kinds.values())  # test-full is not empty
