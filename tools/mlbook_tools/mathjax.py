"""The reading HTML typesets its math offline: MathJax ships with the project, never from a CDN.

MathJax 2.7 comes from the pinned ``jupyter-server-mathjax`` wheel (its ``static/`` folder is the
MathJax distribution: ``MathJax.js``, the ``TeX-AMS-MML_HTMLorMML-full`` configuration, HTML-CSS
and SVG output, the fonts). ``make html`` copies it next to the pages, ``build/mathjax/``, and points
nbconvert's ``--HTMLExporter.mathjax_url`` at it (``URL``), so the pages work with no network.

    python -m mlbook_tools.mathjax build/mathjax
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import pathlib
import shutil
import sys

from nbconvert import HTMLExporter
from traitlets import default

CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"
TEMPLATES = importlib.resources.files("mlbook_tools") / "templates"  # mlbook, mlbook_feedback
URL = f"mathjax/MathJax.js?config={CONFIG}"  # relative to the HTML pages


def static_dir() -> pathlib.Path:
    """The packaged MathJax distribution."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("jupyter-server-mathjax is not installed: run `make env`")
    folder = pathlib.Path(spec.origin).parent / "static"
    if not (folder / "MathJax.js").exists():
        raise FileNotFoundError(f"no MathJax.js in {folder}")
    return folder


def nbgrader_templates() -> pathlib.Path:
    """nbgrader's own template folder (feedback/, formgrade/), which mlbook_feedback extends."""
    spec = importlib.util.find_spec("nbgrader")
    return pathlib.Path(spec.origin).parent / "server_extensions" / "formgrader" / "templates"


class FeedbackExporter(HTMLExporter):
    """``nbgrader generate_feedback``'s exporter (``c.GenerateFeedback.exporter_class``), configured
    in the course config as ``c.FeedbackExporter`` to use the ``mlbook_feedback`` template (tests and
    written answers named, MathJax offline first). A class of its own, so that formgrader, which
    reads the same course config, keeps nbgrader's templates."""

    @staticmethod
    def template_basedirs() -> list[str]:
        return [str(TEMPLATES), str(nbgrader_templates())]

    @default("extra_loaders")
    def _fold_loader(self) -> list:
        """formgrade/mlbook_fold.html.j2 (the page budget, shared with formgrader's page) by its name
        only: a loader, as nbgrader sets the exporters' template paths itself."""
        from jinja2 import FunctionLoader

        path = pathlib.Path(str(TEMPLATES)) / "formgrade" / "mlbook_fold.html.j2"
        return [
            FunctionLoader(
                lambda name: (
                    (path.read_text(), str(path), lambda: False) if name == path.name else None
                )
            )
        ]

    def from_notebook_node(self, nb, resources=None, **kw):
        """The page with its math as MathML (mathml.py): self-contained, typeset offline when copied alone."""
        from mlbook_tools.mathml import typeset

        output, resources = super().from_notebook_node(nb, resources, **kw)
        return typeset(output), resources


def copy_to(dest: str | pathlib.Path) -> pathlib.Path:
    """Copy MathJax to ``dest`` (replacing an older copy); returns ``dest``."""
    dest = pathlib.Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(static_dir(), dest)
    return dest


if __name__ == "__main__":
    print(f"MathJax copied to {copy_to(sys.argv[1] if len(sys.argv) > 1 else 'build/mathjax')}")
