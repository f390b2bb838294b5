"""The answer catalog through the sandboxed engine: remote calls, validated data, gradients across the pipe.

``test_grading_catalog.py`` runs the checks on the catalog in-process. Here every catalogued answer
runs inside ONE bubblewrap runner (each answer defined in its own copy of the notebook's namespace)
and the trusted driver calls it through the same proxies the class grader uses, with a seed from
a course secret: every wrong answer must fail its test, every equivalent correct form must pass.
tests/test_plan.py has the driver's pure parts (the plan, the seeds, malformed replies), no sandbox.
"""

import grading_catalog as cat
import nbformat
import ppo_checks
import pytest
from mlbook_tools import driver
from mlbook_tools.config import layout

pytestmark = pytest.mark.sandbox

ROOT = layout().root
SECRET = b"test-secret"
CHECKS = {
    gid: (c.fn, list(c.names))
    for gid, c in ppo_checks.CHECKS.items()
    if not c.extra and gid != cat.TRAIN
}  # the registry: grade id -> check, names
SYMBOLS = list(cat.USES)


def _entries():
    out = {f"wrong_{k}": v[2] for k, v in cat.WRONG.items()}
    out.update({f"correct_{k}": v[1] for k, v in cat.CORRECT.items()})
    out.update({f"train_{k}": v[2] for k, v in cat.WRONG_IN_TRAINING.items()})
    return out


def _catalog_cell() -> str:
    """Each answer in a copy of the namespace; its symbols saved as __cat_<entry>__<symbol>."""
    lines = ["__base = dict(globals())"]
    for name, source in _entries().items():
        lines.append(f"__ns = dict(__base)\nexec({source!r}, __ns)")
        for sym in SYMBOLS:
            lines.append(f"globals()['__cat_{name}__{sym}'] = __ns['{sym}']")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def session():
    source_nb = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    solved = (ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb").read_text()
    plan = driver.make_plan(source_nb, solved)
    plan.cells.append(("catalog", _catalog_cell(), False))
    s = driver.Session(plan, trusted=False, deadline=float("inf"))
    assert not s.cell_errors, s.cell_errors
    yield s
    s.close()


def _proxies(session, entry):
    return {sym: driver.Remote(session, f"__cat_{entry}__{sym}", name=sym) for sym in SYMBOLS}


def _run(session, entry, test):
    check, args = CHECKS[test]
    proxies = _proxies(session, entry)
    check(*[proxies[a] for a in args], seed=driver.check_seed(SECRET, entry, test))


@pytest.mark.parametrize("name", sorted(cat.WRONG))
def test_wrong_answer_fails_its_test_through_the_engine(session, name):
    test = cat.WRONG[name][0]
    with pytest.raises(AssertionError) as err:
        _run(session, f"wrong_{name}", test)
    assert len(str(err.value)) > 20


@pytest.mark.parametrize("name", sorted(cat.CORRECT))
def test_correct_variant_passes_through_the_engine(session, name):
    symbol, _ = cat.CORRECT[name]
    for test in cat.USES[symbol]:
        _run(session, f"correct_{name}", test)


@pytest.mark.parametrize("name", sorted(cat.WRONG_IN_TRAINING))
def test_wrong_answer_fails_the_remote_training_loop(session, name):
    _, symbol, _ = cat.WRONG_IN_TRAINING[name]
    proxies = _proxies(
        session, "correct_gae_vectorised"
    )  # any entry: all symbols correct except one
    proxies[symbol] = driver.Remote(session, f"__cat_train_{name}__{symbol}", name=symbol)
    ref = driver._reference_with(proxies)
    with pytest.raises(AssertionError):
        ppo_checks.check_train_ppo(ref["train_ppo"], ref["PPOConfig"], seed=3)


def test_correct_answers_train_through_the_engine(session):
    ref = driver._reference_with(_proxies(session, "correct_gae_vectorised"))
    ppo_checks.check_train_ppo(ref["train_ppo"], ref["PPOConfig"], seed=7)


def test_students_own_helper_cells_are_part_of_their_answer():
    """A correct gae that calls a helper from a cell the student added (no nbgrader metadata) must pass:
    the grader runs added cells whole, in place, as nbgrader runs the whole notebook."""
    source_nb = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    nb = nbformat.read(ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb", as_version=4)
    i = next(
        k for k, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "gae"
    )
    helper = "def _carry_step(m, delta, gamma, lam, carry):\n    return m * (delta + gamma * lam * carry)\n"
    nb.cells.insert(i, nbformat.v4.new_code_cell(helper + "\nprint('helper defined')\n"))
    old = "carry = m * (delta + gamma * lam * carry)"
    assert old in nb.cells[i + 1].source
    nb.cells[i + 1].source = nb.cells[i + 1].source.replace(
        old, "carry = _carry_step(m, delta, gamma, lam, carry)"
    )
    plan = driver.make_plan(source_nb, nbformat.writes(nb))
    names = [name for name, _, _ in plan.cells]
    added = [k for k, (name, text, _) in enumerate(plan.cells) if "def _carry_step" in text]
    assert len(added) == 1 and added[0] < names.index("gae"), names
    assert "print(" in plan.cells[added[0]][1]  # the whole cell, as Jupyter runs it
    s = driver.Session(plan, trusted=False, deadline=float("inf"))
    try:
        assert not s.cell_errors, s.cell_errors
        ppo_checks.check_gae(
            driver.Remote(s, "gae", name="gae"), seed=driver.check_seed(SECRET, "helper", cat.GAE)
        )
    finally:
        s.close()


def test_a_method_read_again_is_read_at_its_call(session, monkeypatch):
    """From its second read on, a bound method costs one request (its call), and what is called is
    what the object holds at the call, as ``obj.add(k)`` in Python: a method replaced on the instance
    is the one called; a method sent back as an argument is the bound method itself."""
    source = (
        "class _Acc:\n"
        "    def __init__(self):\n"
        "        self.n = 0\n"
        "    def add(self, k):\n"
        "        self.n += k\n"
        "        return float(self.n)\n"
        "    def swap(self):\n"
        "        self.add = lambda k: -1.0\n"
        "_acc = _Acc()\n"
        "def _apply(f, k):\n"
        "    return f(k)\n"
    )
    reply, _ = session.request({"op": "exec", "cell": "method-reads", "source": source}, 10)
    assert reply["ok"], reply
    acc, sent = driver.Remote(session, "_acc", name="acc"), []
    real = session.request
    monkeypatch.setattr(
        session, "request", lambda h, *a, **k: (sent.append(h["op"]), real(h, *a, **k))[1]
    )
    assert acc.add(1) == 1.0 and sent == ["getattr", "call"]
    sent.clear()
    assert acc.add(2) == 3.0 and sent == ["call"]
    acc.swap()
    assert acc.add(5) == -1.0  # the instance's own attribute, read at the call
    assert driver.Remote(session, "_apply", name="_apply")(acc.add, 1) == -1.0
    assert acc.n == 3
