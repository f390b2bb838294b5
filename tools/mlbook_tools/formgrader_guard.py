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

``harden(web_app)`` puts mlbook's handlers in place of nbgrader's, whichever was loaded first: in
the routes already registered, and in nbgrader's list of routes that formgrader registers when it
loads (the course config, which calls ``csp.protect_running_server``, is read just before that).
"""

from __future__ import annotations

import json
import os

from nbgrader.server_extensions.formgrader import apihandlers as api
from nbgrader.server_extensions.formgrader import handlers as fg
from nbgrader.server_extensions.formgrader.base import check_notebook_dir, check_xsrf
from tornado import web


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


class SafeIdAutograde(api.AutogradeHandler):
    """The Autograde button (``POST /formgrader/api/submission/<assignment>/<student>/autograde``): a
    student id outside the safe set (``exchange.STUDENT_ID``) is refused before nbgrader creates its
    gradebook entry or folders, with the rule in the message the button shows."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def post(self, assignment_id, student_id):
        from mlbook_tools.exchange import STUDENT_ID_RULE, student_id_problem

        if student_id_problem(student_id) is None:
            return api.AutogradeHandler.post(self, assignment_id, student_id)
        why = (  # the id itself is not echoed: the page may show this message as markup
            f"not autograded: this student id is not allowed (ids are {STUDENT_ID_RULE}); "
            "rename its folder in submitted/ to such an id, then autograde it"
        )
        self.write(json.dumps({"success": False, "error": why, "log": why}))


REPLACE = {
    fg.FormgraderHandler: CourseRootOnly,
    fg.SubmissionFilesHandler: NoSubmissionFiles,
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
