"""Student content is inert wherever a person looks at it: formgrader, the feedback page, exports.

A submission is text the student wrote: markdown (their answers and any cell they add), the outputs
their code stored, attachments, cell and notebook metadata, even the folder name that becomes their
student id. Rendered as it is in the instructor's formgrader page, a stored ``<img onerror>`` runs
with the instructor's session and can rewrite grades through formgrader's REST API. Three walls:

* ``sanitize_cell``: the one rule for a student's cell, which both autograded notebooks follow
  (``mlbook grade-class``'s, ``feedback.autograded_notebook``, and the Autograde button's,
  ``InertStudentCells``): of a student's outputs only ``text/plain`` (or stream text) and PNG/JPEG
  images, no output metadata, every text ``printable`` and capped; markdown attachments only
  PNG/JPEG; no cell metadata on cells the student added. Then ``fold_outputs`` caps the notebook's
  outputs in all, and ``inert_metadata`` keeps of the notebook's metadata only the kernel's name
  and language. Every cap is a field of ``GradingLimits`` (``shown_*``, ``limits.py``).
* ``clean_html``: every piece of HTML the course's pages render from a notebook (markdown after
  rendering, any HTML output that still arrives) goes through the nh3 (ammonia) allow-list:
  readable markdown (headings, paragraphs, lists, tables, code) and the text of the math (MathJax
  typesets it afterwards, its Safe extension set to allow no URL, style, class or id); no script,
  no event handler, no ``style``/``class``/``id``. No address a student chose is fetched or
  followed: an image stays only as an inline raster (``data:image/png|jpeg;base64``), any other
  image becomes its alternative text (``[image not shown: alt]``); a link becomes its text with the
  address beside it as code (``text (<code>/logout</code>)``), nothing to click; only a link to a
  place in the same page (``#heading``) stays a link.

Every text of a student's that a person reads passes ``printable`` (``mlbook grade``'s terminal
lines too: this module loads neither nbconvert nor nbgrader), on pages ``capped``; a name they
chose, in the exchange's log lines, ``escaped``. nbgrader's Autograde button reaches
``inert_notebook`` through ``plugins.InertStudentCells``.

The Content-Security-Policy of the course's Jupyter server (``csp.py``) is the wall behind these.
"""

from __future__ import annotations

import copy
import re

from mlbook_tools.cells import grade_id, is_graded
from mlbook_tools.limits import DEFAULT, GradingLimits, limits_from_config

RASTER = ("image/png", "image/jpeg")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` without control characters but newline and tab: a student's error message cannot move
    a terminal's cursor, hide lines or recolour a report (ANSI escapes)."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", str(text))


_TAGS = {
    "a",
    "abbr",
    "b",
    "blockquote",
    "br",
    "caption",
    "cite",
    "code",
    "dd",
    "del",
    "details",
    "div",
    "dl",
    "dt",
    "em",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "i",
    "img",
    "ins",
    "kbd",
    "li",
    "mark",
    "ol",
    "p",
    "pre",
    "q",
    "s",
    "samp",
    "small",
    "span",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "tbody",
    "td",
    "tfoot",
    "th",
    "thead",
    "tr",
    "u",
    "ul",
    "var",
}
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
}
_RASTER_URL = re.compile(r"data:image/(png|jpeg);base64,[a-z0-9+/=\s]*\Z")
_NUMBER = re.compile(r"\d{1,4}%?\Z")
_NAME = re.compile(r"[\w.\-]{1,100}")
_LABEL = re.compile(r"[\w .+\-()]{1,100}")


def _attribute(tag: str, attr: str, value: str) -> str | None:
    """nh3's per-attribute check: an image's src only an inline raster; sizes only numbers."""
    if attr in ("width", "height"):
        return value if _NUMBER.match(value.strip()) else None
    if tag == "img" and attr == "src":  # no request for anything: not relative, not another host
        return value.strip() if _RASTER_URL.match(value.strip().lower()) else None
    return None if value.strip().lower().startswith("data:") else value


# nh3 writes every attribute as name="value" with &, <, > and " escaped: these patterns read its output.
_ATTRS = r'((?:\s+[\w:-]+="[^"]*")*)'
_LINK = re.compile(r"<a" + _ATTRS + r"\s*>(.*?)</a>", re.S)
_IMG = re.compile(r"<img" + _ATTRS + r"\s*/?>")
_ATTR = re.compile(r'([\w:-]+)="([^"]*)"')
_TAG = re.compile(r"<[A-Za-z][^>]*>")
_ADDRESS = re.compile(r'\s(?:href|src)="(?!#|data:image/(?:png|jpeg);base64,)[^"]*"', re.I)


def _as_text(m: re.Match) -> str:
    """A link as its text and its address (as code): the address visible, nothing to follow."""
    import html

    href, text = dict(_ATTR.findall(m.group(1))).get("href"), m.group(2)
    if href is None:
        return text
    if href.startswith("#"):  # a place in this page: no request, no navigation away
        return f'<a href="{href}">{text}</a>'
    address = f'<code class="mlbook-address">{href}</code>'
    same = html.unescape(re.sub(r"<[^>]*>", "", text)).strip() == html.unescape(href).strip()
    return address if same else f"{text} ({address})"


def _alt_text(m: re.Match) -> str:
    """An image without an inline raster (its src dropped) as its alternative text."""
    attrs = dict(_ATTR.findall(m.group(1)))
    if "src" in attrs:  # kept by _attribute: an inline PNG/JPEG
        return m.group(0)
    alt = attrs.get("alt", "").strip()
    return f'<span class="mlbook-image">[image not shown{": " + alt if alt else ""}]</span>'


def clean_html(html) -> str:
    """HTML with only the allow-listed tags and attributes, images only inline rasters and links as
    text with their address (a Jinja filter: ``| clean_html``)."""
    import nh3

    text = html.decode() if isinstance(html, bytes) else str(html)
    text = nh3.clean(
        text,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        attribute_filter=_attribute,
        url_schemes={"http", "https", "mailto", "data"},
        strip_comments=True,
        link_rel=None,
    )
    text = _IMG.sub(_alt_text, _LINK.sub(_as_text, text))
    # what the two passes above left of an address (none is expected): gone from every tag
    return _TAG.sub(lambda m: _ADDRESS.sub("", m.group(0)), text)


def capped(value, limits: GradingLimits = DEFAULT) -> str:
    """A text (or a notebook's list of lines) as a person reads it: ``printable``, its first
    ``limits.shown_chars`` characters and how many more there are."""
    text = printable("".join(value) if isinstance(value, list) else str(value))
    cap = limits.shown_chars
    return (
        text
        if len(text) <= cap
        else text[:cap] + f"\n... [{len(text) - cap} more characters not shown]"
    )


def escaped(text: str) -> str:
    """A name the student chose (a submission's folder or file) as the exchange's log lines show it:
    every character that is not printable written as its Python escape, so the name stays exact."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _image(value, limits: GradingLimits) -> str | None:
    text = "".join(value) if isinstance(value, list) else value
    ok = (
        isinstance(text, str)
        and len(text) <= limits.shown_image_chars
        and re.fullmatch(r"[A-Za-z0-9+/=\s]*", text)
    )
    return text if ok else None


def inert_outputs(outputs, limits: GradingLimits = DEFAULT) -> list:
    """A student's stored outputs, reduced: stream text, text/plain, PNG/JPEG; capped; no metadata."""
    import nbformat

    def text(value) -> str:
        return capped(value, limits)

    kept = []
    for out in outputs[: limits.shown_cell_outputs] if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream":
            name = out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout"
            kept.append(nbformat.v4.new_output("stream", name=name, text=text(out.get("text", ""))))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data") if isinstance(out.get("data"), dict) else {}
            clean = {k: v for k in RASTER if (v := _image(data.get(k), limits)) is not None}
            if "text/plain" in data or not clean:
                clean["text/plain"] = text(data.get("text/plain", "[output not shown]"))
            kept.append(nbformat.v4.new_output("display_data", data=clean))
        elif kind == "error":
            line = text(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}")
            kept.append(
                nbformat.v4.new_output(
                    "error",
                    ename=text(out.get("ename", "Error"))[:200],
                    evalue=text(out.get("evalue", "")),
                    traceback=[line],
                )
            )
    return kept


_BLANK = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


def inert_attachments(attachments, source: str = "", limits: GradingLimits = DEFAULT) -> dict:
    """A markdown cell's attachments, only PNG/JPEG images; every ``attachment:NAME`` the ``source``
    refers to that is gone (or never was) becomes a blank PNG: nbconvert refuses to render a page
    whose markdown names a missing attachment, and one student's page must not fail."""
    kept = {}
    for name, bundle in (attachments or {}).items() if isinstance(attachments, dict) else []:
        if isinstance(name, str) and isinstance(bundle, dict):
            images = {k: v for k in RASTER if (v := _image(bundle.get(k), limits)) is not None}
            if images:
                kept[name] = images
    for name in re.findall(r"attachment:([^\s)\"'<>]+)", source if isinstance(source, str) else ""):
        kept.setdefault(name, {"image/png": _BLANK})
    return kept


def fold_outputs(cells, limits: GradingLimits = DEFAULT) -> None:
    """In place: the notebook's first ``limits.shown_notebook_outputs`` stored outputs kept (test cells' verdicts
    apart), the rest replaced by one line saying how many are left out. Every page that shows the
    notebook (formgrader, feedback) converts and validates each output several times over: 2000
    cells of 20 outputs each, within the grading bounds, took formgrader ~10 s of CPU to open."""
    import nbformat

    left, dropped, first = limits.shown_notebook_outputs, 0, None
    for cell in cells:
        outputs = cell.get("outputs") if cell.get("cell_type") == "code" else None
        if not outputs or is_graded(cell):
            continue
        if len(outputs) > left:
            first = cell if first is None else first
            dropped += len(outputs) - left
            cell["outputs"] = outputs[:left]
        left -= len(cell["outputs"])
    if first is not None:
        first["outputs"].append(
            nbformat.v4.new_output(
                "stream",
                name="stdout",
                text=f"[... {dropped} more outputs not shown: pages show the notebook's first "
                f"{limits.shown_notebook_outputs}; open the submitted notebook to read them]\n",
            )
        )


def sanitize_cell(cell, added: bool, limits: GradingLimits = DEFAULT) -> None:
    """Make one cell of a student's notebook inert in place; ``added``: not a cell of the source.
    The one rule for a student's cell: both autograded notebooks (``feedback.autograded_notebook``,
    ``InertStudentCells``) pass every student cell through it."""
    meta = (
        cell.get("metadata", {}).get("nbgrader") if isinstance(cell.get("metadata"), dict) else None
    )
    cell["metadata"] = {"nbgrader": meta} if isinstance(meta, dict) and not added else {}
    if cell.get("cell_type") == "code":
        cell["outputs"] = inert_outputs(cell.get("outputs", []), limits)
    elif cell.get("cell_type") == "markdown":
        source = cell.get("source", "")
        cell["attachments"] = inert_attachments(
            cell.get("attachments"), "".join(source) if isinstance(source, list) else source, limits
        )
        if not cell["attachments"]:
            del cell["attachments"]


def sanitized(cell, added: bool, limits: GradingLimits = DEFAULT):
    """``sanitize_cell`` on a copy (a shallow one: it replaces metadata, outputs and attachments)."""
    cell = copy.copy(cell)
    sanitize_cell(cell, added, limits)
    return cell


def inert_metadata(metadata) -> dict:
    """Notebook metadata kept: the kernel's name and language (plain labels only)."""
    keep = {}
    for key, fields in (
        ("kernelspec", ("name", "display_name", "language")),
        ("language_info", ("name",)),
    ):
        part = metadata.get(key) if isinstance(metadata, dict) else None
        if isinstance(part, dict):
            keep[key] = {
                f: part[f]
                for f in fields
                if isinstance(part.get(f), str) and _LABEL.fullmatch(part[f])
            }
    return keep


def __getattr__(name: str):
    """``InertStudentCells`` lived here until it joined the other nbgrader plugins (``plugins.py``).
    A course config written before that imports it from here; an ImportError there would make
    nbgrader drop the whole config (its sandbox and pages' walls with it), so the old name still
    works, imported only when asked for (``mlbook grade`` never asks)."""
    if name == "InertStudentCells":
        from mlbook_tools.plugins import InertStudentCells

        return InertStudentCells
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def page_budget(config=None):
    """The Jinja filter ``page_budget`` of the course's pages (``c.HTMLExporter.filters`` in the
    course config, ``config`` its ``c``): ``none | page_budget`` is a fresh budget of what one page
    renders, from the course's limits (``c.SandboxedExecute.limits``, wherever the file sets them)
    on the defaults (``GradingLimits.page_*``). Read when a page is rendered, not when the file
    loads: an exception there would make nbgrader drop the whole file (traitlets logs it and goes
    on), and ``mlbook grade`` reads the limits of a file that names ``SandboxedExecute`` only where it
    sets them without running it (``grading.course_limits``)."""
    return lambda _=None: limits_from_config(config).page_budget()


def inert_notebook(nb, limits: GradingLimits = DEFAULT):
    """A notebook nbgrader autograded (the Autograde button), made inert in place: ``sanitize_cell``
    for every cell (a cell whose nbgrader grade id is not a plain name, as every source cell's is,
    counts as added: its metadata goes), ``fold_outputs``, and of the notebook's metadata the
    kernel's labels and the build's ``mlbook`` entry."""
    for cell in nb.cells:
        gid = grade_id(cell)
        sanitize_cell(cell, not (isinstance(gid, str) and _NAME.fullmatch(gid)), limits)
    fold_outputs(nb.cells, limits)
    mine = nb.metadata.get("mlbook")
    nb.metadata = {
        **inert_metadata(nb.metadata),
        **({"mlbook": mine} if isinstance(mine, dict) else {}),
    }
    return nb
