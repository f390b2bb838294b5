"""An nbgrader gradebook made in-process (not a test module), for unit tests of what reads or writes
one (test_export.py, test_plugins.py).

nbgrader stamps a new gradebook with its alembic head, asked of an ``alembic heads`` subprocess;
``in_process(monkeypatch)`` reads the same head from nbgrader's own migration scripts instead.
"""

import functools
import os


@functools.cache
def alembic_head() -> str:
    """The head revision of nbgrader's migrations: what ``alembic heads`` prints for nbgrader."""
    import nbgrader
    from alembic.script import ScriptDirectory

    (head,) = ScriptDirectory(
        os.path.join(os.path.dirname(nbgrader.__file__), "alembic")
    ).get_heads()
    return head


def in_process(monkeypatch) -> None:
    """New gradebooks in this test are stamped without the ``alembic`` subprocess."""
    import nbgrader.api

    monkeypatch.setattr(nbgrader.api, "get_alembic_version", alembic_head)
