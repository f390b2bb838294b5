"""Feedback pages typeset their math with no script and no network: TeX becomes MathML when the page
is written (``latex2mathml``), which every current browser draws natively.

A student receives ``feedback/<student>/<assignment>/<nb>.html`` alone, opened from a download
folder, often offline: a MathJax loader pointing at the course folder or a CDN then leaves raw TeX.
:func:`typeset` rewrites the finished page: every ``$...$`` / ``$$...$$`` (and ``\\(...\\)``,
``\\[...\\]``) outside ``pre``, ``code``, ``script``, ``style`` and ``textarea`` becomes a
``<math>`` element (display math as a block); a formula the converter cannot read stays as its TeX.
"""

from __future__ import annotations

import html
import re

# Regions never touched: code, scripts, and the text of tags themselves.
_SKIP = re.compile(r"(<(pre|code|script|style|textarea)\b.*?</\2\s*>|<[^>]*>)", re.S | re.I)
_MATH = re.compile(
    r"\$\$(?P<d1>.+?)\$\$|\\\[(?P<d2>.+?)\\\]|(?<![\\$])\$(?P<i1>[^$\n]+?)\$(?!\$)|\\\((?P<i2>.+?)\\\)",
    re.S,
)


# The converter's output is written into the page unsanitised, and the TeX is a student's: it passes
# only if every tag is a MathML element and every attribute a presentational one (``\\text{<img/...>}``
# would otherwise come out as a live tag, ``\\href``/``\\style``/``\\class`` as attributes).
_MATHML_TAGS = frozenset(
    "math mrow mi mn mo ms mtext mspace msup msub msubsup mfrac msqrt mroot mover munder munderover "
    "mtable mtr mtd mstyle mpadded mphantom menclose mfenced merror semantics annotation".split()
)
_MATHML_ATTRS = frozenset(
    "xmlns display mathvariant stretchy fence separator separators lspace rspace width height depth "
    "columnalign rowalign columnspacing rowspacing columnlines rowlines displaystyle scriptlevel accent "
    "accentunder linethickness minsize maxsize movablelimits form open close notation symmetric "
    "largeop encoding align equalrows equalcolumns frame framespacing".split()
)
_TAG = re.compile(r"<(/?)([^\s/>]*)([^>]*)>")
_ATTR = re.compile(r"""([^\s=/]+)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)|(\S+)""")


def _safe(mathml: str) -> bool:
    """Every tag of ``mathml`` a MathML element with presentational attributes only."""
    for _closing, name, rest in _TAG.findall(mathml):
        if name not in _MATHML_TAGS:
            return False
        for attr, _value, bare in _ATTR.findall(rest.rstrip("/")):
            if bare or attr.lower() not in _MATHML_ATTRS:
                return False
    return "<" not in _TAG.sub("", mathml)


def _convert(tex: str, display: bool) -> str | None:
    from latex2mathml.converter import convert

    try:
        out = convert(html.unescape(tex).strip(), display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - any formula the converter cannot read stays as TeX
        return None
    return out if _safe(out) else None


def _text(chunk: str) -> str:
    def one(m: re.Match) -> str:
        display = m.group("d1") is not None or m.group("d2") is not None
        tex = next(g for g in (m.group("d1"), m.group("d2"), m.group("i1"), m.group("i2")) if g)
        out = _convert(tex, display)
        return m.group(0) if out is None else out

    return _MATH.sub(one, chunk)


def typeset(page: str) -> str:
    """``page`` with its TeX turned into MathML (text between tags only; code left alone)."""
    parts, pos = [], 0
    for m in _SKIP.finditer(page):
        parts.append(_text(page[pos : m.start()]))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(_text(page[pos:]))
    return "".join(parts)
