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


def _convert(tex: str, display: bool) -> str | None:
    from latex2mathml.converter import convert

    try:
        return convert(html.unescape(tex).strip(), display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - any formula the converter cannot read stays as TeX
        return None


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
