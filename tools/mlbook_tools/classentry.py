"""What ``mlbook grade-class`` did with each student, as types: one ``ClassEntry`` per submission
folder, its ``Outcome``, and the worker's reply that it was built from.

* ``Outcome`` is what this run did: ``graded`` now, ``unchanged`` (kept from an earlier grading of
  the same text, checks and engine), ``ungraded`` (no grade could be made: the reason is said, nothing
  is recorded), ``misnamed`` (no ``<assignment>.ipynb`` in the folder), ``refused`` (the student id
  is not a safe one: nothing is read). A refused-past-a-bound or unreadable *file* is graded (0, its
  ``GradingResult.error`` says why, ``flags.py`` names it); ``refused`` here is about the folder's id.
* ``WorkerReply`` is one JSON line of a class worker (``classgrade_worker.worker_main``), read by one
  ``from_json`` that checks every field; nothing else reads a worker's raw reply.
* The state file (``<course>/.mlbook_grading/<assignment>/<student>.json``) is written by
  ``ClassEntry.to_state`` and read by ``from_state`` alone (its JSON form is unchanged: copies of a
  course graded on other machines are merged by it, docs/scale.md).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib

from mlbook_tools.config import state_in
from mlbook_tools.result import BadResult, GradingResult


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


class Outcome(enum.Enum):
    GRADED = "graded"
    UNCHANGED = "unchanged"
    UNGRADED = "ungraded"
    MISNAMED = "misnamed"
    REFUSED = "refused"


WITH_RESULT = (Outcome.GRADED, Outcome.UNCHANGED)  # a grade in the gradebook and the state file


@dataclasses.dataclass(frozen=True)
class ClassEntry:
    student: str
    outcome: Outcome
    result: GradingResult | None = None  # graded or unchanged only
    fingerprint: str | None = None  # of the text, checks and engine graded (graded, unchanged)
    problems: tuple[str, ...] = ()  # ungraded, misnamed, refused: why (the result's own otherwise)
    found: tuple[str, ...] = ()  # misnamed: the files in the folder instead
    trace: str | None = None  # ungraded: the worker's traceback, for the instructor's bug report

    def __post_init__(self):
        if not isinstance(self.outcome, Outcome):
            raise TypeError(f"a class entry's outcome is an Outcome, not {self.outcome!r}")
        has = self.result is not None
        if has != (self.outcome in WITH_RESULT):
            raise ValueError(
                f"{self.student!r}: {_a(self.outcome.value)} entry "
                + ("has no GradingResult" if has else "needs its GradingResult")
            )
        if not has and not self.problems:
            raise ValueError(f"{self.student!r}: {_a(self.outcome.value)} entry says why")
        if self.found and self.outcome is not Outcome.MISNAMED:
            raise ValueError(f"{self.student!r}: only a misnamed entry lists the files found")

    @property
    def recorded(self) -> bool:
        """Whether the gradebook holds this grading (late penalties apply to it)."""
        return self.outcome in WITH_RESULT

    @property
    def seconds(self) -> float:
        return (self.result.seconds or 0.0) if self.result is not None else 0.0

    @property
    def why(self) -> list[str]:
        """The problems said on this student's line: the run's, else the grading's."""
        if self.problems:
            return list(self.problems)
        return list(self.result.problems or []) if self.result is not None else []

    # ------------------------------------------------------------------ the state file, both ways
    def to_state(self) -> dict:
        if self.outcome is Outcome.MISNAMED:
            return {
                "misnamed": list(self.found),
                "problems": list(self.problems),
                "not_graded": True,
            }
        if self.result is None:
            raise ValueError(f"{self.student!r}: {_a(self.outcome.value)} entry is never saved")
        saved = {k: v for k, v in self.result.to_dict().items() if k != "output"}
        return {**saved, "fingerprint": self.fingerprint}

    @classmethod
    def from_state(cls, student: str, data) -> ClassEntry:
        """The entry a state file holds: ``graded`` as it was then, or ``misnamed``; BadResult when
        it is neither (a hand-edited or truncated file)."""
        if not isinstance(data, dict):
            raise BadResult("a state file holds a JSON object")
        if data.get("not_graded") or data.get("misnamed") is not None:
            found = data.get("misnamed") or []
            problems = data.get("problems") or ["no notebook under the assignment's name"]
            if not all(isinstance(f, str) for f in [*found, *problems]):
                raise BadResult("a misnamed state lists file names and problems as text")
            return cls(student, Outcome.MISNAMED, problems=tuple(problems), found=tuple(found))
        fp = data.get("fingerprint")
        if not isinstance(fp, str | None):
            raise BadResult("a state's fingerprint is text")
        return cls(student, Outcome.GRADED, GradingResult.from_dict(data), fingerprint=fp)


def saved(course: pathlib.Path, assignment: str, student: str) -> ClassEntry | None:
    """What grade-class saved for ``student``; None when nothing (or nothing readable) is saved."""
    state = state_in(course, assignment) / f"{student}.json"
    try:
        return ClassEntry.from_state(student, json.loads(state.read_text()))
    except (OSError, ValueError):  # BadResult is a ValueError
        return None


# ---------------------------------------------------------------------------------- a worker's reply
class BadReply(ValueError):
    """A worker's line that is not one of its replies (a broken or impersonated worker)."""


REPLY_STATUSES = ("graded", "internal")  # what a worker may say; "backstop" is the parent's own


@dataclasses.dataclass(frozen=True)
class WorkerReply:
    status: str  # graded | internal | backstop (the parent's: the grading was stopped)
    result: GradingResult | None = None  # graded
    notebook: str | None = None  # graded: the autograded notebook (nbformat JSON)
    why: str | None = None  # internal, backstop
    trace: str | None = None  # internal: the worker's traceback

    @classmethod
    def graded(cls, result: GradingResult, notebook: str | None) -> WorkerReply:
        return cls("graded", result=result, notebook=notebook)

    @classmethod
    def internal(cls, why: str, trace: str | None = None) -> WorkerReply:
        return cls("internal", why=why, trace=trace)

    @classmethod
    def backstop(cls, why: str) -> WorkerReply:
        return cls("backstop", why=why)

    def to_json(self) -> str:
        out: dict = {"status": self.status}
        if self.result is not None:
            out.update(result=self.result.to_dict(), notebook=self.notebook)
        else:
            out.update(why=self.why, **({"trace": self.trace} if self.trace is not None else {}))
        return json.dumps(out, default=str)

    @classmethod
    def from_json(cls, line: str) -> WorkerReply:
        """One line a worker wrote; BadReply naming what is wrong unless it is a reply it may give."""
        try:
            data = json.loads(line)
        except ValueError as err:
            raise BadReply(f"not JSON ({err})") from None
        if not isinstance(data, dict):
            raise BadReply(f"not a JSON object but {type(data).__name__}")
        status = data.get("status")
        if status not in REPLY_STATUSES:
            raise BadReply(f"status {status!r} is none of {', '.join(REPLY_STATUSES)}")
        known = (
            {"status", "result", "notebook"} if status == "graded" else {"status", "why", "trace"}
        )
        if extra := sorted(set(data) - known):
            raise BadReply(f"{_a(status)} reply has no field {', '.join(map(repr, extra))}")
        if status == "internal":
            why, trace = data.get("why"), data.get("trace")
            if not isinstance(why, str):
                raise BadReply(f"an internal reply's why is text, not {type(why).__name__}")
            if not isinstance(trace, str | None):
                raise BadReply(f"an internal reply's trace is text, not {type(trace).__name__}")
            return cls.internal(why, trace)
        if "result" not in data:
            raise BadReply("a graded reply has no result")
        notebook = data.get("notebook")
        if not isinstance(notebook, str | None):
            raise BadReply(f"the autograded notebook is text, not {type(notebook).__name__}")
        try:
            result = GradingResult.from_dict(data["result"])
        except BadResult as err:
            raise BadReply(f"its result: {err}") from None
        return cls.graded(result, notebook)
