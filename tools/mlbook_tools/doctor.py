"""``mlbook doctor``: whether this machine can grade as the README promises, one line per part.

bubblewrap (found, and a sandboxed runner starts), seccomp (libseccomp's Python bindings), the cgroup
back end (``cgroups.describe``: v1 or v2, where, delegated or not, usable or why not) and unprivileged
user namespaces (what bubblewrap needs when the grader is not root, as in a Kubernetes pod). Exit 0 when
every part is usable, 1 when grading would refuse or lose something, each such line saying what.
"""

from __future__ import annotations

import os
import pathlib


def _userns() -> str:
    limit = pathlib.Path("/proc/sys/user/max_user_namespaces")
    try:
        n = int(limit.read_text())
    except (OSError, ValueError):
        return "unknown (no /proc/sys/user/max_user_namespaces)"
    gate = pathlib.Path("/proc/sys/kernel/unprivileged_userns_clone")  # Debian's own switch
    closed = gate.exists() and gate.read_text().strip() == "0"
    if n == 0 or closed:
        return "off: a non-root grader's bubblewrap cannot start (root's still can)"
    return f"on (max {n})"


def lines() -> list[tuple[bool, str]]:
    """(ok, text) for each part, in the order a person fixes them."""
    from mlbook_tools import cgroups
    from mlbook_tools.confine import _bwrap_binary

    out = []
    bwrap = _bwrap_binary()
    try:
        import pyseccomp  # noqa: F401

        out.append((True, "seccomp: pyseccomp (libseccomp) found"))
    except ImportError as err:
        out.append((False, f"seccomp: NOT found ({err}): the sandbox cannot start"))
    from mlbook_tools.sandbox import check_available

    why = check_available()
    out.append(
        (
            why is None,
            f"sandbox: bubblewrap {bwrap}: "
            + ("starts" if why is None else f"does NOT start: {why}"),
        )
    )
    out.append((True, f"user namespaces: {_userns()}; grader uid {os.geteuid()}"))
    line = cgroups.describe()
    out.append((cgroups.cgroups_available() is None, line))
    if cgroups.cgroups_available() is None:
        out.append((True, "student code may start processes (bounded by the sandbox's cgroup)"))
    else:
        out.append(
            (
                False,
                "student code that starts a process is refused; memory bounded per process only",
            )
        )
    return out


def report() -> int:
    found = lines()
    for ok, text in found:
        print(("ok    " if ok else "NOT   ") + text)
    return 0 if all(ok for ok, _ in found) else 1
