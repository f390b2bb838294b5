"""Student content is inert in the instructor's browser: formgrader, the feedback page, the exports.

One course (outside the checkout, `mlbook new-course`), graded once by `mlbook grade-class`, holds a
submission carrying every payload kind of tests/xss_payloads.py in every place a student controls,
and students whose id (folder name) is a payload. As the instructor (one Jupyter server, Debian's
Chromium), the test opens formgrader's student list, each student's pages, the manual-grading list
and every submission, then the feedback pages nbgrader writes, and asserts: no canary script ran (no
page flag, no request in the log of the test's own HTTP endpoint on 127.0.0.1, which any script,
CSS or ``<base>`` trick would reach), no active attribute or URL is left in the page, the gradebook
is byte-for-byte what grading wrote, and formgrader still works (its own scripts run under the
course's Content-Security-Policy: tables filled, scores loaded, math typeset). The CSP is checked as
a wall of its own: an inline handler put into the page after the sanitiser does not run.

Needs /usr/bin/chromium and /usr/bin/chromedriver, as tests/test_browser.py.
"""

import copy
import csv
import hashlib
import html
import http.server
import json
import os
import pathlib
import re
import subprocess
import threading
import time

import nbformat
import pytest
import xss_payloads as X
from browser_support import BIN, Server, chrome, have_chromium
from browser_support import offline as _offline
from mlbook_tools.config import layout
from mlbook_tools.result import GradingResult

pytestmark = pytest.mark.browser

ASSIGNMENT = "rlhf_ppo"

# Cheap checks first (no browser): the autograded notebook itself keeps no active content.


def _payload_text(port: int = 1) -> str:
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    return json.dumps(X.payload_notebook(release, port))


ACTIVE = (
    "text/html",
    "image/svg+xml",
    "application/javascript",
    "text/markdown",
    "text/latex",
    "application/vnd.jupyter.widget-view+json",
)


def _assert_inert(nb: dict) -> None:
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            assert not set(out.get("data", {})) & set(ACTIVE), out.get("data", {}).keys()
            assert not out.get("metadata"), out["metadata"]
            for text in [
                out.get("text", ""),
                *out.get("data", {}).values(),
                *out.get("traceback", []),
            ]:
                text = "".join(text) if isinstance(text, list) else str(text)
                assert len(text) <= 2100 or text.isascii() and set(text) <= set(X.BASE64), len(text)
        for bundle in cell.get("attachments", {}).values():
            assert set(bundle) <= {"image/png", "image/jpeg"}, bundle.keys()
        assert "127.0.0.1" not in json.dumps(cell.get("metadata", {})), cell[
            "metadata"
        ]  # no payload kept
    assert "127.0.0.1" not in json.dumps(nb["metadata"]) and "widgets" not in nb["metadata"]


def test_autograded_notebook_keeps_no_active_content():
    """`mlbook grade-class`'s notebook (autograded_notebook) and the Autograde button's (InertStudentCells)."""
    from mlbook_tools import driver, feedback
    from mlbook_tools.inert import InertStudentCells

    source_nb = nbformat.read(
        layout().course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    text = _payload_text()
    plan = driver.make_plan(source_nb, text)
    nb = feedback.autograded_notebook(source_nb, plan, GradingResult(problems=[]))
    assert sum(c.cell_type == "markdown" and "Added top" in c.source for c in nb.cells) == 1
    assert any(c.get("attachments", {}).get("ok.png") for c in nb.cells)  # a student's PNG stays
    _assert_inert(json.loads(nbformat.writes(nb)))
    button, _ = InertStudentCells().preprocess(nbformat.reads(text, as_version=4), {})
    _assert_inert(json.loads(nbformat.writes(button)))


def test_autograded_notebooks_keep_the_first_200_outputs():
    """2000 cells of 20 outputs (within the bounds) took formgrader ~10 s of CPU to open: both
    autograded notebooks keep the first 200 (verdicts apart) and say how many are left out."""
    from mlbook_tools.inert import MAX_NOTEBOOK_OUTPUTS, InertStudentCells

    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    out = nbformat.v4.new_output("stream", name="stdout", text="x\n")
    release.cells[1:1] = [nbformat.v4.new_code_cell("1", outputs=[out] * 20) for _ in range(30)]
    button, _ = InertStudentCells().preprocess(copy.deepcopy(release), {})
    for nb in (_autograded(json.loads(nbformat.writes(release))), button):
        kept = [
            o
            for c in nb.cells
            if not c.metadata.get("nbgrader", {}).get("grade")
            for o in c.get("outputs", [])
        ]
        assert len(kept) == MAX_NOTEBOOK_OUTPUTS + 1 == 201
        assert "[... 400 more outputs not shown" in kept[-1]["text"]


def test_manual_score_changes_are_reported(tmp_path, monkeypatch):
    """grade-class's report (manual_audit): who, which cell, old -> new; nothing when nothing changed."""
    import io

    monkeypatch.setenv(
        "PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    )  # nbgrader runs alembic

    from mlbook_tools import manual_audit
    from nbgrader.api import Gradebook

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url) as gb:
        gb.add_assignment("a")
        gb.add_notebook("a", "a")
        for gid in ("essay", "ex1"):
            gb.add_grade_cell(gid, "a", "a", max_score=2, cell_type="markdown")
        for student in ("alice", "<img src=x onerror=alert(1)>\x1b[2J"):
            gb.add_student(student)
            gb.add_submission("a", student)
        gb.find_grade("essay", "a", "a", "alice").manual_score = 2.0
        gb.db.commit()
    assert (
        manual_audit.report(tmp_path, "a", io.StringIO()) == []
    )  # first run: nothing to compare with
    manual_audit.save(tmp_path, "a")
    assert manual_audit.report(tmp_path, "a", io.StringIO()) == []
    with Gradebook(url) as gb:
        gb.find_grade("essay", "a", "a", "alice").manual_score = 0.0
        gb.find_grade("ex1", "a", "a", "<img src=x onerror=alert(1)>\x1b[2J").extra_credit = 8.0
        gb.db.commit()
    out = io.StringIO()
    lines = manual_audit.report(tmp_path, "a", out)
    assert lines == [
        "extra credit changed: <img src=x onerror=alert(1)>\ufffd[2J / ex1: none -> 8",
        "manual score changed: alice / essay: 2 -> 0",
    ], lines
    assert "2 manual score(s) changed" in out.getvalue() and "\x1b" not in out.getvalue()


def test_clean_html_keeps_markdown_readable():
    """nbconvert's own allow-list drops headings, paragraphs, images (nbconvert #2016): this one keeps them."""
    from mlbook_tools.inert import clean_html

    html = (
        "<h2>Title</h2><p>a <em>b</em> <strong>c</strong> $x^2$</p><ul><li>i</li></ul><table><tr><th>h</th>"
        '<td>d</td></tr></table><pre><code>x = 1</code></pre><img src="data:image/png;base64,iVBO" alt="fig">'
        '<a href="https://example.org">l</a><blockquote>q</blockquote>'
    )
    out = clean_html(html)
    for tag in (
        "<h2>",
        "<p>",
        "<em>",
        "<strong>",
        "<li>",
        "<th>",
        "<td>",
        "<pre>",
        "<code>",
        "<img",
        "<blockquote>",
    ):
        assert tag in out, (tag, out)
    assert "$x^2$" in out and 'src="data:image/png;base64,iVBO"' in out
    # a link is its text and its address, shown, not followed (issue 31)
    assert 'l (<code class="mlbook-address">https://example.org</code>)' in out and "<a" not in out
    from html.parser import HTMLParser

    from nbconvert.filters.markdown import markdown2html

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))

    for kind in X.KINDS:
        parser = Tags()
        parser.feed(
            clean_html(markdown2html(X.fill(kind, 1, "unit")))
        )  # markdown first, as the pages do
        for tag, attrs in parser.found:
            assert tag not in (
                "script",
                "iframe",
                "object",
                "embed",
                "style",
                "link",
                "base",
                "meta",
                "form",
                "svg",
                "input",
                "button",
                "video",
                "source",
                "body",
                "marquee",
                "xss",
            ), (kind, tag)
            for name, value in attrs.items():
                value = (value or "").strip().lower()
                assert not name.startswith("on") and name not in (
                    "style",
                    "srcdoc",
                    "formaction",
                    "action",
                ), (kind, name)
                assert not value.startswith(("javascript:", "data:text", "jav")), (
                    kind,
                    name,
                    value,
                )
                assert not (tag == "img" and value.startswith("http")), (kind, value)


def _attributes(html: str) -> list[tuple[str, str, str]]:
    """(tag, attribute, value) of every attribute in ``html``."""
    from html.parser import HTMLParser

    found = []

    class Attrs(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend((tag, name, value or "") for name, value in attrs)

    Attrs().feed(html)
    return found


def _autograded(student_nb: dict, problems=()):
    """The autograded notebook `mlbook grade-class` writes for ``student_nb`` (no sandbox: no verdicts)."""
    from mlbook_tools import driver, feedback

    source_nb = nbformat.read(
        layout().course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    plan = driver.make_plan(source_nb, json.dumps(student_nb))
    return feedback.autograded_notebook(source_nb, plan, GradingResult(problems=list(problems)))


def _formgrader_page(path: pathlib.Path) -> str:
    """formgrader's submission page for the notebook at ``path``: the course config's HTMLExporter with
    the formgrade template, read from the file as formgrader's SubmissionHandler does."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(layout().course)).load_config()
    config.merge(Config({"HTMLExporter": {"template_name": "formgrade"}}))
    resources = {
        "base_url": "",
        "submission_id": "s1",
        "notebook_id": ASSIGNMENT,
        "assignment_id": ASSIGNMENT,
        "index": 0,
        "total": 1,
        "student": "mallory",
        "notebook_path": f"autograded/mallory/{ASSIGNMENT}/{ASSIGNMENT}.ipynb",
    }
    return HTMLExporter(config=config).from_filename(str(path), resources=resources)[0]


def _feedback_page(path: pathlib.Path) -> str:
    """The feedback page `nbgrader generate_feedback` writes for the notebook at ``path`` (the course's
    exporter and preprocessors; the scores nbgrader's GetGrades would read from the gradebook: 0)."""
    import nbgrader
    from mlbook_tools.feedback import CapOutputs, CoreExtraSummary, RedactHiddenTests
    from mlbook_tools.mathjax import FeedbackExporter
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(layout().course)).load_config()
    css = (
        pathlib.Path(nbgrader.__file__).parent / "server_extensions/formgrader/static/node_modules"
    )
    config.HTMLExporter.extra_template_paths = [
        str(css / "bootstrap" / "dist" / "css")
    ]  # as nbgrader
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader.update(score=0.0, needs_manual_grade=False)
    resources = {"nbgrader": {"notebook": ASSIGNMENT, "late_penalty": 0}, "config_dir": str(path)}
    for step in (CoreExtraSummary, CSSHTMLHeaderPreprocessor, RedactHiddenTests, CapOutputs):
        nb, resources = step(config=config).preprocess(nb, resources)
    return FeedbackExporter(config=config).from_notebook_node(nb, resources=resources)[0]


def _addresses_left(page: str) -> list:
    """What in a page's notebook could make the browser fetch or follow an address: any src but an
    inline PNG/JPEG, any href but a place in the page, srcset, a style with url(), a student's mark."""
    body = page[page.index('id="notebook-container"') :]
    bad = []
    for tag, name, value in _attributes(body):
        v = value.strip().lower()
        if (
            (name == "src" and not re.match(r"data:image/(png|jpeg);base64,", v))
            or (name in ("href", "xlink:href", "action", "formaction") and not v.startswith("#"))
            or name in ("srcset", "background", "poster", "ping", "style")
            and "url(" in v + name
            or X.ADDRESS in value
        ):
            bad.append((tag, name, value[:80]))
    return bad


def test_no_student_address_is_fetched_or_followed(tmp_path):
    """formgrader's page and the feedback page of the payload submission (every address-fetch kind in
    every place, and in a grading note): no image but an inline raster, no link to follow, MathJax
    told to allow no URL or style; each address still readable as text."""
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    note = X.fill("img-root", 1, "grading-note") + " " + X.fill("md-link-root", 1, "grading-note")
    path = tmp_path / f"{ASSIGNMENT}.ipynb"
    nbformat.write(_autograded(X.payload_notebook(release, 1), problems=[note]), path)
    for page in (_formgrader_page(path), _feedback_page(path)):
        assert _addresses_left(page) == []
        text = re.sub(r"<[^>]*>", "", page)
        assert "/logout?xss-address=md-link-root@" in text  # shown, as text
        assert "[image not shown: markdown image]" in text
        assert '<img src="/logout?xss-address=img-root@grading-note' in html.unescape(text)
    formgrader = _formgrader_page(path)
    assert (
        'Safe: {allow: {URLs: "none", classes: "none", cssIDs: "none", styles: "none"' in formgrader
    )
    policy = re.search(r"default-src 'none';[^\"]*", _feedback_page(path)).group(0)  # its <meta>
    assert "img-src data:;" in policy and "connect-src 'none'" in policy, policy


def test_clean_html_fetches_nothing_a_student_names():
    """Every odd spelling of an address (relative, root, //host, backslashes, tabs, entities, srcset,
    markdown images and links, reference links) loses its src/href; inline PNG/JPEG stay."""
    from mlbook_tools.inert import clean_html
    from nbconvert.filters.markdown import markdown2html

    for kind in X.ADDRESS_KINDS:
        out = clean_html(markdown2html(X.fill(kind, 1, "unit")))
        assert _addresses_left('id="notebook-container"' + out) == [], (kind, out)
    png, jpeg = "data:image/png;base64,iVBO", "data:image/jpeg;base64,/9j/"
    out = clean_html(f'<img src="{png}" alt="a"><img src=" {jpeg}"><a href="#top">top</a>')
    assert f'src="{png}"' in out and "/9j/" in out and '<a href="#top">top</a>' in out
    assert clean_html('<img src="data:image/svg+xml;base64,PHN2Zz4=">') == (
        '<span class="mlbook-image">[image not shown]</span>'
    )


def _timed(render, path) -> tuple[float, str]:
    t0 = time.process_time()
    page = render(path)
    return time.process_time() - t0, page


@pytest.mark.parametrize(
    "kind",
    [
        "honest",
        "code-4mb",
        *(pytest.param(k, marks=pytest.mark.full) for k in X.PAGE_SIZE_KINDS if k != "code-4mb"),
    ],
)
def test_pages_open_within_three_seconds(kind, tmp_path):
    """A submission within the grading bounds (README "Bounds") renders in <= 3 s (CPU of the
    render, the exporter formgrader and generate_feedback use, reading the file included): long
    sources folded with their size shown, rich rendering within the page's budget
    (templates/formgrade/mlbook_fold.html.j2). Before: one 4 MB code cell took formgrader 48 s."""
    from mlbook_tools.limits import DEFAULT

    if kind == "honest":
        student = json.loads(
            (layout().root / "solutions" / "notebooks" / f"{ASSIGNMENT}.ipynb").read_text()
        )
    else:
        release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
        student = X.size_notebook(release, kind)
    from mlbook_tools.driver import check_bounds

    check_bounds(json.dumps(student), DEFAULT)  # inside every bound: graded, so shown
    path = tmp_path / f"{ASSIGNMENT}.ipynb"
    nbformat.write(_autograded(student), path)
    for render in (_formgrader_page, _feedback_page):
        seconds, page = _timed(render, path)
        print(f"{kind} {render.__name__}: {seconds:.2f} s CPU, {len(page) / 1e6:.1f} MB")
        assert seconds <= 3.0, (kind, render.__name__, seconds)
        if kind.endswith("4mb"):
            assert re.search(r"\d\.\d MB of (source|text) not shown; open the notebook file", page)
        if kind == "honest":  # nothing folded, every formula there to typeset
            assert "mlbook-folded" not in page.split("</style>")[-1], kind
            assert "mlbook-plain-text" not in page.split("</style>")[-1], kind


# --------------------------------------------------------------------------- in the browser

SCAN = r"""
const bad = [];
for (const e of document.querySelectorAll('*')) {
  if (/^(IFRAME|OBJECT|EMBED|BASE|FORM)$/.test(e.tagName) || (e.tagName === 'META' && e.httpEquiv)) {
    if (!(e.tagName === 'META' && /content-security-policy/i.test(e.httpEquiv))) bad.push(e.tagName);
  }
  for (const a of e.attributes) {
    if (/^on/i.test(a.name) && /__xss|127\.0\.0\.1/.test(a.value)) bad.push(e.tagName + ' ' + a.name);
    if (/^\s*(javascript|vbscript|data:text)/i.test(a.value)) bad.push(e.tagName + ' ' + a.name + '=' + a.value.slice(0, 60));
  }
}
// what the student's content became (MathJax's output included): no address to fetch or follow
const nb = document.getElementById('notebook-container');
for (const e of (nb ? nb.querySelectorAll('*') : [])) {
  for (const a of e.attributes) {
    if (/^(src|srcset|href|xlink:href|style|action|formaction)$/i.test(a.name) && /xss-address|url\(/i.test(a.value)) bad.push('address ' + e.tagName + ' ' + a.name + '=' + a.value.slice(0, 80));
    if (/^(href|xlink:href)$/i.test(a.name) && !a.value.startsWith('#')) bad.push('link ' + e.tagName + ' ' + a.value.slice(0, 80));
    if (a.name === 'src' && !/^data:image\/(png|jpeg);base64,/.test(a.value)) bad.push('image ' + a.value.slice(0, 80));
  }
}
return bad;
"""


def _logged_in(driver) -> bool:
    """The Jupyter server's login cookie is still there (its /logout clears it)."""
    return any(c["name"].startswith("username-") for c in driver.get_cookies())


def _requested(driver) -> list[str]:
    """Every URL the browser asked for since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


PROBE = """
window.__violations = 0;
document.addEventListener('securitypolicyviolation', () => { window.__violations += 1; });
document.body.insertAdjacentHTML('beforeend', '<img src="x-probe" onerror="window.__probe = 1">');
"""


class Canary(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        Canary.hits.append(self.path)
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def canary():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canary)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def _sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def course(tmp_path_factory, canary):
    """A course with the payload submission and the payload student ids, graded by `mlbook grade-class`."""
    course = tmp_path_factory.mktemp("xss") / "course"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert (
        subprocess.run(
            [str(BIN / "mlbook"), "new-course", str(course)], capture_output=True
        ).returncode
        == 0
    )
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    students = {"mallory": X.payload_notebook(release, canary)}
    students.update({X.student_id(k, canary): release for k in X.ID_KINDS})
    for student, nb in students.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(nb))  # as handed in: not validated
        (folder / "timestamp.txt").write_text("2026-11-30 12:00:00.000000 UTC")
    run = subprocess.run(
        [str(BIN / "mlbook"), "grade-class", "--course", "."],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # grade-class refuses an id outside the safe set (mlbook_tools/exchange.py); nbgrader autograde
    # (formgrader's Autograde button) still grades a folder it is pointed at: those pages are tried too
    for student in students:
        if student != "mallory":
            assert f"NOT GRADED: student id {student!r} is not allowed" in run.stdout, run.stdout
            auto = subprocess.run(
                [str(BIN / "nbgrader"), "autograde", ASSIGNMENT, f"--student={student}", "--force"],
                cwd=course,
                env=env,
                capture_output=True,
                text=True,
            )
            assert auto.returncode == 0, auto.stdout[-2000:] + auto.stderr[-2000:]
    from nbgrader.api import Gradebook

    with Gradebook(
        f"sqlite:///{course / 'gradebook.db'}"
    ) as gb:  # names a spreadsheet would evaluate
        gb.add_student("=1+2", first_name="+SUM(1)", last_name="-1+1", email="@cmd")
        ids = {s: gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, s).id for s in students}
    return course, env, ids


def _quiet(driver, wait) -> list[str]:
    """Whatever a canary did on this page: its flag, and the page's own scan for active content.
    (formgrader's grade boxes get their placeholder from its scripts: that is how the test knows they ran.)"""
    try:  # an event handler fires a moment after load (onerror, ontoggle, autofocus): give it that moment
        wait.until(lambda d: d.execute_script("return !!window.__xss"))
    except Exception:  # noqa: BLE001 - the timeout is the good outcome
        pass
    flag = driver.execute_script("return window.__xss || null")
    return ([f"flag: {flag}"] if flag else []) + driver.execute_script(SCAN)


@pytest.mark.browser
def test_instructor_pages_run_no_student_script(course, canary, tmp_path):
    import urllib.parse

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    if not have_chromium():
        pytest.skip("chromium / chromium-driver not installed")
    course, env, ids = course
    gradebook = course / "gradebook.db"
    before = _sha(gradebook)
    driver = chrome(tmp_path / "profile", performance_log=True)  # every request, by URL
    found: dict[str, list[str]] = {}
    requested: list[str] = []
    t0 = time.monotonic()
    try:
        wait, settle = (
            WebDriverWait(driver, 90, poll_frequency=0.3),
            WebDriverWait(driver, 1.0, poll_frequency=0.2),
        )
        with Server("server", course, tmp_path / "server.log") as server:
            # The course's policy is on formgrader's pages (a second wall behind the sanitiser).
            with urllib.request.urlopen(
                server.url(f"/formgrader/submissions/{ids['mallory']}/")
            ) as r:
                policies = r.headers.get_all("Content-Security-Policy")
            assert any(
                "script-src 'self'" in p
                and "'unsafe-inline'" not in p.split("script-src")[1].split(";")[0]
                for p in policies
            ), policies

            def rows(n):
                return lambda d: len(d.find_elements(By.CSS_SELECTOR, "tbody#main-table tr")) >= n

            pages = [
                ("/formgrader/manage_students", rows(len(ids) + 1)),
                (f"/formgrader/manage_submissions/{ASSIGNMENT}", rows(len(ids))),
                (f"/formgrader/gradebook/{ASSIGNMENT}/{ASSIGNMENT}", rows(len(ids))),
            ]
            for student in ids:
                q = urllib.parse.quote(student, safe="")
                pages += [
                    (f"/formgrader/manage_students/{q}", rows(1)),
                    (f"/formgrader/manage_students/{q}/{ASSIGNMENT}", rows(1)),
                ]
            for (
                path,
                ready,
            ) in pages:  # formgrader's own scripts run under the policy: its tables fill
                driver.get(server.url(path))
                wait.until(ready)
                found[path] = _quiet(driver, settle)
                print(f"{time.monotonic() - t0:6.1f} s  {path}")
            assert _logged_in(driver)  # the token logged the instructor in: a cookie
            for student, nb_id in sorted(
                ids.items(), key=lambda kv: kv[0] == "mallory"
            ):  # the payloads last
                driver.get(server.url(f"/formgrader/submissions/{nb_id}/"))
                math = "MathJax.Hub.queue.pending === 0" if student == "mallory" else "true"
                wait.until(
                    lambda d, math=math: d.execute_script(
                        f"return !!(window.MathJax && MathJax.isReady && {math})"
                        " && [...document.querySelectorAll('input.extra-credit')].some(e => e.hasAttribute('placeholder'))"
                    )
                )
                found[f"submission {student}"] = _quiet(driver, settle)
                print(f"{time.monotonic() - t0:6.1f} s  submission {student}")
            typeset = driver.execute_script(
                "return document.querySelectorAll('.MathJax, .MathJax_Display').length"
            )
            assert typeset > 50, f"formgrader typeset only {typeset} formulas"
            # No request for an address a student chose (a relative /logout image, //host, MathJax's
            # \\require ...) left the browser, and the instructor is still logged in (a cookie login:
            # a fetch without the token; /logout would have cleared it).
            requested += _requested(driver)
            assert _logged_in(driver), [u for u in requested if "logout" in u or X.ADDRESS in u]
            # The policy alone stops an inline handler that got into the page (after the sanitiser).
            driver.execute_script(PROBE)
            WebDriverWait(driver, 10, poll_frequency=0.2).until(
                lambda d: d.execute_script("return window.__violations > 0")
            )
            assert driver.execute_script("return window.__probe || null") is None
        assert _sha(gradebook) == before, "the gradebook changed while the instructor browsed"
        runs = [
            subprocess.Popen(
                [str(BIN / "nbgrader"), *args],
                cwd=course,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for args in (
                ["generate_feedback", ASSIGNMENT, "--student", "mallory", "--force"],
                ["export", "--to", "grades.csv"],
                ["export", "--exporter", "mlbook_tools.export.WideCsvExport", "--to", "wide.csv"],
            )
        ]
        for done in runs:  # they only read the gradebook: side by side
            out = done.communicate(timeout=300)[0]
            assert done.returncode == 0, out[-2000:]
        _offline(driver)
        # The payload submission's feedback page (a student id does not appear in a feedback page).
        driver.get((course / "feedback" / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.html").as_uri())
        wait.until(lambda d: d.execute_script("return document.readyState === 'complete'"))
        found["feedback mallory"] = _quiet(driver, settle)
        requested += _requested(driver)
        print(f"{time.monotonic() - t0:6.1f} s  feedback")
        assert "My answer, with math" in driver.find_element(By.TAG_NAME, "body").text
        typeset = driver.execute_script("return document.querySelectorAll('math').length")
        assert typeset > 50, f"the feedback page typeset only {typeset} formulas (MathML)"
    finally:
        driver.quit()
    failures = {k: v for k, v in found.items() if v}
    assert failures == {}, failures
    assert Canary.hits == [], Canary.hits
    assert len(requested) > 20, requested  # the log works: formgrader's own scripts and styles
    assert [u for u in requested if X.ADDRESS in u or "/logout" in u] == []
    assert _sha(gradebook) == before
    # A manual score written behind grade-class's back is listed by its next run (nothing to regrade).
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook}") as gb:
        gb.find_grade("ex1_larger_beta", ASSIGNMENT, ASSIGNMENT, "mallory").manual_score = 3.0
        gb.db.commit()
    run = subprocess.run(
        [str(BIN / "mlbook"), "grade-class", "--course", "."],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "manual score changed: mallory / ex1_larger_beta: none -> 3" in run.stdout, run.stdout[
        -2000:
    ]
    for name in ("grades.csv", "wide.csv"):
        cells = [c for row in csv.reader((course / name).open()) for c in row]
        assert "'=1+2" in cells and "'@cmd" in cells or name == "grades.csv", name
        assert not [
            c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and not c[1:2].isdigit())
        ], name


def test_policy_names_only_the_servers_own_inline_scripts():
    """csp.py: per page, an inline script runs only if it is one of the server's templates' or assigns
    plain strings; a student's file is served sandboxed; JupyterLab (not formgrader) gets 'unsafe-eval'."""
    from mlbook_tools import csp
    from tornado.httputil import HTTPHeaders

    csp.CspTransform.settings, csp.CspTransform.trusted = {"base_url": "/"}, csp._template_scripts()
    loader = (csp.TEMPLATES / "formgrade" / "mathjax_loader.js").read_text()[:-1]
    page = (
        '<script>var assignment_id = "rlhf_ppo";</script><script>alert(1)</script>'
        f'<script>var a = "x";alert(1);"";</script><script type="text/javascript">{loader}</script>'
        '<script type="application/json">{"a": 1}</script>'
    ).encode()

    def header(path):
        request = type("Request", (), {"path": path})
        headers = HTTPHeaders({"Content-Type": "text/html; charset=UTF-8"})
        csp.CspTransform(request).transform_first_chunk(200, headers, page, True)
        return headers.get_list("Content-Security-Policy")[-1]

    policy = header("/formgrader/submissions/abc/")
    named = {csp.csp_hash('var assignment_id = "rlhf_ppo";'), csp.csp_hash(loader)}
    assert named <= set(policy.split()) and policy.count("'sha256-") == len(named) + len(
        csp.HANDLERS
    )
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    assert "'unsafe-eval'" not in policy and "'unsafe-eval'" in header("/lab/tree/x.ipynb")
    request = type("Request", (), {"path": "/formgrader/submissions/abc/"})
    headers = HTTPHeaders(
        {"Content-Type": "text/html", "Etag": '"abc"'}
    )  # no 304: it would drop the hashes
    csp.CspTransform(request).transform_first_chunk(200, headers, page, True)
    assert "Etag" not in headers and headers["Cache-Control"] == "no-store"
    for path in (
        "/files/submitted/x/a.html",
        "/nbconvert/html/a.ipynb",
        "/formgrader/submissions/abc/a.svg",
    ):
        assert header(path).endswith("sandbox") and "script-src" not in header(path), path


@pytest.mark.parametrize(
    "tex",
    [
        r"\text{&lt;img/src=x/onerror=alert(1)&gt;}",
        r"\text{&lt;img src=x onerror=alert(1)&gt;}",
        r"\href{javascript:alert(1)}{x}",
        r"\style{background:url(//127.0.0.1/x)}{y}",
        r"\class{a}{b}",
    ],
)
def test_feedback_math_never_becomes_markup(tex):
    """The feedback page's TeX -> MathML step runs after the sanitiser: a student's formula that would
    come out as a live tag or attribute stays TeX text, while ordinary math is still typeset."""
    from mlbook_tools.mathml import typeset

    page = typeset(f"<p>${tex}$ and $\\frac{{a}}{{b}}^2$</p>")
    assert f"${tex}$" in page  # left as the (escaped) text it was
    assert (
        page.count("<math") == 1 and "<img" not in page and "javascript:" not in page.split("$")[0]
    )
    assert not re.search(r"<m\w+[^>]*\b(href|style|class|on\w+)=", page), page
