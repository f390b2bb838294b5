"""formgrader with hostile submissions: no file of a submission folder served, no course switch on GET.

nbgrader 0.9.6's formgrader has two routes that act on what a student handed in:

* ``/formgrader/submissions/<id>/<path>`` (``SubmissionFilesHandler``) serves any file under the
  course folder, same-origin, as a static file: a student's ``figs/derivation.html`` (copied to
  ``autograded/`` by ``nbgrader autograde``, or reached in ``submitted/`` with ``..%2F``) runs its
  script with the instructor's session. Here that route answers 404 for every path: formgrader's
  pages render the notebook themselves and need no file of a submission folder.
* ``GET /formgrader?path=<folder>`` (``FormgraderHandler``) re-initialises formgrader with that
  folder as course root and configuration folder: the ``nbgrader_config.py`` found there runs in
  the server as the instructor, from a link or a 1x1 image in a student's answer. Here the GET
  changes nothing: ``path`` may only name the course root formgrader already shows (a redirect to
  its assignments, as before); any other folder is refused. Configuration comes only from the
  course's own ``nbgrader_config.py`` (the server's folder) and the instructor's Jupyter config.

formgrader also says what ``mlbook grade-class`` knows (``flags.py``): its submission lists' API
answers carry each misnamed, refused or unreadable submission's flag (``mlbook_flag``) and the
written answers' extra-credit maximum (``mlbook_written_extra_max``); ``templates/formgrader/``
adds one script to every formgrader page that shows them (``extend_templates``), and the Autograde
button on a flagged submission answers its one-line reason instead of running nbgrader (whose
"did you forget to run generate_assignment?" and tracebacks say nothing of the cause).

``harden(web_app)`` puts mlbook's handlers in place of nbgrader's, whichever was loaded first: in
the routes already registered, and in nbgrader's list of routes that formgrader registers when it
loads (the course config, which calls ``csp.protect_running_server``, is read just before that).
"""

from __future__ import annotations

import json
import os
import pathlib

from nbgrader.server_extensions.formgrader import apihandlers as api
from nbgrader.server_extensions.formgrader import handlers as fg
from nbgrader.server_extensions.formgrader.base import check_notebook_dir, check_xsrf
from tornado import web

from mlbook_tools import flags


class CourseRootOnly(fg.FormgraderHandler):
    """``/formgrader``: a redirect to the course's assignments; never a course switch (GET)."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self):
        path = self.get_argument("path", "")
        root = os.path.realpath(self.settings["nbgrader_formgrader"].coursedir.root)
        if path and os.path.realpath(os.path.abspath(path)) != root:
            raise web.HTTPError(
                400,
                "formgrader shows only this course (%s): switching it to another folder with "
                "?path= is off, so that no configuration is read from a folder a student controls. "
                "Start the Jupyter server in the other course's folder to grade it.",
                root,
            )
        self.redirect(f"{self.base_url}/formgrader/manage_assignments")


class NoSubmissionFiles(fg.BaseHandler):
    """``/formgrader/submissions/<id>/<path>``: nothing of a submission folder is served."""

    @web.authenticated
    def get(self, *args, **kwargs):
        raise web.HTTPError(
            404,
            "formgrader serves no file from a submission folder (mlbook): a student's extra "
            "files are listed by `mlbook grade-class`; open them as text, outside the browser.",
        )

    head = get


def _course(handler) -> pathlib.Path:
    return pathlib.Path(handler.coursedir.root)


def _flagged(handler, assignment: str, rows: list) -> list:
    """Rows of a submission list (dicts with ``student``), each flagged submission's flag added."""
    found = flags.flags_of(_course(handler), assignment, [r.get("student") for r in rows])
    extra = flags.written_extra_max(_course(handler), assignment)
    for row in rows:
        row["mlbook_flag"] = found.get(str(row.get("student")))
        row["mlbook_written_extra_max"] = extra
    return rows


class FlaggedSubmissions(api.SubmissionCollectionHandler):
    """``/formgrader/api/submissions/<assignment>``: nbgrader's list, each row's flag added."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, assignment_id):
        rows = self.api.get_submissions(assignment_id)
        self.write(json.dumps(_flagged(self, assignment_id, rows)))


class FlaggedSubmission(api.SubmissionHandler):
    """``/formgrader/api/submission/<assignment>/<student>``: one row (a refresh after Autograde)."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, assignment_id, student_id):
        row = self.api.get_submission(assignment_id, student_id)
        if row is None:
            raise web.HTTPError(404, f"Invalid assignment: {assignment_id}")
        self.write(json.dumps(_flagged(self, assignment_id, [row])[0]))


class FlaggedNotebookSubmissions(api.SubmittedNotebookCollectionHandler):
    """``/formgrader/api/submitted_notebooks/<assignment>/<notebook>``: Manual Grading's list."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, assignment_id, notebook_id):
        rows = self.api.get_notebook_submissions(assignment_id, notebook_id)
        self.write(json.dumps(_flagged(self, assignment_id, rows)))


class FlaggedStudentSubmissions(api.StudentSubmissionCollectionHandler):
    """``/formgrader/api/student_submissions/<student>``: one student's assignments."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, student_id):
        rows = self.api.get_student_submissions(student_id)
        for row in rows:
            row.setdefault("student", student_id)
            _flagged(self, row.get("name", ""), [row])
        self.write(json.dumps(rows))


class SafeIdAutograde(api.AutogradeHandler):
    """The Autograde button (``POST /formgrader/api/submission/<assignment>/<student>/autograde``).

    A student id outside the safe set (``exchange.STUDENT_ID``) is refused before nbgrader creates its
    gradebook entry or folders, with the rule in the message the button shows (the id itself is not
    echoed: the page may show the message as markup). A flagged submission answers its one-line
    reason (no nbgrader run, no traceback): a misnamed folder is looked at as it is now; a refused or
    unreadable file is checked again against the course's bounds (a file handed in again since is
    graded as usual)."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def post(self, assignment_id, student_id):
        from mlbook_tools.exchange import STUDENT_ID_RULE, student_id_problem

        if student_id_problem(student_id) is not None:
            refused = (
                f"not autograded: this student id is not allowed (ids are {STUDENT_ID_RULE}); "
                "rename its folder in submitted/ to such an id, then autograde it"
            )
            self.write(json.dumps({"success": False, "error": refused, "log": refused}))
            return
        why = live_flag(_course(self), assignment_id, student_id)
        if why is not None:
            self.write(
                json.dumps(
                    {"success": False, "mlbook_flag": why.to_dict(), "log": "", "error": why.line()}
                )
            )
            return
        self.write(json.dumps(self.api.autograde(assignment_id, student_id)))


def live_flag(course: pathlib.Path, assignment: str, student: str) -> flags.Flag | None:
    """The flag of the file in ``submitted/`` as it is now (bounds checked, nothing run)."""
    from mlbook_tools import submission
    from mlbook_tools.errors import CannotGrade
    from mlbook_tools.grading import course_limits

    flag = flags.flag_of(course, assignment, student)
    if flag is None or flag.kind == "misnamed":
        return flag
    path = course / "submitted" / student / assignment / f"{assignment}.ipynb"
    try:
        limits = course_limits(course)
        submission.bounded(submission.read_submission(path, limits), limits)
    except CannotGrade as err:  # TooLarge is one
        return flags.from_error(str(err))
    return None  # fixed since: nbgrader's autograde grades it (through the sandboxed engine)


REPLACE = {
    fg.FormgraderHandler: CourseRootOnly,
    fg.SubmissionFilesHandler: NoSubmissionFiles,
    api.SubmissionCollectionHandler: FlaggedSubmissions,
    api.SubmissionHandler: FlaggedSubmission,
    api.SubmittedNotebookCollectionHandler: FlaggedNotebookSubmissions,
    api.StudentSubmissionCollectionHandler: FlaggedStudentSubmissions,
    api.AutogradeHandler: SafeIdAutograde,
}


def _swap(spec):
    """One route of a handler list (a tuple or a URLSpec) with mlbook's handler in place of nbgrader's."""
    if isinstance(spec, tuple | list) and len(spec) > 1 and spec[1] in REPLACE:
        return (spec[0], REPLACE[spec[1]], *spec[2:])
    if getattr(spec, "target", None) in REPLACE:
        spec.target = REPLACE[spec.target]
    return spec


def _walk(router) -> int:
    """Replace nbgrader's handlers in a Tornado router's rules (nested routers too); how many."""
    n = 0
    for rule in getattr(router, "rules", ()):
        if rule.target in REPLACE:
            rule.target = REPLACE[rule.target]
            n += 1
        elif hasattr(rule.target, "rules"):
            n += _walk(rule.target)
    return n


def harden(web_app) -> None:
    """mlbook's formgrader handlers on this Tornado application, now and for routes still to come."""
    fg.default_handlers[:] = [_swap(spec) for spec in fg.default_handlers]
    api.default_handlers[:] = [_swap(spec) for spec in api.default_handlers]
    _walk(web_app.default_router)  # a few hundred rules: cheap enough on every config load


TEMPLATES = pathlib.Path(__file__).parent / "templates" / "formgrader"


def extend_templates(env) -> None:
    """formgrader's page templates (a Jinja environment) with mlbook's ``base.tpl`` first: nbgrader's
    own, plus the script that shows the flags, names and extra-credit maxima (once per environment)."""
    from jinja2 import ChoiceLoader, FileSystemLoader, PrefixLoader

    if getattr(env, "mlbook_extended", False):
        return
    original = env.loader
    env.loader = ChoiceLoader(
        [FileSystemLoader(str(TEMPLATES)), PrefixLoader({"nbgrader": original}), original]
    )
    env.mlbook_extended = True
    if env.cache is not None:
        env.cache.clear()
