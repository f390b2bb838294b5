"""The Makefile's html target read back as nbconvert configuration (not a test module): shared by
test_html.py (render without executing) and test_browser.py (the page in a browser)."""

import re

from mlbook_tools.config import layout
from nbconvert import HTMLExporter
from traitlets.config import Config

ROOT = layout().root


def html_target() -> str:
    """The Makefile's html target, its recipe included."""
    text = (ROOT / "Makefile").read_text()
    return text[text.index("\nhtml:") : text.index("\nchapter:")]


def makefile_html_option() -> str:
    """The tag-removal option the Makefile's html target passes to nbconvert."""
    m = re.search(r"--TagRemovePreprocessor\.remove_cell_tags='(\{[^}]*\})'", html_target())
    assert m, "the Makefile's html target must remove the hidden-test cells"
    return m.group(1)


def exporter() -> HTMLExporter:
    """nbconvert's HTML exporter configured as the Makefile's html target configures it."""
    target = html_target()
    config = Config()
    config.TagRemovePreprocessor.remove_cell_tags = set(
        eval(makefile_html_option())
    )  # a set literal of tag names
    config.TemplateExporter.extra_template_basedirs = [
        str(ROOT / re.search(r"--TemplateExporter\.extra_template_basedirs=(\S+)", target).group(1))
    ]
    config.HTMLExporter.template_name = re.search(r"--template (\S+)", target).group(1)
    return HTMLExporter(config=config)
