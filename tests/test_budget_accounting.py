"""What a submission's budget is charged: its own code's work, once; never the grader's restarts.

A busy machine must not change a grade (tests/test_load.py, minutes, the full lane). These check the
two rules that make the charge independent of load and of how many restarts a submission causes,
exactly (no timing is asserted; only that the session's clock did or did not move, and by how much):

* a request cut at its limit is charged exactly that limit (``Runner.request``), however late the
  tick that cut it ran;
* starting a sandbox, replaying cells after a restart and the grader's bookkeeping requests are not
  charged (``driver.Session``): a rebuilt namespace leaves the clock where it was.

They run the engine unconfined (``trusted=True``: the accounting is the same in the sandbox), so they
need no bubblewrap.
"""

import pytest
from mlbook_tools import driver
from mlbook_tools.errors import CallTimeout
from mlbook_tools.sandbox import Runner

pytestmark = pytest.mark.sandbox  # runner processes (unconfined: trusted=True)

SLEEP = "import time\ntime.sleep(0.3)\n"  # a cell that costs the submission time (sleep is charged)


def _plan(*sources: str) -> driver.Plan:
    cells = [(f"cell{i}", src, False) for i, src in enumerate(sources)]
    return driver.Plan(cells, tests=[], manual=[], student_names={"f": "cell0"})


def test_a_request_cut_at_its_limit_costs_exactly_the_limit():
    runner = Runner(trusted=True)
    try:
        before = runner.charged
        with pytest.raises(CallTimeout):
            runner.request(
                {"op": "exec", "cell": "c", "source": "import time\ntime.sleep(30)\n"},
                timeout=0.5,
                wall_timeout=20,
            )
        assert runner.charged - before == pytest.approx(0.5, abs=1e-9)
    finally:
        runner.close()


def test_restarts_and_replays_charge_nothing():
    plan = _plan("def f(x):\n    return x + 1\n", SLEEP, "y = f(1)\n")
    s = driver.Session(plan, trusted=True, deadline=float("inf"))
    try:
        first = s.clock() - s.t0  # the first run of every cell: the sleep is in it
        assert first > 0
        assert s.ran == {"cell0", "cell1", "cell2"}
        for _ in range(3):  # each restart replays the sleeping cell in a new sandbox
            s.runner.close()
            s.ensure()
            assert s.restarts > 0 and not s.runner.dead
            assert s.clock() - s.t0 == pytest.approx(first, abs=1e-9)
        assert s.defined(["f", "y"]) == {"f", "y"}  # bookkeeping: free too
        assert s.clock() - s.t0 == pytest.approx(first, abs=1e-9)
    finally:
        s.close()


def _limits(**kw):
    import dataclasses

    from mlbook_tools.limits import DEFAULT

    return dataclasses.replace(DEFAULT, **kw)


def test_a_cell_cut_at_the_cell_limit_is_interrupted_as_jupyter_does_and_nothing_restarts():
    """``time.sleep`` (or any Python loop) stops at a KeyboardInterrupt: what the cell did before it
    stays, the cells after it run in the same sandbox, and the cell costs exactly the cell limit."""
    plan = _plan(
        "def f(x):\n    return x\n", "a = 1\nimport time\ntime.sleep(30)\nb = 2\n", "z = 2\n"
    )
    s = driver.Session(plan, trusted=True, deadline=float("inf"), limits=_limits(cell_seconds=0.5))
    try:
        assert s.restarts == 0 and "interrupted" in s.bad_cells["cell1"]
        assert s.defined(["f", "a", "b", "z"]) == {"f", "a", "z"}
        runner = s.runner
        assert s.runner.request({"op": "exec", "cell": "x", "source": "w = f(3)"})[0]["ok"]
        assert s.runner is runner and s.defined(["w"]) == {"w"}  # the pipe is still in step
    finally:
        s.close()


IGNORES_SIGINT = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "t = time.monotonic()\nwhile time.monotonic() < t + 60:\n    pass\n"
)


def test_a_cell_that_ignores_the_interrupt_is_killed_charged_once_and_skipped_after_the_restart():
    plan = _plan("def f(x):\n    return x\n", IGNORES_SIGINT, "z = 2\n")
    s = driver.Session(plan, trusted=True, deadline=float("inf"), limits=_limits(cell_seconds=0.5))
    try:
        assert "did not finish" in s.bad_cells["cell1"] and s.restarts == 1
        assert s.defined(["f", "z"]) == {"f", "z"}  # the cells after it ran in the new sandbox
        charged = s.clock() - s.t0  # 0.5 s for the cut cell, plus the two short cells' own time
        assert charged >= 0.5
        s.runner.close()
        s.ensure()
        assert s.clock() - s.t0 == pytest.approx(charged, abs=1e-9)
    finally:
        s.close()
