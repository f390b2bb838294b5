"""The course's Content-Security-Policy: the wall behind the sanitiser (inert.py) in the instructor's browser.

Every response of the Jupyter server that serves the course (formgrader, JupyterLab) gets a second
``Content-Security-Policy`` header (the browser enforces both it and Jupyter's own): scripts only
from the server itself, no inline event handler, no ``javascript:`` URL, no plugin, no form or
``<base>`` to another site, no request to another host. On formgrader's pages (every page but
JupyterLab's own) images are only ``data:`` and scripts connect only to the server: an image
address in a student's content (``/logout``, a tracker) is never fetched.

formgrader's pages carry inline scripts of their own (``var assignment_id = "...";`` and the
like, rendered per page), so a fixed header cannot list them; instead each HTML response's policy
lists the SHA-256 of exactly these inline scripts:

* one whose text is a script of the server's own templates (mlbook's formgrade/feedback templates,
  nbgrader's, JupyterLab's), found verbatim there at start-up (it has no template field inside);
* one that only assigns plain strings (``var name = "text";`` lines, the text without quote,
  backslash or ``<``): formgrader's per-page values, which name assignments, students, paths.

Anything else inline (a ``<script>`` that got past the sanitiser, an ``onerror=``) has no hash and
does not run. JupyterLab's own pages (``/lab``, ``/tree``, ...) also get ``'unsafe-eval'``: JupyterLab
compiles its settings schemas at run time and does not start without it; formgrader's never do. formgrader's own page templates are switched to escape every value they insert
(nbgrader renders them unescaped, and a student id is a folder name). Whatever the server serves
from files (``/files/``, ``/nbconvert/``, anything under ``/formgrader/submissions/<id>/``) gets a
sandbox with no script at all, and a file under ``submitted/`` or ``autograded/`` is a download.
formgrader itself serves no file of a submission folder and never switches its course on a GET
(``formgrader_guard``, installed by ``protect``).

nbgrader reads the course's ``nbgrader_config.py`` inside the server process when formgrader
loads; that file calls ``protect_running_server()``, so wherever formgrader shows this course, the
policy is on, however the server was started. ``policy`` is for the feedback page's own ``<meta>``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import pathlib
import re
import sys
import urllib.parse

from mlbook_tools.mathjax import TEMPLATES

POLICY = (
    "default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
    "img-src {img}; font-src 'self' data:; connect-src {connect}; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'"
)
# formgrader's pages (and every other page but JupyterLab's own) show images only inline: no address
# in a student's content (`/logout`, a tracker) is fetched; their scripts talk only to the server.
PAGE = {"img": "data:", "connect": "'self'"}
APP = {"img": "'self' data: blob:", "connect": "'self' ws: wss:"}  # JupyterLab: files, kernels
SANDBOX = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; sandbox"
HANDLERS = ("toggleAllNames()",)  # nbgrader's one inline handler (gradebook page): allowed by hash
UNSAFE_HASHES = "'unsafe-hashes' " + " ".join(
    f"'sha256-{base64.b64encode(hashlib.sha256(h.encode()).digest()).decode()}'" for h in HANDLERS
)
_SCRIPT = re.compile(rb"<script\b([^>]*)>(.*?)</script\s*>", re.S | re.I)
_ASSIGN = re.compile(r'\s*(?:var [A-Za-z_]\w* = "[^"\\<\r\n]*";\s*)+')
# after base_url: a file (or anything) under a submission's formgrader address, a file the server serves
_STUDENT_FILES = re.compile(r"/(files|nbconvert)/|/formgrader/submissions/(?!components/)[^/]+/.")
_HANDED_IN = re.compile(r"/files/(.*/)?(submitted|autograded)/")  # a student's folders: a download


def csp_hash(text) -> str:
    """The CSP source naming one inline script by its text (a Jinja filter too)."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(str(text).encode()).digest()).decode() + "'"


def _template_scripts() -> set[str]:
    """Hash sources of the inline scripts written literally in the server's own templates."""
    folders = [pathlib.Path(str(TEMPLATES))]
    for pkg, sub in (
        ("nbgrader", "server_extensions/formgrader/templates"),
        ("jupyterlab_server", "templates"),
    ):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.origin:
            folders.append(pathlib.Path(spec.origin).parent / sub)
    pages = [
        p for folder in folders for p in folder.rglob("*") if p.suffix in (".j2", ".tpl", ".html")
    ]
    app = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "static" / "index.html"
    pages += [app] if app.is_file() else []  # JupyterLab's built page (its token-removing script)
    found = set()
    for path in pages:
        for _, body in _SCRIPT.findall(path.read_bytes()):
            if b"{{" not in body and b"{%" not in body and body.strip():
                found.add(csp_hash(body.decode()))
    for path in pathlib.Path(str(TEMPLATES)).rglob("*.js"):
        text = path.read_text()  # included whole: {% include %} drops the final newline
        found.add(csp_hash(text[:-1] if text.endswith("\n") else text))
    return found


_APP = re.compile(r"/(lab|tree|notebooks|edit|consoles|terminals|doc)(/|$)")


def policy(extra: set[str] | frozenset = frozenset(), app: bool = False) -> str:
    """The header; ``app``: a JupyterLab / Notebook page, whose own code compiles its settings
    schemas with ``new Function`` (ajv) and so needs 'unsafe-eval' (formgrader's pages never get it)."""
    return POLICY.format(
        hashes=" ".join(sorted(extra) + [UNSAFE_HASHES] + (["'unsafe-eval'"] if app else [])),
        **(APP if app else PAGE),
    )


def merged(ours: str, theirs: list[str]) -> str:
    """One policy, not two: the course's, plus any directive of the server's own header(s) that it
    does not set (``report-uri``, ...). Two headers are two policies, both enforced: a JupyterHub
    single-user server's ``frame-ancestors 'none'`` beside the course's ``'self'`` blanks
    formgrader's tab inside JupyterLab."""
    names = {d.split()[0].lower() for d in ours.split(";") if d.strip()}
    extra = []
    for header in theirs:
        for directive in header.split(";"):
            name = directive.split()[0].lower() if directive.strip() else ""
            if name and name not in names:
                names.add(name)
                extra.append(directive.strip())
    return "; ".join([ours, *extra])


class CspTransform:
    """A Tornado output transform: the course's policy on every response (hashes per HTML page)."""

    trusted: set[str] = set()
    settings: dict = {}

    def __init__(self, request):
        self.path = request.path
        # formgrader's own pages escape every value (nbgrader renders them unescaped; ids are folder names)
        env = self.settings.get("nbgrader_jinja2_env")
        if env is not None and not env.autoescape:
            env.autoescape = True
            if env.cache is not None:
                env.cache.clear()
        if env is not None:  # formgrader's pages show grade-class's flags (formgrader_guard)
            from mlbook_tools.formgrader_guard import extend_templates

            extend_templates(env)

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        base = self.settings.get("base_url", "/")
        path = urllib.parse.unquote(
            self.path
        )  # as the route sees it (`%73ubmitted` is `submitted`)
        if path.startswith(base) and _STUDENT_FILES.match(path[len(base) - 1 :]):
            headers.add("Content-Security-Policy", SANDBOX)
            headers["X-Content-Type-Options"] = "nosniff"
            if _HANDED_IN.match(path[len(base) - 1 :]) and "Content-Disposition" not in headers:
                headers["Content-Disposition"] = "attachment"
            return status_code, headers, chunk
        allowed = set()
        if headers.get("Content-Type", "").startswith("text/html") and not headers.get(
            "Content-Encoding"
        ):
            for attrs, body in _SCRIPT.findall(chunk):
                if b"src=" in attrs.lower() or (
                    b"type=" in attrs.lower() and b"javascript" not in attrs.lower()
                ):
                    continue  # external (script-src 'self' decides) or data (application/json: never run)
                text = body.decode("utf-8", "replace")
                source = csp_hash(text)
                if source in self.trusted or _ASSIGN.fullmatch(text):
                    allowed.add(source)
            # A page's hashes are only known with its body: never a 304 revalidation (its headers
            # would replace the policy of the cached page with one that names none of its scripts).
            headers.pop("Etag", None)
            headers["Cache-Control"] = "no-store"
        app = bool(_APP.search(self.path)) and "/formgrader" not in self.path
        theirs = headers.get_list("Content-Security-Policy")
        headers["Content-Security-Policy"] = merged(policy(allowed, app), theirs)
        return status_code, headers, chunk

    def transform_chunk(self, chunk, finishing):
        return chunk


def protect(web_app) -> None:
    """Install the policy on a Tornado application (once), and mlbook's formgrader routes
    (formgrader_guard: no submission file served, no course switch on GET)."""
    from mlbook_tools.formgrader_guard import harden

    harden(web_app)
    if any(t is CspTransform for t in web_app.transforms):
        return
    CspTransform.trusted = _template_scripts()
    CspTransform.settings = web_app.settings
    web_app.transforms.insert(0, CspTransform)


def protect_running_server() -> bool:
    """Inside a Jupyter server process (formgrader loading the course config): protect its pages."""
    import sys

    if "jupyter_server.serverapp" not in sys.modules:
        return False
    from jupyter_server.serverapp import ServerApp

    app = ServerApp.instance() if ServerApp.initialized() else None
    web_app = getattr(app, "web_app", None)
    if web_app is None:
        return False
    protect(web_app)
    return True


def _load_jupyter_server_extension(serverapp) -> None:
    """Also a server extension: ``--ServerApp.jpserver_extensions='{"mlbook_tools.csp": True}'``."""
    protect(serverapp.web_app)


def _jupyter_server_extension_points():
    return [{"module": "mlbook_tools.csp"}]
