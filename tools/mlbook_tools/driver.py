"""The trusted side of grading: it never runs student code, it only judges the data that comes back.

For one submission: read the notebook (any damage is a problem noted for this student, not a crash),
plan the cells the way ``nbgrader autograde`` would run them, run them in a sandboxed IPython shell
(``runner.py``; a cell that crashes or hangs the process is skipped after a restart), then call every
graded check declared in the registry here, in this process, with the student's functions replaced
by remote proxies under a deadline. Each part is one module, by role:

- ``submission.py``: reading and bounding a submission (``read_submission``, ``bounded``, ...)
- ``plan.py``: the plan and cell matching (``make_plan``, the demonstration tag)
- ``session.py``: the sandboxed session and its deadlines (``Session``)
- ``remote.py``: the remote calls (``Remote``, the codec)
- ``judge.py``: judging (the course secret, ``grade_plan``, ``Verdict``)

This module re-exports their names for the code and tests that import ``mlbook_tools.driver``.
"""

from __future__ import annotations

from mlbook_tools.cells import points as cell_points  # noqa: F401
from mlbook_tools.errors import (  # noqa: F401 - the driver's failures, as importers know them
    BudgetExceeded,
    CallTimeout,
    CannotGrade,
    Crashed,
    Interrupted,
    MemoryLimit,
    RemoteError,
    RunnerDied,
    SandboxUnavailable,
    TooLarge,
)
from mlbook_tools.judge import (  # noqa: F401
    SECRET_FILE,
    Missing,
    Verdict,
    _reference_with,
    _run_test,
    _warm_up,
    check_seed,
    course_secret,
    grade_plan,
    load_checks,
)
from mlbook_tools.limits import DEFAULT as DEFAULT_LIMITS  # noqa: F401
from mlbook_tools.plan import (  # noqa: F401
    DEMO_FLAG,
    DEMO_TAG,
    Plan,
    Test,
    is_demo,
    is_demo_cell,
    make_plan,
)
from mlbook_tools.remote import Remote, _attach  # noqa: F401
from mlbook_tools.remote import codec as _codec  # noqa: F401
from mlbook_tools.session import Session  # noqa: F401
from mlbook_tools.submission import (  # noqa: F401
    _check_parsed,
    _check_raw,
    bounded,
    check_bounds,
    parse_submission,
    read_submission,
)
