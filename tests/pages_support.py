"""What the instructor's pages make of an autograded notebook, rendered in-process (not a test
module): shared by test_xss_pages.py (unit: what the pages keep) and test_xss.py (how fast they render).
"""

import json
import pathlib

import nbformat
from mlbook_tools.config import layout
from mlbook_tools.result import GradingResult

ASSIGNMENT = "rlhf_ppo"


def autograded(student_nb: dict, problems=()):
    """The autograded notebook `mlbook grade-class` writes for ``student_nb`` (no sandbox: no verdicts)."""
    from mlbook_tools import driver, feedback

    source_nb = nbformat.read(
        layout().course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    plan = driver.make_plan(source_nb, json.dumps(student_nb))
    return feedback.autograded_notebook(source_nb, plan, GradingResult(problems=list(problems)))


def formgrader_page(path: pathlib.Path, course: pathlib.Path | None = None) -> str:
    """formgrader's submission page for the notebook at ``path``: the course config's HTMLExporter with
    the formgrade template, read from the file as formgrader's SubmissionHandler does. ``course``:
    the folder of the course config (default: the checkout's course)."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(
        "nbgrader_config.py", path=str(course or layout().course)
    ).load_config()
    config.merge(Config({"HTMLExporter": {"template_name": "formgrade"}}))
    resources = {
        "base_url": "",
        "submission_id": "s1",
        "notebook_id": ASSIGNMENT,
        "assignment_id": ASSIGNMENT,
        "index": 0,
        "total": 1,
        "student": "mallory",
        "notebook_path": f"autograded/mallory/{ASSIGNMENT}/{ASSIGNMENT}.ipynb",
    }
    return HTMLExporter(config=config).from_filename(str(path), resources=resources)[0]


def feedback_page(path: pathlib.Path, course: pathlib.Path | None = None) -> str:
    """The feedback page `nbgrader generate_feedback` writes for the notebook at ``path`` (the course's
    exporter and preprocessors; the scores nbgrader's GetGrades would read from the gradebook: 0)."""
    import nbgrader
    from mlbook_tools.feedback import CapOutputs, CoreExtraSummary, RedactHiddenTests
    from mlbook_tools.mathjax import FeedbackExporter
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(
        "nbgrader_config.py", path=str(course or layout().course)
    ).load_config()
    css = (
        pathlib.Path(nbgrader.__file__).parent / "server_extensions/formgrader/static/node_modules"
    )
    config.HTMLExporter.extra_template_paths = [
        str(css / "bootstrap" / "dist" / "css")
    ]  # as nbgrader
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader.update(score=0.0, needs_manual_grade=False)
    resources = {"nbgrader": {"notebook": ASSIGNMENT, "late_penalty": 0}, "config_dir": str(path)}
    for step in (CoreExtraSummary, CSSHTMLHeaderPreprocessor, RedactHiddenTests, CapOutputs):
        nb, resources = step(config=config).preprocess(nb, resources)
    return FeedbackExporter(config=config).from_notebook_node(nb, resources=resources)[0]
