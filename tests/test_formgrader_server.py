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
browser one (Debian's Chromium, as tests/test_xss.py) runs in ``make test-full``. The guard's routes,
the policy headers and grade-class's list of extra files are unit tests (test_formgrader_guard.py).
"""

import hashlib
import json
import pathlib
import subprocess

import nbformat
import pytest
from browser_support import BIN, chrome, have_chromium
from browser_support import Server as BaseServer
from mlbook_tools.config import layout

pytestmark = pytest.mark.nbgrader

ASSIGNMENT = "rlhf_ppo"
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


def Server(folder: pathlib.Path, log: pathlib.Path) -> BaseServer:
    """``jupyter server`` (formgrader loads as its extension) in ``folder``, every request logged."""
    return BaseServer("server", folder, log, debug=True)


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
    if not have_chromium():
        pytest.skip("chromium / chromium-driver not installed (.ci/run installs them)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    course, proof, _, ids = course
    before = _sha(course / "gradebook.db")
    driver = chrome(tmp_path / "profile")
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
