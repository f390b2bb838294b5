"""What keeps a submission's files from the instructor's Jupyter server, tested in-process (no
server, no nbgrader command; test_formgrader_server.py tries the same as a student would, on a
running server): formgrader's routes replaced whichever loads first, the Content-Security-Policy of
each page and file, and grade-class naming a submission's extra files.
"""

import pytest

pytestmark = pytest.mark.unit

ASSIGNMENT = "rlhf_ppo"
UP = (
    "..%2F" * 4
)  # from /formgrader/submissions/<id>/x/ up to the course root, as tornado decodes it


def test_guard_replaces_formgrader_routes_whichever_loads_first(monkeypatch):
    """formgrader_guard.harden before formgrader registers its routes (the course config is read
    first) and after (a server extension loaded later): the route is mlbook's either way."""
    from mlbook_tools import formgrader_guard as guard
    from nbgrader.server_extensions.formgrader import handlers as fg
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
    from tornado.web import Application

    back = {new: old for old, new in guard.REPLACE.items()}
    nbgraders = [(s[0], back.get(s[1], s[1]), *s[2:]) for s in fg.default_handlers]

    def handler_of(app, path):
        request = HTTPServerRequest(
            start_line=RequestStartLine("GET", path, "HTTP/1.1"),
            headers=HTTPHeaders({"Host": "127.0.0.1"}),
        )
        return app.find_handler(request).handler_class

    for harden_first in (True, False):
        monkeypatch.setattr(fg, "default_handlers", list(nbgraders))
        app = Application([])
        if harden_first:
            guard.harden(app)
        app.add_handlers(".*$", fg.default_handlers)  # as FormgradeExtension.init_handlers
        if not harden_first:
            assert handler_of(app, "/formgrader/submissions/a/b.html") is fg.SubmissionFilesHandler
            guard.harden(app)
        assert handler_of(app, "/formgrader") is guard.CourseRootOnly
        assert handler_of(app, "/formgrader/submissions/a/figs/b.html") is guard.NoSubmissionFiles
        assert (
            handler_of(app, "/formgrader/submissions/a/") is fg.SubmissionHandler
        )  # the page stays


def test_policy_fetches_no_student_address_and_sandboxes_every_submission_file():
    from mlbook_tools import csp
    from tornado.httputil import HTTPHeaders

    csp.CspTransform.settings, csp.CspTransform.trusted = {"base_url": "/"}, set()

    def headers(path, kind="text/html"):
        h = HTTPHeaders({"Content-Type": kind})
        csp.CspTransform(type("Request", (), {"path": path})).transform_first_chunk(
            200, h, b"", True
        )
        return h

    page = headers("/formgrader/submissions/abc/").get_list("Content-Security-Policy")[-1]
    assert "img-src data:;" in page and "connect-src 'self';" in page and "ws:" not in page, page
    lab = headers("/lab/tree/x.ipynb").get_list("Content-Security-Policy")[-1]
    assert "img-src 'self' data: blob:" in lab  # JupyterLab's own pages show the server's files
    for path in (
        "/formgrader/submissions/abc/figs/derivation.html",
        "/formgrader/submissions/abc/derivation",
        f"/formgrader/submissions/abc/x/{UP}submitted%2Fm%2Fa%2Ffigs%2Fd.html",
        "/files/course/submitted/m/a/figs/d.html",
        "/files/%73ubmitted/m/a/d.html",
        "/files/autograded/m/a/d.html",
    ):
        h = headers(path)
        assert h.get_list("Content-Security-Policy")[-1] == csp.SANDBOX, path
        assert h["X-Content-Type-Options"] == "nosniff", path
        if path.startswith("/files/"):
            assert h["Content-Disposition"] == "attachment", path
    assert "Content-Disposition" not in headers("/files/notes/mine.html")  # the instructor's own
    assert "img-src data:;" in csp.SANDBOX


def test_one_policy_header_so_formgrader_opens_inside_the_hubs_jupyterlab():
    """A JupyterHub single-user server sends its own policy (frame-ancestors 'none'); two headers
    are two policies and the stricter blanks formgrader's tab in JupyterLab (Nbgrader > Formgrader)."""
    from mlbook_tools import csp
    from tornado.httputil import HTTPHeaders

    csp.CspTransform.settings, csp.CspTransform.trusted = {"base_url": "/user/t/"}, set()
    h = HTTPHeaders({"Content-Type": "text/html"})
    h.add(
        "Content-Security-Policy",
        "frame-ancestors 'none'; report-uri /user/t/api/security/csp-report",
    )
    csp.CspTransform(type("Request", (), {"path": "/user/t/formgrader"})).transform_first_chunk(
        200, h, b"", True
    )
    (one,) = h.get_list("Content-Security-Policy")
    assert "frame-ancestors 'self'" in one and "'none'" not in one.split("frame-ancestors")[1], one
    assert "report-uri /user/t/api/security/csp-report" in one and "img-src data:;" in one, one


def test_grade_class_names_a_submissions_extra_files(tmp_path):
    import io

    from mlbook_tools.classreport import report_extra_files

    for student, files in {
        "alice": [f"{ASSIGNMENT}.ipynb", "timestamp.txt", "submission_secret.txt"],
        "mallory": [
            f"{ASSIGNMENT}.ipynb",
            "figs/derivation.html",
            "figs/x.js",
            "nbgrader_config.py",
        ],
        "eve\x1b[2J": [f"{ASSIGNMENT}.ipynb", "a\nb.txt"] + [f"many/{i:03d}" for i in range(30)],
    }.items():
        for name in files:
            path = tmp_path / "submitted" / student / ASSIGNMENT / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (tmp_path / "submitted" / "mallory" / ASSIGNMENT / "link").symlink_to(outside)
    out = io.StringIO()
    found = report_extra_files(tmp_path, ASSIGNMENT, out)
    assert found["mallory"] == ["figs/derivation.html", "figs/x.js", "link", "nbgrader_config.py"]
    assert "alice" not in found and len(found["eve\x1b[2J"]) == 20
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue(), lines
    assert lines[0].startswith("eve") and lines[0].endswith("and 11 more"), lines[0]
    assert "EXTRA FILES" in lines[1] and "figs/derivation.html" in lines[1], lines[1]
    assert not (tmp_path / "autograded").exists()  # named only: copied nowhere
    # a misnamed notebook is named once, on its NOT GRADED line, not again as an extra file
    from mlbook_tools.classentry import ClassEntry, Outcome

    copy1 = f"{ASSIGNMENT}-Copy1.ipynb"
    (tmp_path / "submitted" / "dan" / ASSIGNMENT).mkdir(parents=True)
    (tmp_path / "submitted" / "dan" / ASSIGNMENT / copy1).write_text("x")
    dan = ClassEntry("dan", Outcome.MISNAMED, problems=("misnamed",), found=(copy1,))
    assert report_extra_files(tmp_path, ASSIGNMENT, io.StringIO())["dan"] == [copy1]
    assert "dan" not in report_extra_files(tmp_path, ASSIGNMENT, io.StringIO(), said={"dan": dan})
