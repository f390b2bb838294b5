"""The grader's named failures (PrairieLearn style): raised where they are detected, caught by type.

GradingError
├── SandboxUnavailable   bubblewrap cannot start here; grading stops unless the instructor opts out
├── RemoteError          the student's code raised (the message in the student's terms)
├── CannotGrade          the file cannot be graded at all (not a notebook, wrong assignment)
│   └── TooLarge         past a size bound of ``GradingLimits``: refused before it is parsed or run
└── RunnerDied           the sandboxed process stopped serving; it must be restarted
    ├── Crashed          it died (a crash, ``os._exit``, a signal)
    ├── MemoryLimit      it died and the cgroup's OOM killer did it
    ├── CallTimeout      one request ran past its own deadline
    ├── BudgetExceeded   the submission's time budget (or its wall-clock backstop) ran out
    └── ProtocolBroken   it wrote something that is not a valid reply

Each ``RunnerDied`` kind's message is the short word the grader always used ("died", "memory limit",
"timeout", "budget", "broke the protocol (...)"), so what a student or an instructor reads is unchanged.
"""

from __future__ import annotations


class GradingError(Exception):
    """Base of every failure the grader names."""


class SandboxUnavailable(GradingError, RuntimeError):
    """bubblewrap cannot start here; grading stops unless the instructor opts out."""


class RemoteError(GradingError):
    """The student's code raised (message in the student's terms)."""


class CannotGrade(GradingError):
    """The file cannot be graded at all (not a notebook, wrong assignment)."""


class TooLarge(CannotGrade):
    """The file is past one of the size bounds: refused before it is parsed or run."""


class RunnerDied(GradingError):
    """The sandboxed process died, missed its deadline or broke the protocol; it must be restarted."""

    reason = "died"

    def __init__(self, why: str | None = None):
        super().__init__(why or self.reason)


class Crashed(RunnerDied):
    """The process died (a crash, ``os._exit``, a signal, the watchdog)."""

    reason = "died"


class MemoryLimit(RunnerDied):
    """The process died and the sandbox's cgroup had killed it for memory."""

    reason = "memory limit"


class CallTimeout(RunnerDied):
    """One request ran past its own deadline (charged seconds or its wall-clock backstop)."""

    reason = "timeout"


class Interrupted(CallTimeout):
    """A request cut at its limit and interrupted as Jupyter interrupts a kernel (SIGINT: a
    ``KeyboardInterrupt`` in the student's code); the runner answered and lives on, nothing restarts."""

    reason = "interrupted"


class BudgetExceeded(RunnerDied):
    """The submission's budget (or its wall-clock backstop) ran out: nothing more is sent."""

    reason = "budget"


class ProtocolBroken(RunnerDied):
    """The process wrote a frame that is not a valid reply."""

    reason = "broke the protocol"
