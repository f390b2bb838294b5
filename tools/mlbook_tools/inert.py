"""Student content is inert wherever a person looks at it: formgrader, the feedback page, exports.

A submission is text the student wrote: markdown (their answers and any cell they add), the outputs
their code stored, attachments, cell and notebook metadata, even the folder name that becomes their
student id. Rendered as it is in the instructor's formgrader page, a stored ``<img onerror>`` runs
with the instructor's session and can rewrite grades through formgrader's REST API. Three walls:

* ``inert_outputs`` / ``InertStudentCells``: the autograded notebook (the one formgrader and the
  feedback read) keeps of a student's outputs only capped ``text/plain`` (or stream text) and
  PNG/JPEG images, no output metadata; markdown attachments only PNG/JPEG; no cell metadata on
  cells the student added; notebook metadata only the kernel's name and language.
* ``clean_html``: every piece of HTML the course's pages render from a notebook (markdown after
  rendering, any HTML output that still arrives) goes through the nh3 (ammonia) allow-list:
  readable markdown (headings, paragraphs, lists, tables, code, links, images) and the text of
  the math (MathJax typesets it afterwards, with its Safe extension); no script, no event handler,
  no ``style``/``class``/``id``, no ``javascript:``/``data:`` URL except a raster image.
* ``csv_cell``: an exported text cell that a spreadsheet would read as a formula starts with a quote.

The Content-Security-Policy of the course's Jupyter server (``csp.py``) is the wall behind these.
"""

from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor

CAP = 2000  # characters of one text output kept
MAX_OUTPUTS = 20  # outputs of one cell kept
MAX_IMAGE = 2_000_000  # base64 characters of one kept image
RASTER = ("image/png", "image/jpeg")

_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "dd", "del", "details", "div",
    "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "mark",
    "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
}
_RASTER_URL = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*\Z")
_NUMBER = re.compile(r"\d{1,4}%?\Z")


def _attribute(tag: str, attr: str, value: str) -> str | None:
    """nh3's per-attribute check: data: URLs only as a raster image's src; sizes only numbers."""
    if attr in ("width", "height"):
        return value if _NUMBER.match(value.strip()) else None
    if value.strip().lower().startswith("data:"):
        return value if tag == "img" and attr == "src" and _RASTER_URL.match(value.strip()) else None
    return value


def clean_html(html) -> str:
    """HTML with only the allow-listed tags and attributes (a Jinja filter: ``| clean_html``)."""
    import nh3

    text = html.decode() if isinstance(html, bytes) else str(html)
    return nh3.clean(text, tags=_TAGS, attributes=_ATTRIBUTES, attribute_filter=_attribute,
                     url_schemes={"http", "https", "mailto", "data"}, strip_comments=True,
                     link_rel="noopener noreferrer nofollow")  # fmt: skip


def _text(value) -> str:
    from mlbook_tools.grading import printable

    text = printable("".join(value) if isinstance(value, list) else str(value))
    return text if len(text) <= CAP else text[:CAP] + f"\n... [{len(text) - CAP} more characters not shown]"


def _image(value) -> str | None:
    text = "".join(value) if isinstance(value, list) else value
    ok = isinstance(text, str) and len(text) <= MAX_IMAGE and re.fullmatch(r"[A-Za-z0-9+/=\s]*", text)
    return text if ok else None


def inert_outputs(outputs) -> list:
    """A student's stored outputs, reduced: stream text, text/plain, PNG/JPEG; capped; no metadata."""
    import nbformat

    kept = []
    for out in outputs[:MAX_OUTPUTS] if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream":
            name = out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout"
            kept.append(nbformat.v4.new_output("stream", name=name, text=_text(out.get("text", ""))))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data") if isinstance(out.get("data"), dict) else {}
            clean = {k: v for k in RASTER if (v := _image(data.get(k))) is not None}
            if "text/plain" in data or not clean:
                clean["text/plain"] = _text(data.get("text/plain", "[output not shown]"))
            kept.append(nbformat.v4.new_output("display_data", data=clean))
        elif kind == "error":
            line = _text(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}")
            kept.append(nbformat.v4.new_output("error", ename=_text(out.get("ename", "Error"))[:200],
                                               evalue=_text(out.get("evalue", "")), traceback=[line]))  # fmt: skip
    return kept


def inert_attachments(attachments) -> dict:
    """A markdown cell's attachments, only PNG/JPEG images under safe names."""
    kept = {}
    for name, bundle in (attachments or {}).items() if isinstance(attachments, dict) else []:
        if not (isinstance(name, str) and re.fullmatch(r"[\w.\-]{1,100}", name) and isinstance(bundle, dict)):
            continue
        images = {k: v for k in RASTER if (v := _image(bundle.get(k))) is not None}
        if images:
            kept[name] = images
    return kept


def inert_cell(cell, added: bool) -> None:
    """Make one cell of a student's notebook inert in place; ``added``: not a cell of the source."""
    meta = cell.get("metadata", {}).get("nbgrader") if isinstance(cell.get("metadata"), dict) else None
    cell["metadata"] = {"nbgrader": meta} if isinstance(meta, dict) and not added else {}
    if cell.get("cell_type") == "code":
        cell["outputs"] = inert_outputs(cell.get("outputs", []))
    elif "attachments" in cell:
        cell["attachments"] = inert_attachments(cell["attachments"])
        if not cell["attachments"]:
            del cell["attachments"]


def inert_metadata(metadata) -> dict:
    """Notebook metadata kept: the kernel's name and language (strings only), and the grader's own note."""
    keep = {}
    for key, fields in (("kernelspec", ("name", "display_name", "language")), ("language_info", ("name",))):
        part = metadata.get(key) if isinstance(metadata, dict) else None
        if isinstance(part, dict):
            keep[key] = {f: str(part[f])[:100] for f in fields if isinstance(part.get(f), str)}
    return keep


class InertStudentCells(Preprocessor):
    """``nbgrader autograde`` (the Autograde button): after grading, the notebook it writes keeps no
    active content (``inert_cell`` for every cell; cells without a source grade id count as added)."""

    enabled = True

    def preprocess(self, nb, resources):
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader")
            inert_cell(cell, added=not (isinstance(meta, dict) and isinstance(meta.get("grade_id"), str)))
        mine = nb.metadata.get("mlbook")
        nb.metadata = {**inert_metadata(nb.metadata), **({"mlbook": mine} if isinstance(mine, dict) else {})}
        return nb, resources


_FORMULA = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(value):
    """A CSV value a spreadsheet shows as text: a string starting like a formula gets a leading quote."""
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value
