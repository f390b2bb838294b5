"""A sandbox started on a thread of its own (``Starting``), so that ``mlbook grade`` plans the cells
while bubblewrap and the sandbox's Python start: the two run on two cores at once."""

from __future__ import annotations

import threading

from mlbook_tools.errors import Crashed
from mlbook_tools.sandbox import Runner


class Starting:
    """A ``Runner`` whose start-up is waited for on a thread of its own, so that the sandbox's start
    (bubblewrap, then its Python importing torch and IPython: about a second of one CPU) runs while
    this process imports torch and nbformat and plans the cells on another core. The process is
    made here, on the caller's thread: bubblewrap's ``--die-with-parent`` (PR_SET_PDEATHSIG) fires
    when the THREAD that made it ends, so a thread that only waits must not make it. The Runner is
    the one ``Runner(**kwargs)`` would make in place (same bounds, its start-up charged the same).
    ``take`` waits for it and returns it, or raises what its start raised; ``close`` ends one nobody
    took (a refused file)."""

    def __init__(self, start_timeout: float = 60, **kwargs):
        self._runner: Runner | None = None
        self._error: BaseException | None = None
        try:
            self._runner = Runner(wait=False, **kwargs)
        except Exception as err:  # noqa: BLE001 - raised again where it is taken
            self._error = err
        self._thread = threading.Thread(
            target=self._wait, args=(start_timeout,), daemon=True, name="mlbook-sandbox-start"
        )
        self._thread.start()

    def _wait(self, timeout: float):
        if self._runner is None:
            return
        try:
            self._runner.wait_started(timeout)
        except BaseException as err:  # noqa: BLE001 - raised again where it is taken
            self._runner, self._error = None, err

    def take(self) -> Runner:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        runner, self._runner = self._runner, None
        if runner is None:
            raise Crashed()  # taken twice: a programming error, never a grade
        return runner

    def close(self):
        runner = self._runner
        if runner is not None and self._thread.is_alive():
            runner.kill()  # a start nobody will take (a refused file): ended now, not once it is up
        self._thread.join()
        if self._runner is not None:
            self._runner.close()
            self._runner = None
