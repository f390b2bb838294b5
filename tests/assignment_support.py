"""A second, tiny book: one assignment configured by one ``[tool.mlbook.assignments.<name>]`` table,
written into a folder (tests/test_assignment_config.py reads its configuration,
tests/test_second_assignment.py builds and grades it with the same commands as the chapter).

Its notebook is the title a build requires plus two cells: an answer cell (``double``, stubbed from
the reference module) and a test cell whose one check, ``check_double``, takes ``double`` from the
student and ``quadruple`` from the reference module, which calls the student's ``double``.
"""

import pathlib
import re

from mlbook_tools.config import layout

NAME = "tiny"
COURSE_ID = "tiny-course"
REFERENCE = "tiny_reference"  # a module name: importable from <root>/lib (PYTHONPATH)
POINTS = 2

PYPROJECT = f"""\
[tool.mlbook]
chapters-src = "chapter"
course = "course"
release = "release"
solved = "solved"
student-dist = "dist"

[tool.mlbook.assignments.{NAME}]
checks = "tiny_checks.py"
reference = "{REFERENCE}"
"""

FRAGMENT = f"""\
# %% [markdown]
# # Doubling
#
# Write `double`; the course's `quadruple` calls it twice.

# %% stub="{REFERENCE}:double"

# %% test="test_double"
# Graded: `double`, and the course's `quadruple`, which calls it.
"""

REFERENCE_MODULE = '''\
"""The tiny assignment's reference: the answer, and course code that calls it."""


def double(x):
    """Twice ``x``."""
    return 2 * x


def quadruple(x):
    """Four times ``x``: ``double`` twice (the student's own ``double`` when graded)."""
    return double(double(x))
'''

CHECKS_MODULE = f'''\
"""The tiny assignment's one graded check, declared with @graded as the chapter's are."""

import inspect
import warnings
from dataclasses import dataclass

CHECKS = {{}}


@dataclass(frozen=True)
class Check:
    grade_id: str
    points: float
    fn: object
    names: tuple
    extra = False

    def call_source(self):
        return f"{{self.fn.__name__}}({{', '.join(self.names)}})"


def graded(grade_id, points):
    def declare(fn):
        CHECKS[grade_id] = Check(grade_id, points, fn, tuple(inspect.signature(fn).parameters)[:-1])
        return fn

    return declare


@graded("test_double", points={POINTS})
def check_double(double, quadruple, seed=0):
    x = seed % 97 + 1
    assert double(x) == 2 * x, f"double({{x}}) is {{double(x)}}, expected {{2 * x}}"
    assert quadruple(x) == 4 * x, f"quadruple({{x}}) is {{quadruple(x)}}, expected {{4 * x}}"
'''


def write_book(root: pathlib.Path, pyproject: str = PYPROJECT) -> pathlib.Path:
    """The tiny book in ``root``: its pyproject.toml (``pyproject``), fragments, checks, reference
    (in ``root/lib``) and a course folder whose nbgrader_config.py is the chapter's with its own
    course id. Returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(pyproject)
    (root / "chapter" / NAME).mkdir(parents=True)
    (root / "chapter" / NAME / "10_tiny.py").write_text(FRAGMENT)
    (root / "tiny_checks.py").write_text(CHECKS_MODULE)
    (root / "lib").mkdir()
    (root / "lib" / f"{REFERENCE}.py").write_text(REFERENCE_MODULE)
    (root / "course").mkdir()
    config = (layout().course / "nbgrader_config.py").read_text()
    config, n = re.subn(
        r'^c\.CourseDirectory\.course_id = ".*"$',
        f"c.CourseDirectory.course_id = {COURSE_ID!r}",
        config,
        flags=re.M,
    )
    assert n == 1, "the chapter's course config sets its course id once"
    (root / "course" / "nbgrader_config.py").write_text(config)
    return root
