"""The tiers hold: each test file states its kind, every test is in exactly one of ``make check``,
``make test`` and ``make test-full``, each of them runs every kind it should, and the unit guard
fails a unit test that starts a sandbox, the grader, nbgrader, Jupyter or a browser.

Collects what ``make test`` collects (tests/ and the notebooks nbval runs) in a subprocess that
writes each test's kinds (tests/conftest.py, ``MLBOOK_KINDS_TO``), then selects each tier with the
Makefile's own ``-m`` expressions (pytest's expression language).
"""

import ast
import json
import os
import re
import subprocess
import sys

import conftest
import pytest
from _pytest.mark.expression import Expression
from conftest import HEAVY, KIND_NAMES
from mlbook_tools.config import layout

pytestmark = pytest.mark.unit

pytest_plugins = ["pytester"]

ROOT = layout().root
TESTS = ROOT / "tests"


def _make_variables() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text()
    return dict(re.findall(r"^([A-Z_]+)\s*:=\s*(.*)$", text, flags=re.M))


def _marker_expressions(target: str) -> list[str]:
    """The ``-m`` expressions of the pytest lines of a Makefile target, variables expanded."""
    text, names = (ROOT / "Makefile").read_text(), _make_variables()
    body = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    found = re.findall(r'\$\(PYTEST\) -m (?:"([^"]+)"|(\S+))', body)
    out = [a or b for a, b in found]
    return [re.sub(r"\$\((\w+)\)", lambda m: names[m.group(1)], e) for e in out]


def test_each_test_file_states_its_kind_where_it_is_written():
    """A module-level ``pytestmark`` naming a lane (unit or a heavier kind), in every test file."""
    missing = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = [
            ast.unparse(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        ]
        named = set(re.findall(r"pytest\.mark\.(\w+)", " ".join(marks)))
        if not named & (HEAVY | {"unit"}):
            missing.append(path.name)
    assert not missing, f"no module pytestmark naming a lane: {missing}"
    assert not hasattr(conftest, "KINDS"), "conftest keeps only defaults, no file -> kind map"


def test_every_test_is_in_exactly_one_tier_and_each_tier_runs_its_kinds(tmp_path):
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
    kinds = {node: set(ks) for node, ks in json.loads(out.read_text()).items()}
    assert len(kinds) > 300 and any(node.endswith(".ipynb::Cell 0") for node in kinds), len(kinds)

    # exactly one lane: unit, or heavier kinds; never unit with a heavy kind or with full
    both = [n for n, ks in kinds.items() if "unit" in ks and ks & (HEAVY | {"full"})]
    assert not both, f"unit and a heavier kind (split the file): {both[:5]}"
    laneless = [n for n, ks in kinds.items() if not ks & (HEAVY | {"unit"})]
    assert not laneless, laneless[:5]

    # the Makefile's expressions select each test exactly once; make check is `pytest -m unit`
    (check,) = _marker_expressions("check")
    assert check == "unit", f"make check must be `pytest -m unit`, not {check!r}"
    test, portable = _marker_expressions("test")
    (full,) = _marker_expressions("test-full")
    tiers = {"check": check, "test": test, "test-full": full}
    picked = {
        tier: {n for n, ks in kinds.items() if Expression.compile(e).evaluate(ks.__contains__)}
        for tier, e in tiers.items()
    }
    for node in kinds:
        homes = [tier for tier, nodes in picked.items() if node in nodes]
        assert len(homes) == 1, f"{node}: in {homes or 'no tier'}"
    assert picked["check"] == {n for n, ks in kinds.items() if "unit" in ks}
    reruns = {
        n for n, ks in kinds.items() if Expression.compile(portable).evaluate(ks.__contains__)
    }
    assert reruns and reruns <= picked["check"] | picked["test"], "portable reruns what ran"

    # each tier is not empty, and make test keeps at least one test of every heavier kind
    in_make_test = {k for n in picked["test"] for k in kinds[n]}
    assert in_make_test >= HEAVY, HEAVY - in_make_test
    assert picked["check"] and picked["test-full"]
    assert {k for ks in kinds.values() for k in ks} <= KIND_NAMES | {"full"}


# --- the unit guard ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, what",
    [
        (["/usr/bin/bwrap", "--ro-bind", "/", "/", "true"], "a sandbox"),
        ([sys.executable, "-m", "nbgrader", "autograde", "x"], "nbgrader"),
        ([sys.executable, "-m", "mlbook_tools.classgrade_worker", "--worker"], "a grader worker"),
        ([sys.executable, "-m", "mlbook_tools.cli", "grade-class"], "the grader"),
        ([os.path.join(os.path.dirname(sys.executable), "mlbook"), "grade"], "the grader"),
        ([sys.executable, "-m", "ipykernel_launcher", "-f", "k.json"], "a Jupyter kernel"),
        (["jupyter-lab", "--no-browser"], "Jupyter"),
        ("/usr/bin/chromium --headless", "a browser"),
        (["/usr/bin/chromedriver", "--port=0"], "a browser"),
        ([sys.executable, "-m", "pytest", "--nbval-lax", "x.ipynb"], "Jupyter"),
        (["alembic", "-c", "alembic.ini", "heads"], "nbgrader"),
    ],
)
def test_the_guard_fails_a_unit_test_that_starts(argv, what):
    """Called directly: each start raises "unit test started X" before anything runs."""
    with (
        conftest.unit_guard(),
        pytest.raises(conftest.UnitTestStarted, match=f"unit test started {what}"),
    ):
        subprocess.run(argv, capture_output=True)


def test_the_guard_lets_ordinary_subprocesses_run_and_restores_everything():
    from mlbook_tools import sandbox

    before = (subprocess.Popen._execute_child, sandbox.Runner.__init__)
    with conftest.unit_guard():
        assert (
            subprocess.run(
                [sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True
            ).stdout
            == "42\n"
        )
        with pytest.raises(conftest.UnitTestStarted, match="unit test started a sandbox"):
            sandbox.Runner()
        from selenium import webdriver

        with pytest.raises(conftest.UnitTestStarted, match="unit test started a browser"):
            webdriver.Chrome()
    assert (subprocess.Popen._execute_child, sandbox.Runner.__init__) == before


def test_a_unit_test_that_starts_nbgrader_fails_and_a_heavier_one_may(pytester):
    """The lanes as pytest runs them (in a subprocess, outside this test's own guard): this
    conftest, a unit test file, one that states no kind, and an nbgrader-kind one."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n" + "".join(f"    {k}: kind\n" for k in sorted(KIND_NAMES))
    )
    starts = (  # a module that does not exist: quick to fail when it does start
        "import subprocess, sys\n"
        "def test_starts():\n"
        "    subprocess.run([sys.executable, '-m', 'nbgrader_absent'], capture_output=True)\n"
    )
    pytester.makepyfile(
        test_unit="import pytest\npytestmark = pytest.mark.unit\n" + starts,
        test_default=starts,  # no kind stated: unit by default, guarded too
        test_heavy="import pytest\npytestmark = pytest.mark.nbgrader\n" + starts,
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "*test_heavy.py::test_starts PASSED*",
            "*test_unit.py::test_starts FAILED*",
            "*test_default.py::test_starts FAILED*",
            "*UnitTestStarted: unit test started nbgrader*",
        ]
    )


def test_xdist_runs_a_file_on_one_worker_and_the_graded_class_once():
    """make test's heavy lane runs on pytest-xdist: a file's tests (its module fixtures, a notebook's
    nbval cells) share one scope, and so do all the files that read the session's graded class."""

    def scope(nodeid):
        return conftest.xdist_scope(ROOT, nodeid)

    assert scope("tests/test_engine.py::test_a[x]") == scope("tests/test_engine.py::test_b")
    assert scope("chapters/rlhf_ppo.ipynb::Cell 0") == scope("chapters/rlhf_ppo.ipynb::Cell 80")
    assert scope("chapters/rlhf_ppo.ipynb::Cell 0") != scope(
        "solutions/notebooks/rlhf_ppo.ipynb::Cell 0"
    )
    readers = {
        path.name
        for path in TESTS.glob("test_*.py")
        if scope(f"tests/{path.name}::t") == "graded_class"
    }
    assert {"test_adversarial.py", "test_autograde.py", "test_fairness.py"} <= readers
    assert "test_engine.py" not in readers and "test_bounds.py" not in readers
