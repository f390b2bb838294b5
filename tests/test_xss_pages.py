"""Student content is inert in what the instructor opens, checked without a browser (unit; the
browser test is test_xss.py): the autograded notebook keeps no active content and only the first
outputs, grade-class reports manual score changes, the HTML cleaner keeps markdown readable and
fetches nothing a student names, formgrader's and the feedback page's renders of a submission
within the bounds (test_xss.py times them), the Content-Security-Policy names only the server's own inline
scripts, and feedback math never becomes markup. Payloads: tests/xss_payloads.py.
"""

import copy
import html
import json
import re

import gradebook_support
import nbformat
import pytest
import xss_payloads as X
from mlbook_tools.config import layout
from mlbook_tools.result import GradingResult
from pages_support import autograded as _autograded
from pages_support import feedback_page as _feedback_page
from pages_support import formgrader_page as _formgrader_page

pytestmark = pytest.mark.unit

ASSIGNMENT = "rlhf_ppo"


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
    from mlbook_tools.plugins import InertStudentCells

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
    from mlbook_tools.limits import DEFAULT
    from mlbook_tools.plugins import InertStudentCells

    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    out = nbformat.v4.new_output("stream", name="stdout", text="x\n")
    release.cells[1:1] = [nbformat.v4.new_code_cell("1", outputs=[out] * 20) for _ in range(30)]
    button, _ = InertStudentCells().preprocess(copy.deepcopy(release), {})
    for nb in (_autograded(json.loads(nbformat.writes(release))), button):
        kept = _student_outputs(nb)
        assert len(kept) == DEFAULT.shown_notebook_outputs + 1 == 201
        assert "[... 400 more outputs not shown" in kept[-1]["text"]


def _student_outputs(nb) -> list:
    return [
        o
        for c in nb.cells
        if not c.metadata.get("nbgrader", {}).get("grade")
        for o in c.get("outputs", [])
    ]


def test_both_autograded_notebooks_follow_the_course_limits_on_what_is_shown():
    """One rule (inert.sanitize_cell, fold_outputs) and one set of caps: a course's
    ``c.SandboxedExecute.limits`` reach the Autograde button's notebook as grade-class's."""
    from mlbook_tools import driver, feedback
    from mlbook_tools.limits import DEFAULT
    from mlbook_tools.plugins import InertStudentCells
    from traitlets.config import Config

    caps = {"shown_chars": 50, "shown_cell_outputs": 3, "shown_notebook_outputs": 7}
    limits = DEFAULT.replace(**caps)
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    out = nbformat.v4.new_output("stream", name="stdout", text="y" * 80)
    release.cells[1:1] = [nbformat.v4.new_code_cell("1", outputs=[out] * 5) for _ in range(4)]
    config = Config({"SandboxedExecute": {"limits": caps}})
    button, _ = InertStudentCells(config=config).preprocess(copy.deepcopy(release), {})
    source_nb = nbformat.read(
        layout().course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    plan = driver.make_plan(source_nb, nbformat.writes(release))
    graded = feedback.autograded_notebook(source_nb, plan, GradingResult(problems=[]), limits)
    for nb in (graded, button):
        kept = _student_outputs(nb)
        assert len(kept) == 7 + 1 and "[... 5 more outputs not shown" in kept[-1]["text"]
        assert kept[0]["text"] == "y" * 50 + "\n... [30 more characters not shown]"
        assert max(len(c.get("outputs", [])) for c in nb.cells) == 3  # per cell


def test_manual_score_changes_are_reported(tmp_path, monkeypatch):
    """grade-class's report (manual_audit): who, which cell, old -> new; nothing when nothing changed."""
    import io

    gradebook_support.in_process(monkeypatch)  # no alembic subprocess

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


def test_the_pages_budget_is_the_course_limits(tmp_path):
    """What a page renders is bounded by the course's limits (``page_*``, ``c.SandboxedExecute.limits``
    in its config), not by numbers of the template's own: a course that shows 3 cells besides answers
    and tests gets that note on both pages; the checkout's course (300) shows the chapter's 119."""
    config = (layout().course / "nbgrader_config.py").read_text()
    assert config.count("c.SandboxedExecute.limits = {}") == 1
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(
        config.replace(
            "c.SandboxedExecute.limits = {}", 'c.SandboxedExecute.limits = {"page_cells": 3}'
        )
    )
    release = nbformat.read(layout().release / f"{ASSIGNMENT}.ipynb", as_version=4)
    path = tmp_path / f"{ASSIGNMENT}.ipynb"
    nbformat.write(_autograded(release), path)
    note = "from here on only answer and test cells are shown (the page shows {} others"
    for render in (_formgrader_page, _feedback_page):
        assert note.format(3) in render(path, course), render.__name__
        assert "from here on only answer and test cells" not in render(path), render.__name__


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
