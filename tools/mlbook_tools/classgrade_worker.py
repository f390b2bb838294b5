"""grade-class's worker processes, and the parent's threads that drive them (``classgrade.py`` runs both).

The workers are plain subprocesses (``python -m mlbook_tools.classgrade_worker --worker``: the
module's name starts with ``classgrade``, which the unit lane's guard in tests/conftest.py knows as
"a grader worker") that speak one JSON object per line on their stdin/stdout: nothing is pickled,
and the sandboxes they start inherit no descriptor but their runner's pipes (``sandbox.Runner``
closes every other one), so no student code can reach a worker's or the parent's channel. One
thread in the parent drives each worker (``drive``). A worker that dies or reports an internal
error (a sandbox that cannot start, an engine bug) costs nothing: it is replaced and the submission
is graded again; one that still cannot be graded is reported UNGRADED, never recorded as a grade
and never cached. The backstop holds for the whole grading, the trusted side's reading, parsing and
notebook writing too: a worker says "started" when it takes a submission; one that has not
answered by the submission's wall-clock backstop (``wall_factor`` x the budget) +
``grace_seconds`` after that is killed and the submission reported UNGRADED at once (a second try
would only take as long again).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
import traceback

from mlbook_tools import feedback, grading, submission
from mlbook_tools.classentry import BadReply, ClassEntry, Outcome, WorkerReply
from mlbook_tools.errors import TooLarge
from mlbook_tools.limits import GradingLimits

STARTED = json.dumps({"status": "started"})  # a worker took a submission
WORKER = [sys.executable, "-m", "mlbook_tools.classgrade_worker", "--worker"]


def worker_main() -> None:
    """Read {"init": ...} then {"student", "path"} lines on stdin; write one JSON line per submission."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the engine prints goes to stderr, never into the channel
    sys.stdout = sys.stderr
    import torch

    torch.set_num_threads(1)
    init = json.loads(sys.stdin.readline())
    init["limits"] = GradingLimits.from_dict(init["limits"])  # plain JSON in, every name checked
    source_nb, checks, secret = grading.load_course(
        pathlib.Path(init["course"]), init["assignment"]
    )
    for line in sys.stdin:
        job = json.loads(line)
        channel.write(STARTED + "\n")  # the parent's backstop counts from here
        channel.flush()
        reply = _grade_one(job["student"], job["path"], source_nb, checks, secret, init)
        channel.write(reply.to_json() + "\n")
        channel.flush()


def _grade_one(student, path, source_nb, checks, secret, init) -> WorkerReply:
    t0 = time.monotonic()
    try:
        import nbformat

        limits: GradingLimits = init["limits"]
        wall = t0 + limits.budget_seconds * limits.wall_factor  # counted from reading the file
        try:
            text = submission.read_submission(
                path, limits
            )  # bounded before it is read whole or parsed
        except TooLarge as err:
            result, plan = grading.refused_result(source_nb, err), None
        else:
            result, plan = grading.grade_submission(
                text,
                source_nb,
                checks,
                secret,
                student,
                trusted=init["trusted"],
                wall_deadline=wall,
                limits=limits,
                assignment=init.get("assignment"),  # None: the default assignment
            )
        notebook = nbformat.writes(feedback.autograded_notebook(source_nb, plan, result, limits))
    except Exception as err:  # noqa: BLE001 - not a grade: the parent retries, then reports it ungraded
        return WorkerReply.internal(
            f"{type(err).__name__}: {str(err)[:500]}", traceback.format_exc()[-2000:]
        )
    seconds = round(time.monotonic() - t0, 2)
    return WorkerReply.graded(dataclasses.replace(result, seconds=seconds), notebook)


class _Worker:
    """One worker subprocess and its JSON pipe, driven by one thread of the parent."""

    def __init__(self, init: dict):
        self.proc = subprocess.Popen(
            WORKER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            text=True,
        )
        self.proc.stdin.write(json.dumps(init) + "\n")
        self.proc.stdin.flush()
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def grade(self, student: str, path: str, start: float, backstop: float) -> WorkerReply:
        """The worker's reply; "internal" when it died, did not take the submission within ``start``
        seconds or wrote something that is not a reply (``WorkerReply.from_json`` says what);
        "backstop" when it did not answer within ``backstop`` seconds of taking it."""
        try:
            self.proc.stdin.write(json.dumps({"student": student, "path": path}) + "\n")
            self.proc.stdin.flush()
            line = self.lines.get(timeout=start)
        except queue.Empty:
            return WorkerReply.internal(f"the grading worker did not start within {start:.0f} s")
        except OSError:
            line = None
        if line is not None and line.strip() == STARTED:
            try:
                line = self.lines.get(timeout=backstop)
            except queue.Empty:
                return WorkerReply.backstop(
                    f"its grading did not end by its wall-clock backstop + grace ({backstop:g} s) and was stopped"
                )
        if line is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            return WorkerReply.internal(f"the grading worker died (exit {self.proc.returncode})")
        try:
            return WorkerReply.from_json(line)
        except BadReply as err:
            return WorkerReply.internal(f"the grading worker's reply: {err}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def drive(
    init: dict, jobs: queue.Queue, done: queue.Queue, start: float, backstop: float, attempts: int
):
    """One parent thread: take jobs, grade them on its worker, retry what was not a grade (but a
    grading stopped at its backstop: a second try would take as long again)."""
    worker = None
    try:
        while True:
            try:
                student, path, fp, attempt = jobs.get_nowait()
            except queue.Empty:
                return
            if worker is None or not worker.alive():
                worker = _Worker(init)
            reply = worker.grade(student, path, start, backstop)  # checked: types, totals
            if reply.status == "graded":
                entry = ClassEntry(student, Outcome.GRADED, reply.result, fingerprint=fp)
                done.put((entry, reply.notebook))
                continue
            worker.kill()  # a fresh worker for the retry (and for whatever comes next)
            worker = None
            if attempt + 1 < attempts and reply.status != "backstop":
                jobs.put((student, path, fp, attempt + 1))
            else:
                tries = attempt + 1
                why = f"UNGRADED after {tries} attempt{'s' * (tries > 1)}: {reply.why}"
                entry = ClassEntry(
                    student, Outcome.UNGRADED, fingerprint=fp, problems=(why,), trace=reply.trace
                )
                done.put((entry, None))
    finally:
        if worker is not None:
            worker.stop()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
