"""One line per stage of a long command, on stderr, only when a person watches (a terminal).

A notebook's ``!`` cell is not a terminal but a person watches it: a child of a Jupyter kernel
(``JPY_PARENT_PID`` set) shows the lines too. Piped or captured output elsewhere (CI, tests, a log
file) stays as it was; ``MLBOOK_PROGRESS=1`` forces the lines on, ``MLBOOK_PROGRESS=0`` off.
"""

from __future__ import annotations

import os
import sys
import time

_T0 = time.monotonic()


def enabled() -> bool:
    forced = os.environ.get("MLBOOK_PROGRESS")
    if forced is not None:
        return forced not in ("", "0")
    return sys.stderr.isatty() or bool(os.environ.get("JPY_PARENT_PID"))


def stage(message: str) -> None:
    """``[  12s] message`` on stderr, seconds since the command started."""
    if enabled():
        print(f"[{time.monotonic() - _T0:5.0f}s] {message}", file=sys.stderr, flush=True)
