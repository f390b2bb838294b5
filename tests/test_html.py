"""The reading form of the chapter: the solved notebook rendered to HTML as `make html` does.

Rendered without executing (a few seconds): every markdown table must come out as a table, the
grader's hidden-test code must not appear, and every figure the chapter draws goes through
``mlbook.plotting.show`` with alternative text.
"""

import pathlib
import re

import nbformat
import pytest
from bs4 import BeautifulSoup
from html_support import exporter, html_target, makefile_html_option
from mlbook_tools.build import HIDDEN_TESTS_TAG
from mlbook_tools.config import layout
from ppo_checks import CHECKS

pytestmark = pytest.mark.unit

ROOT = layout().root
SOLVED = sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb"))
TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")


def render(path: pathlib.Path) -> BeautifulSoup:
    html, _ = exporter().from_notebook_node(nbformat.read(path, as_version=4))
    return BeautifulSoup(html, "html.parser")


@pytest.fixture(scope="module", params=SOLVED, ids=lambda p: p.stem)
def page(request):
    return request.param, render(request.param)


def test_makefile_removes_the_tag_the_build_sets():
    assert eval(makefile_html_option()) == {HIDDEN_TESTS_TAG, "student-instructions"}


def test_every_markdown_table_renders(page):
    _, soup = page
    for cell in soup.select(".jp-MarkdownCell"):
        raw = [line for line in cell.get_text("\n").splitlines() if TABLE_ROW.match(line)]
        assert not raw, (
            f"a markdown table did not render (escape | inside math or code spans): {raw[0][:120]}"
        )


def _markdown_tables(path: pathlib.Path) -> int:
    """Tables written in the notebook's markdown: lines like |---|---| (one per table)."""
    nb = nbformat.read(path, as_version=4)
    sep = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$")
    return sum(
        1
        for c in nb.cells
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if sep.match(line)
    )


def test_tables_are_there(page):
    """Every markdown table of each notebook renders as an HTML table (appendix included)."""
    path, soup = page
    written = _markdown_tables(path)
    rendered = len(soup.select(".jp-MarkdownCell table"))
    assert rendered == written, (path.stem, rendered, written)
    if path.stem == "rlhf_ppo":
        assert written >= 4  # overview, failure modes, methods, production


def test_table_of_contents_links_every_heading(page):
    path, soup = page
    nav = soup.select_one("nav.mlbook-toc")
    assert nav is not None, "the reading form has no table of contents"
    links = nav.select("a[href^='#']")
    headings = soup.select(".jp-MarkdownCell h2, .jp-MarkdownCell h3")
    ids = {h.get("id") for h in headings}
    assert len(links) == len(headings) > 3, (len(links), len(headings))
    missing = [a["href"] for a in links if a["href"][1:] not in ids]
    assert not missing, f"table-of-contents links that reach no heading: {missing[:3]}"
    assert "How to work through it" not in nav.get_text()


def test_download_link():
    nb = nbformat.read(SOLVED[-1], as_version=4)
    html, _ = exporter().from_notebook_node(nb, resources={"metadata": {"name": "rlhf_ppo"}})
    soup = BeautifulSoup(html, "html.parser")
    link = soup.select_one("p.mlbook-download a[download]")
    assert link is not None and link["href"] == "executed/rlhf_ppo.ipynb"
    assert "executed" in html_target() and "--output-dir $(OUT)/executed" in html_target()


def test_long_helpers_are_collapsed(page):
    """Long included helpers (plot_*, summarise, ...) are folded into <details>; short cells are not."""
    path, soup = page
    folded = soup.select("details.mlbook-helper")
    for d in folded:
        code = d.get_text()
        assert "def " in code or "class " in code
    if path.stem == "rlhf_ppo":
        text = "\n".join(d.get_text() for d in folded)
        for name in (
            "def plot_overoptimisation",
            "def summarise",
            "def plot_arms",
            "def train_ppo",
        ):
            assert name in text, f"{name} is not collapsed"
        first_code = soup.select(".jp-CodeCell")[0]
        assert first_code.find_parent("details") is None and not first_code.select("details")


def test_no_printed_block_longer_than_eight_lines(page):
    """The reading form shows figures and tables, not walls of printed numbers."""
    path, _ = page
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                lines = out["text"].rstrip("\n").count("\n") + 1
                assert lines <= 8, (path.stem, cell.source.splitlines()[:2], lines)


def test_no_hidden_test_code_in_the_reading_form(page):
    path, soup = page
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if HIDDEN_TESTS_TAG in c.metadata.get("tags", [])]
    if path.stem == "rlhf_ppo":
        assert len(tagged) == len(CHECKS)  # one hidden-test cell per declared check
    code = "\n".join(el.get_text() for el in soup.select(".jp-InputArea"))
    for leak in ("def check_", "_brute_gae", "check_train_ppo(", "_ex4_expected", "_lp_pol"):
        assert leak not in code, f"hidden-test code {leak!r} shows in the rendered chapter"


def test_figures_are_shown_with_alt_text():
    """Every figure cell of the chapter sources goes through show(fig, alt=...), never a bare plt.show()."""
    for frag in sorted((ROOT / "solutions" / "chapter").glob("*/[0-9]*.py")):
        text = frag.read_text()
        assert "plt.show()" not in text, (
            f"{frag.name}: use mlbook.plotting.show(fig, alt=...) so the image has alt text"
        )
        assert not re.search(r"display\(\w*fig\w*\)", text), (
            f"{frag.name}: display a figure with show(fig, alt=...)"
        )


def test_show_attaches_alt_text(monkeypatch):
    import IPython.display
    import matplotlib.pyplot as plt

    from mlbook import plotting

    shown = []
    monkeypatch.setattr(
        IPython.display, "display", lambda obj, metadata=None: shown.append(metadata)
    )
    fig = plt.figure()
    plotting.show(fig, alt="An empty test figure with no axes.")
    assert shown == [{"image/png": {"alt": "An empty test figure with no axes."}}]
    assert not plt.fignum_exists(fig.number)
    with pytest.raises(ValueError, match="alt"):
        plotting.show(plt.figure(), alt="")


def test_rendered_figures_carry_their_alt_text(caplog):
    """A figure displayed by show() keeps its alt text through the Makefile's template, with no nbconvert warning."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    alt = "A rising line, the only figure of this test."
    output = nbformat.v4.new_output(
        "display_data",
        data={"image/png": base64.b64encode(buf.getvalue()).decode()},
        metadata={"image/png": {"alt": alt}},
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("show(fig, alt=...)", outputs=[output])]
    )
    html, _ = exporter().from_notebook_node(nb)
    imgs = BeautifulSoup(html, "html.parser").select(".jp-OutputArea-output img")
    assert [img.get("alt") for img in imgs] == [alt]
    assert "Alternative text is missing" not in caplog.text


def test_the_page_title_is_the_chapter_title(page):
    path, soup = page
    nb = nbformat.read(path, as_version=4)
    heading = next(
        line[2:].strip()
        for c in nb.cells
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("# ")
    )
    assert soup.title.get_text(strip=True) == heading != path.stem


# What only the grader needs: a reader of the chapter never sees it
GRADER_PLUMBING = (
    "Demonstration only",
    "autograder skips",
    "AUTOGRADING else",
    "NBGRADER_EXECUTION",
)


def test_no_grader_plumbing_in_the_reading_form(page):
    path, soup = page
    code = "\n".join(pre.get_text() for pre in soup.select(".jp-InputArea pre, .jp-InputArea code"))
    shown = [p for p in GRADER_PLUMBING if p in code]
    assert not shown, f"{path.name}: the reading form shows {shown}"
    nb = nbformat.read(path, as_version=4)
    demos = [c for c in nb.cells if "demo" in c.metadata.get("tags", [])]
    assert path.stem != "rlhf_ppo" or demos, "the chapter's demonstration cells carry the demo tag"


def test_tables_are_not_assembled_from_markdown_text_in_the_training_cells():
    """The chapter's training section shows what its tables hold (``show_table``), not the Markdown
    text that makes them."""
    text = (ROOT / "solutions/chapter/rlhf_ppo/30_implementation.py").read_text()
    assert '"|---' not in text and "show_table(" in text
