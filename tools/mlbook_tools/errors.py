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
"timeout", "budget", "broke the protocol (...)"), for logs. What a student reads about a failure is
the kind's own sentence, ``student_message(what)``: ``what`` names what failed ("calling gae",
"cell 'ex1'"), the kind says how. A new failure kind is one class with its sentence.
"""

from __future__ import annotations


class GradingError(Exception):
    """Base of every failure the grader names."""

    def student_message(self, what: str = "your code") -> str:
        """The sentence a student reads about this failure of ``what`` (a subject: "calling gae")."""
        return str(self)


class SandboxUnavailable(GradingError, RuntimeError):
    """bubblewrap cannot start here; grading stops unless the instructor opts out."""


class RemoteError(GradingError):
    """The student's code raised (message in the student's terms)."""

    def student_message(self, what: str = "your code") -> str:
        return f"{what} raised {self}"


class CannotGrade(GradingError):
    """The file cannot be graded at all (not a notebook, wrong assignment)."""


class TooLarge(CannotGrade):
    """The file is past one of the size bounds: refused before it is parsed or run."""


class RunnerDied(GradingError):
    """The sandboxed process died, missed its deadline or broke the protocol; it must be restarted."""

    reason = "died"

    def __init__(self, why: str | None = None):
        super().__init__(why or self.reason)

    def student_message(self, what: str = "your code") -> str:
        return f"{what} stopped the Python process (a crash, os._exit, or the memory limit)"


class Crashed(RunnerDied):
    """The process died (a crash, ``os._exit``, a signal, the watchdog)."""

    reason = "died"


class MemoryLimit(RunnerDied):
    """The process died and the sandbox's cgroup had killed it for memory."""

    reason = "memory limit"

    def student_message(self, what: str = "your code") -> str:
        return f"{what} went over the sandbox's memory limit"


class CallTimeout(RunnerDied):
    """One request ran past its own deadline (charged seconds or its wall-clock backstop).
    ``seconds``: that deadline, where the session knows it (``Session.request`` sets it)."""

    reason = "timeout"
    seconds: float | None = None

    def _within(self) -> str:
        return "in time" if self.seconds is None else f"within {max(self.seconds, 0):.0f} s"

    def student_message(self, what: str = "your code") -> str:
        return f"{what} did not finish {self._within()} (an endless loop?)"


class Interrupted(CallTimeout):
    """A request cut at its limit and interrupted as Jupyter interrupts a kernel (SIGINT: a
    ``KeyboardInterrupt`` in the student's code); the runner answered and lives on, nothing restarts."""

    reason = "interrupted"

    def student_message(self, what: str = "your code") -> str:
        return f"{what} did not finish {self._within()} and was interrupted"


class BudgetExceeded(RunnerDied):
    """The submission's budget (or its wall-clock backstop) ran out: nothing more is sent."""

    reason = "budget"

    def student_message(self, what: str = "your code") -> str:
        return f"{what} did not finish: the submission's time budget ran out"


class ProtocolBroken(RunnerDied):
    """The process wrote a frame that is not a valid reply."""

    reason = "broke the protocol"

    def student_message(self, what: str = "your code") -> str:
        return f"{what} stopped the Python process (it broke the protocol with the grader)"
