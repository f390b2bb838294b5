"""The instructor's Jupyter server trusts nothing in a submission folder (issue 31), tried as a student would.

Attack kinds, each an entry of ``ATTACKS`` (requested as the instructor, with the instructor's token):

* ``extra-file``: a student hands in ``figs/derivation.html`` (and the ``x.js`` it loads) beside the
  notebook and links to it from an answer. formgrader served it same-origin from
  ``/formgrader/submissions/<id>/...`` (from ``autograded/``, where ``nbgrader autograde`` copies a
  submission's files, or from ``submitted/`` through ``..%2F``), its script running as the
  instructor. Now: 404 for every file of a submission; ``/files/`` serves them as a sandboxed
  download; ``mlbook grade-class`` names them.
* ``GET-side-effect``: ``/formgrader?path=submitted/<student>/rlhf_ppo`` (an image in an answer is
  enough) made formgrader switch course and run the ``nbgrader_config.py`` found there as the
  instructor. Now: refused for any folder but the course root (no configuration read, no state
  changed); the course root itself still redirects to the assignments.

After all of them: no proof file written by student code, the gradebook byte-for-byte the same,
formgrader still shows the course. The server tests start a Jupyter server (``nbgrader`` kind); the
browser one (Debian's Chromium, as tests/test_xss.py) runs in ``make test-full``.
"""

import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat
import pytest
from mlbook_tools.config import layout

BIN = pathlib.Path(sys.executable).parent
ASSIGNMENT = "rlhf_ppo"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
HTML = '<html><body><p id="d">derivation</p><script src="x.js"></script></body></html>'
UP = (
    "..%2F" * 4
)  # from /formgrader/submissions/<id>/x/ up to the course root, as tornado decodes it
ATTACKS = [  # (kind, address with {id} the submission's, {shared} a folder outside the course)
    ("extra-file", "/formgrader/submissions/{id}/figs/derivation.html"),
    ("extra-file", "/formgrader/submissions/{id}/figs/x.js"),
    ("extra-file", "/formgrader/submissions/{id}/nbgrader_config.py"),
    (
        "extra-file",
        f"/formgrader/submissions/{{id}}/x/{UP}submitted%2Fmallory%2F{ASSIGNMENT}%2Ffigs%2Fderivation.html",
    ),
    (
        "extra-file",
        f"/formgrader/submissions/{{id}}/x/{UP}submitted/mallory/{ASSIGNMENT}/figs/x.js",
    ),
    ("GET-side-effect", f"/formgrader?path=submitted/mallory/{ASSIGNMENT}"),
    ("GET-side-effect", f"/formgrader/?path=submitted%2Fmallory%2F{ASSIGNMENT}%2F"),
    ("GET-side-effect", "/formgrader?path={shared}"),  # the hub: a config in a shared /tmp folder
    ("GET-side-effect", "/formgrader?path=.."),
]


def _sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Server:
    """``jupyter server`` (formgrader loads as its extension) in ``folder`` on 127.0.0.1, with a token."""

    def __init__(self, folder: pathlib.Path, log: pathlib.Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.token = os.urandom(12).hex()
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [
            str(BIN / "jupyter"),
            "server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={folder}",
            "--log-level=DEBUG",  # every request in the log (a 200 is logged at debug level)
        ] + (["--allow-root"] if os.geteuid() == 0 else [])
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def requests(self) -> list[str]:
        """The requests the server logged so far (every one: it runs with --log-level=DEBUG)."""
        self.log.flush()
        text = pathlib.Path(self.log.name).read_text(errors="replace")
        return [line for line in text.splitlines() if " GET " in line or " POST " in line]

    def url(self, path: str, token: bool = True) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}{path}" + (f"{sep}token={self.token}" if token else "")

    def get(self, path: str):
        """(status, headers, body) of a GET as the instructor; a redirect is answered, not followed."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args):
                return None

        try:
            with urllib.request.build_opener(NoRedirect).open(self.url(path), timeout=60) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def __enter__(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the Jupyter server exited; see its log"
            try:
                with urllib.request.urlopen(self.url("/api/status"), timeout=5):
                    return self
            except OSError:
                time.sleep(0.5)  # polling interval of an explicit wait
        raise TimeoutError("the Jupyter server did not answer")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course (`mlbook new-course`) with alice (a graded cell) and mallory, whose folder holds
    figs/derivation.html, figs/x.js and an nbgrader_config.py that writes a proof file; her
    autograded folder holds the same files, as `nbgrader autograde` (the Autograde button) leaves it."""
    import warnings

    from mlbook_tools.grading import run_nbgrader
    from nbgrader.api import Gradebook

    top = tmp_path_factory.mktemp("fgserver")
    course, proof, shared = top / "course", top / "PROOF", top / "shared" / "cfg"
    mlbook = subprocess.run(
        [str(BIN / "mlbook"), "new-course", str(course)], capture_output=True, text=True
    )
    assert mlbook.returncode == 0, mlbook.stderr[-2000:]
    run_nbgrader(["generate_assignment", ASSIGNMENT, "--force"], course)
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    config = f"open({str(proof)!r}, 'a').write('student code ran as the instructor\\n')\nc = get_config()\n"
    answer = nbformat.v4.new_markdown_cell(
        "My derivation: [see the figure](figs/derivation.html)\n\n"
        f'<img src="/logout" alt="a"><img src="/formgrader?path=submitted/mallory/{ASSIGNMENT}" alt="b">\n\n'
        f"![c](/formgrader/submissions/x/{UP}submitted/mallory/{ASSIGNMENT}/figs/x.js)"
    )
    shared.mkdir(parents=True)
    (shared / "nbgrader_config.py").write_text(config)
    for student in ("alice", "mallory"):
        for where in ("submitted", "autograded"):
            folder = course / where / student / ASSIGNMENT
            (folder / "figs").mkdir(parents=True)
            nb = nbformat.from_dict(json.loads(json.dumps(release)))
            if student == "mallory":
                nb.cells.append(answer)
                (folder / "figs" / "derivation.html").write_text(HTML)
                (folder / "figs" / "x.js").write_text("document.getElementById('d').id = 'ran';")
                (folder / "nbgrader_config.py").write_text(config)
            nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy autoflush notes from inside nbgrader's own API
        ids = {}
        for student in ("alice", "mallory"):
            gb.add_student(student, last_name=student, first_name="")
            gb.add_submission(ASSIGNMENT, student)
            ids[student] = gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student).id
        grade = next(g for g in gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, "alice").grades)
        grade.auto_score = grade.max_score  # an honest classmate's points, to keep
        gb.db.commit()
    return course, proof, shared, ids


@pytest.mark.nbgrader
def test_formgrader_serves_no_submission_file_and_no_get_reconfigures(course, tmp_path):
    course, proof, shared, ids = course
    before = _sha(course / "gradebook.db")
    broken = []  # every attack is tried, whatever the one before it did
    with Server(course, tmp_path / "server.log") as server:
        for kind, address in ATTACKS:
            path = address.format(id=ids["mallory"], shared=shared)
            status, headers, body = server.get(path)
            policies = headers.get_all("Content-Security-Policy") or [""]
            if b"derivation" in body or b"getElementById" in body:
                broken.append((kind, path, status, "the student's file was served"))
            if proof.exists():
                broken.append((kind, path, status, f"student code ran: {proof.read_text()!r}"))
                proof.unlink()
            if kind == "extra-file" and (status != 404 or not policies[-1].endswith("sandbox")):
                broken.append((kind, path, status, "not a sandboxed 404"))
            if kind == "GET-side-effect" and b"formgrader shows only this course" not in body:
                broken.append((kind, path, status, "not refused"))
        assert broken == [], broken
        # formgrader still shows this course (no switch happened), and its root is still a plain redirect
        status, _, body = server.get("/formgrader/api/assignments")
        assert status == 200 and [a["name"] for a in json.loads(body)] == [ASSIGNMENT], body[:300]
        for path in ("/formgrader", f"/formgrader?path={course}", "/formgrader?path=."):
            status, headers, _ = server.get(path)
            assert status == 302 and headers["Location"].endswith("/formgrader/manage_assignments")
        # what the plain Jupyter server still serves from a student's folder: a sandboxed download
        status, headers, _ = server.get(
            f"/files/submitted/mallory/{ASSIGNMENT}/figs/derivation.html"
        )
        assert status == 200 and headers["Content-Disposition"].startswith("attachment")
        assert any(p.endswith("sandbox") for p in headers.get_all("Content-Security-Policy"))
        # the submission page itself: images only inline, no request but to the server
        status, headers, body = server.get(f"/formgrader/submissions/{ids['mallory']}/")
        assert status == 200 and b"My derivation" in body
        policy = [p for p in headers.get_all("Content-Security-Policy") if "script-src" in p][0]
        assert "img-src data:;" in policy and "connect-src 'self';" in policy, policy
    assert not proof.exists() and _sha(course / "gradebook.db") == before


@pytest.mark.browser
@pytest.mark.full  # a browser on a Jupyter server: minutes on two busy cores
def test_instructor_opens_and_clicks_a_hostile_submission(course, tmp_path):
    """Opening mallory's page (images at /logout and /formgrader?path=...) and clicking her link to
    figs/derivation.html: the instructor stays logged in, no script of hers runs, nothing is written."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("chromium / chromium-driver not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from test_browser import FLAGS

    course, proof, _, ids = course
    before = _sha(course / "gradebook.db")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        wait = WebDriverWait(driver, 120, poll_frequency=0.3)
        with Server(course, tmp_path / "server.log") as server:
            # logged in by the token, the cookie for the whole server (formgrader's own pages set
            # it for their folder only: nbgrader's handlers strip the base url's "/")
            driver.get(server.url("/api/status"))
            driver.get(server.url(f"/formgrader/submissions/{ids['mallory']}/", token=False))
            wait.until(
                lambda d: d.execute_script(
                    "return document.readyState === 'complete' && [...document.querySelectorAll("
                    "'input.extra-credit')].some(e => e.hasAttribute('placeholder'))"
                ),
                "formgrader's page did not load its grades (the instructor logged out?)",
            )
            seen = server.requests()
            assert any("/formgrader/api/grades" in line for line in seen), seen[-5:]  # logged
            asked = [line for line in seen if "/logout" in line or "path=" in line]
            assert asked == [], asked  # the images' addresses never reached the server
            links = driver.find_elements(By.PARTIAL_LINK_TEXT, "see the figure")
            if links:  # a link kept by the sanitiser: the instructor clicks it
                links[0].click()
            else:  # shown as text: the instructor types its address
                driver.get(
                    server.url(f"/formgrader/submissions/{ids['mallory']}/figs/derivation.html")
                )
            wait.until(lambda d: "derivation.html" in d.current_url)
            wait.until(lambda d: d.execute_script("return document.readyState === 'complete'"))
            assert not driver.find_elements(By.ID, "ran") and not driver.find_elements(By.ID, "d")
            # still logged in: formgrader answers without the token (the login cookie is intact)
            driver.get(server.url("/formgrader/manage_assignments", token=False))
            wait.until(lambda d: d.execute_script("return document.readyState === 'complete'"))
            assert "/login" not in driver.current_url, driver.current_url
            assert "formgrade" in driver.title.lower(), driver.title
    finally:
        driver.quit()
    assert not proof.exists() and _sha(course / "gradebook.db") == before


# ------------------------------------------------------------------- no server: the pieces alone


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

    from mlbook_tools.classgrade import report_extra_files

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
