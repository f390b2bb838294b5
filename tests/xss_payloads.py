"""Script-injection payloads for the instructor's pages (tests/test_xss.py), and a notebook carrying them.

Each payload kind is a template with two fields: ``{js}``, the canary script (it sets a flag on the
page and asks the test's own HTTP endpoint for ``/hit?k=<kind>``), and ``{url}``, that endpoint (for
the kinds that leak without a script: CSS, ``<base>``, images). A kind that runs or loads anything
shows up as a flag in the page or a request in the endpoint's log, named by kind and place.

``payload_notebook`` puts every kind in every place a student controls: the written answers
(markdown solution cells), cells they add (markdown and code), the stored outputs of added code
cells and of their answer cells (text/html, image/svg+xml, application/javascript, text/markdown,
a widget view, an error), markdown attachments, cell metadata (tags, free keys, forged nbgrader
fields) and notebook metadata (kernelspec, language_info, widget state, title). ``ID_KINDS`` are
the kinds that fit a folder name (no ``/``): they become student ids.
"""

from __future__ import annotations

import base64
import copy
import json

# The canary: no "/" in it (it goes into folder names too) and no double quote (attribute values).
CANARY = (
    "top.__xss=(top.__xss||[]).concat('{k}');"
    "fetch('http:\\x2f\\x2f127.0.0.1:{port}\\x2fhit?k={k}',{{mode:'no-cors'}})"
)

KINDS: dict[str, str] = {
    "img-onerror": '<img src=x onerror="{js}">',
    "img-onerror-case": '<IMG SRC=x OnErRoR="{js}">',
    "svg-onload": '<svg onload="{js}"></svg>',
    "svg-animate": '<svg><animate onbegin="{js}" attributeName=x dur=1s></animate></svg>',
    "svg-script": "<svg><script>{js}</script></svg>",
    "script": "<script>{js}</script>",
    "script-src-data": '<script src="data:text/javascript,{js}"></script>',
    "iframe-srcdoc": '<iframe srcdoc="<script>parent.{js}</script>"></iframe>',
    "iframe-js-src": '<iframe src="javascript:parent.{js}"></iframe>',
    "object-data": '<object data="data:text/html;base64,{b64}"></object>',
    "embed-src": '<embed src="data:text/html;base64,{b64}">',
    "details-ontoggle": '<details open ontoggle="{js}"><summary>s</summary></details>',
    "input-autofocus": '<input autofocus onfocus="{js}">',
    "video-onerror": '<video><source onerror="{js}"></video>',
    "body-onload": '<body onload="{js}">',
    "marquee-onstart": '<marquee onstart="{js}">m</marquee>',
    "custom-tag-handler": '<xss id=x tabindex=1 onfocusin="{js}" autofocus>x</xss>',
    "a-javascript": '<a id=jsl href="javascript:{js}">link</a>',
    "a-data-html": '<a href="data:text/html;base64,{b64}">data link</a>',
    "img-javascript-src": '<img src="javascript:{js}">',
    "form-action": '<form action="javascript:{js}"><button id=fb>go</button></form>',
    "form-formaction": '<form><button formaction="javascript:{js}">go</button></form>',
    "meta-refresh": '<meta http-equiv="refresh" content="0;url=javascript:{js}">',
    "meta-refresh-url": '<meta http-equiv="refresh" content="0;url={url}/meta">',
    "base-href": '<base href="{url}/base/">',
    "css-style-tag": "<style>body {{ background: url({url}/css-style) }}</style>",
    "css-style-attr": "<div style=\"background-image: url('{url}/css-attr'); position: fixed; inset: 0\">o</div>",
    "css-link": '<link rel="stylesheet" href="{url}/css-link">',
    "img-remote": '<img src="{url}/img">',
    "mutation-noscript": "<noscript><p title=\"</noscript><img src=x onerror='{js}'>\"></p></noscript>",
    "textarea-break": '</textarea><img src=x onerror="{js}">',
    "title-break": '</title><img src=x onerror="{js}">',
    "entity-scheme": '<a href="jav&#x09;ascript&#58;{js}">entity</a>',
    "md-link-js": "[md link](javascript:{js})",
    "md-image-js": "![md image](javascript:{js})",
    "md-autolink": "<javascript:{js}>",
    "md-ref-link": "[ref][r]\n\n[r]: javascript:{js}",
    "md-image-onerror": '![x](x" onerror="{js})',
    "mathjax-href": "$\\href{{javascript:{js}}}{{x}}$",
    "mathjax-style": "$\\style{{background-image: url({url}/mathjax-style)}}{{x}}$",
    "mathjax-html-in-math": '$x <img src=x onerror="{js}"> y$',
}

# Address-fetch kinds: an address the student chose, which the instructor's browser must never
# fetch or follow (issue 31): images relative to the page, to the server's root (a GET to /logout
# logs the instructor out), to another host in odd spellings that browsers read as "//host"
# (backslashes, a tab or newline inside), in markdown; links that would navigate the instructor's
# session (formgrader's ?path= switch); MathJax's \\style (cursor:url() fetches on hover), \\href,
# \\class, \\cssId, \\bbox styles, \\require. Every address carries ``ADDRESS=kind@place``: a request
# for one shows in the browser's own log by that mark (tests/test_xss.py), same origin or not.
ADDRESS = "xss-address"
ADDRESS_KINDS: dict[str, str] = {
    "img-relative": '<img src="logout?{mark}" alt="relative">',
    "img-root": '<img src="/logout?{mark}">',
    "img-protocol-relative": '<img src="//127.0.0.1:{port}/hit?{mark}">',
    "img-backslashes": '<img src="\\\\127.0.0.1:{port}/hit?{mark}">',
    "img-slash-backslash": '<img src="/\\127.0.0.1:{port}/hit?{mark}">',
    "img-tab-host": '<img src="/\t/127.0.0.1:{port}/hit?{mark}">',
    "img-tab-scheme": '<img src="ht\ttp://127.0.0.1:{port}/hit?{mark}">',
    "img-entity-tab": '<img src="/&#9;/127.0.0.1:{port}/hit?{mark}">',
    "img-srcset": '<img srcset="/logout?{mark} 1x" alt="srcset">',
    "img-gif-data": '<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=" alt="{mark}">',
    "md-img-relative": "![markdown image](logout?{mark})",
    "md-img-root": "![markdown image](/logout?{mark})",
    "md-img-protocol-relative": "![x](//127.0.0.1:{port}/hit?{mark})",
    "md-img-reference": "![ref image][i]\n\n[i]: /logout?{mark}",
    "a-get-switch": '<a href="/formgrader?path=submitted/mallory/rlhf_ppo&{mark}">my figures</a>',
    "md-link-root": "[log out](/logout?{mark})",
    "md-autolink-http": "<http://127.0.0.1:{port}/hit?{mark}>",
    "a-protocol-relative": '<a href="//127.0.0.1:{port}/hit?{mark}">elsewhere</a>',
    "mathjax-style-cursor": "$\\style{{cursor: url({url}/hit?{mark}), auto}}{{x^2}}$",
    "mathjax-href-http": "$\\href{{{url}/hit?{mark}}}{{y^2}}$",
    "mathjax-href-root": "$\\href{{/logout?{mark}}}{{z^2}}$",
    "mathjax-class": "$\\class{{navbar-fixed-top}}{{w^2}}$",
    "mathjax-cssid": "$\\cssId{{statusmessage}}{{v^2}}$",
    "mathjax-bbox-style": "$\\bbox[cursor: url({url}/hit?{mark})]{{u^2}}$",
    "mathjax-require": "$\\require{{{mark}}} t^2$",
}
KINDS.update(ADDRESS_KINDS)

# Student ids: folder names (no "/"), each short enough for a file name, each with its own canary.
ID_KINDS = {
    "id-img": '<img src=x onerror="{js}">',
    "id-svg": '<svg onload="{js}">',
    "id-js-string": 'x";{js};"',  # formgrader writes some ids into an inline script's string
}


def fill(kind: str, port: int, place: str) -> str:
    """One payload, its canary naming the kind and the place (the endpoint logs ``kind@place``)."""
    k = f"{kind}@{place}"
    js = CANARY.format(k=k, port=port)
    b64 = base64.b64encode(f"<script>parent.{js}</script>".encode()).decode()
    return KINDS[kind].format(
        js=js, url=f"http://127.0.0.1:{port}", b64=b64, port=port, mark=f"{ADDRESS}={k}"
    )


def student_id(kind: str, port: int) -> str:
    """A folder name carrying one payload."""
    js = f"top.__xss=1;fetch('http:\\x2f\\x2f127.0.0.1:{port}\\x2fhit?k={kind}')"
    return ID_KINDS[kind].format(js=js)


def _all(port: int, place: str, sep: str = "\n\n") -> str:
    return sep.join(f"{kind}: {fill(kind, port, place)}" for kind in KINDS)


def _svg(port: int, place: str) -> str:
    js = CANARY.format(k=f"svg-image@{place}", port=port)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" onload="{js}"><script>{js}</script>'
        f'<a href="javascript:{js}"><text y="20">svg</text></a></svg>'
    )


def _outputs(port: int, place: str) -> list[dict]:
    """One output of each active kind, each carrying every payload."""
    html = _all(port, place + "/text-html")
    js = CANARY.format(k=f"application-javascript@{place}", port=port)
    widget = {
        "model_id": '<img src=x onerror="' + CANARY.format(k=f"widget@{place}", port=port) + '">',
        "version_major": 2,
        "version_minor": 0,
    }
    return [
        {
            "output_type": "display_data",
            "metadata": {"image/png": {"width": f'1 onerror="{js}"'}},
            "data": {"text/html": html, "text/plain": "plain text stays"},
        },
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/svg+xml": _svg(port, place)},
        },
        {"output_type": "display_data", "metadata": {}, "data": {"application/javascript": js}},
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"text/markdown": _all(port, place + "/text-markdown")},
        },
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"application/vnd.jupyter.widget-view+json": widget, "text/plain": "widget"},
        },
        {
            "output_type": "execute_result",
            "execution_count": 1,
            "metadata": {},
            "data": {"text/latex": "$\\href{javascript:" + js + "}{x}$", "text/plain": "latex"},
        },
        {"output_type": "stream", "name": "stdout", "text": _all(port, place + "/stream")},
        {
            "output_type": "error",
            "ename": f'<img src=x onerror="{js}">',
            "evalue": _all(port, place + "/error"),
            "traceback": [_all(port, place + "/traceback")],
        },
    ]


def _metadata(port: int, place: str) -> dict:
    k = fill("img-onerror", port, place)
    return {
        "tags": [k, f'"><svg onload="{CANARY.format(k="tag@" + place, port=port)}">'],
        "free": {"html": _all(port, place)},
        "jupyter": {"source_hidden": k},
    }


def _attachments(port: int, place: str) -> dict:
    svg = base64.b64encode(_svg(port, place + "/svg").encode()).decode()
    html = base64.b64encode(_all(port, place + "/html").encode()).decode()
    return {
        "evil.svg": {"image/svg+xml": svg},
        "evil.html": {"text/html": html},
        "ok.png": {"image/png": _PNG},
    }


BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\n"
_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def payload_notebook(release_nb, port: int) -> dict:
    """The released notebook (nbformat node) with every payload in every student-controlled place."""
    import nbformat

    nb = copy.deepcopy(release_nb)
    added = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id", "")
        if meta.get("solution") and cell.cell_type == "markdown":
            cell.source = (
                f"My answer, with math $x^2 + \\beta$ and **bold**.\n\n{_all(port, 'answer:' + gid)}\n\n"
                "![attached](attachment:ok.png) ![svg](attachment:evil.svg) [html](attachment:evil.html)"
            )
            cell.attachments = _attachments(port, "attachment:" + gid)
            cell.metadata.update(_metadata(port, "answer-meta:" + gid))
        elif meta.get("solution") and cell.cell_type == "code" and gid in ("ex3_demo", "ex5_demo"):
            cell.outputs = [nbformat.from_dict(o) for o in _outputs(port, "answer-output:" + gid)]
            cell.execution_count = 1
    for i, where in enumerate(("top", "middle")):
        md = nbformat.v4.new_markdown_cell(
            f"# Added {where}\n\n{_all(port, 'added-md:' + where)}\n\n"
            "![a](attachment:evil.svg) ![b](attachment:ok.png)"
        )
        md.attachments = _attachments(port, "added-attachment:" + where)
        md.metadata = _metadata(port, "added-md-meta:" + where)
        forged = nbformat.v4.new_markdown_cell(_all(port, "forged-nbgrader:" + where))
        forged.metadata["nbgrader"] = {
            "grade_id": fill("img-onerror", port, "forged-id"),
            "solution": False,
            "grade": False,
            "locked": False,
            "schema_version": 3,
        }
        code = nbformat.v4.new_code_cell("print('hello')", execution_count=1)
        code.outputs = [nbformat.from_dict(o) for o in _outputs(port, "added-output:" + where)]
        code.metadata = _metadata(port, "added-code-meta:" + where)
        added.append((i * (len(nb.cells) // 2), [md, code, forged]))
    for index, cells in sorted(added, reverse=True):
        nb.cells[index:index] = cells
    nb.metadata["title"] = fill("script", port, "nb-title")
    nb.metadata["kernelspec"]["display_name"] = fill("img-onerror", port, "kernelspec")
    nb.metadata.setdefault("language_info", {})["name"] = fill("svg-onload", port, "language")
    nb.metadata["language_info"]["pygments_lexer"] = fill("img-onerror", port, "lexer")
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {
                "m": {
                    "model_name": "HTMLModel",
                    "model_module": "@jupyter-widgets/controls",
                    "state": {"value": _all(port, "widget-state")},
                }
            },
            "version_major": 2,
            "version_minor": 0,
        }
    }
    nb.metadata["free"] = json.loads(json.dumps({"html": _all(port, "nb-meta")}))
    return nb


# Page-size kinds: a submission within the grading bounds (README "Bounds": 4 MiB of sources, 2000
# cells, 16 MiB of outputs, 20 MiB in all) that would make a page slow to open; every page an
# instructor or a student opens renders in <= 3 s anyway (tests/test_xss.py bounds the tags, make bench the seconds).
PAGE_SIZE_KINDS = ("code-4mb", "markdown-4mb", "cells-outputs", "markdown-cells", "images")
_CODE_LINE = "total = total + weights[3] * (x - 1) / 2 ** k  # one of many steps\n"
_MD_PARA = (
    "The ratio $r_t(\\theta) = \\pi_\\theta(a|s) / \\pi_{old}(a|s)$ is *clipped* to **[1-e, 1+e]**"
    " (`clip`), see [PPO](https://arxiv.org/abs/1707.06347) and $$\\sum_t A_t$$.\n\n"
)


def _sources(nb) -> int:
    return sum(len("".join(c.source).encode()) for c in nb.cells)


def size_notebook(release_nb, kind: str, limits=None) -> dict:
    """The released notebook with one page-size payload, just inside ``limits`` (GradingLimits)."""
    import nbformat
    from mlbook_tools.limits import DEFAULT

    limits = limits or DEFAULT
    nb = copy.deepcopy(release_nb)
    room = limits.max_source_bytes - _sources(nb) - 4096  # what the sources may still grow by
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    if kind == "code-4mb":  # one code answer of ~4 MB (nbgrader's page took 48 s)
        cell = next(c for c in answers if c.cell_type == "code")
        cell.source += "\n" + _CODE_LINE * (room // len(_CODE_LINE))
    elif kind == "markdown-4mb":  # one written answer of ~4 MB, math and markup throughout
        cell = next(c for c in answers if c.cell_type == "markdown")
        cell.source = _MD_PARA * (room // len(_MD_PARA.encode()))
    elif kind in ("cells-outputs", "markdown-cells"):  # up to the cell bound, added cells
        # (the bound's first check counts the key "cell_type", which nbgrader's metadata repeats)
        extra = limits.max_cells - json.dumps(nb).count('"cell_type"')
        if kind == "cells-outputs":  # each with 20 printed outputs, up to the output bound
            per = (limits.max_output_bytes - 65536) // (extra * 20)
            text = "x" * (per - len("stream") - len("stdout") - 1) + "\n"
            outputs = [{"output_type": "stream", "name": "stdout", "text": text}] * 20
            cells = [  # plain dicts: nbformat's constructors validate every output (minutes)
                {"cell_type": "code", "metadata": {}, "source": f"print({i})", "outputs": outputs}
                | {"execution_count": None, "id": f"added-{i}"}
                for i in range(extra)
            ]
        else:  # each a paragraph of math and markup, up to the source bound
            para = (_MD_PARA * (room // extra // len(_MD_PARA.encode()) + 1))[: room // extra - 2]
            cells = [nbformat.v4.new_markdown_cell(para) for _ in range(extra)]
        nb.cells[len(nb.cells) // 2 : len(nb.cells) // 2] = cells
    elif kind == "images":  # PNG outputs of 2 MB each (the largest inert.py keeps), up to the bound
        png = (_PNG * (2_000_000 // len(_PNG)))[:1_999_996]
        count = (limits.max_output_bytes - 65536) // len(png)
        outputs = [
            nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "fig"})
        ] * count
        nb.cells.insert(len(nb.cells) // 2, nbformat.v4.new_code_cell("show()", outputs=outputs))
    else:
        raise ValueError(f"unknown page-size kind {kind!r}: one of {PAGE_SIZE_KINDS}")
    return json.loads(
        json.dumps(nb)
    )  # plain JSON, as handed in (nbformat would validate 40k outputs)
