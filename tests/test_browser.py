"""The student's and the instructor's paths, in a real browser (Debian's Chromium, headless, Selenium).

Every server is started here on 127.0.0.1 with a random token and stopped here. Waits are explicit
(a condition polled up to a deadline), never fixed sleeps: JupyterLab needs ~30 s to first paint on
two busy cores.

* the reading HTML (what `make html` writes): every formula typesets with the network off, from the
  MathJax the project ships; the students' instructions are not in it;
* the student: JupyterLab opens the copy `mlbook start` made, filled with correct answers; Run All
  finishes, every check cell prints ✓, and a screenshot shows the §3.6 training curves;
* the instructor: formgrader, on a course outside the checkout graded by `mlbook grade-class`, takes a
  manual score and a comment typed into the page; the gradebook, the feedback page and both exports
  show them.

Needs /usr/bin/chromium and /usr/bin/chromedriver (`.ci/run` installs them with apt-get); without
them these tests are skipped, except under CI (MLBOOK_CI=1), where that is a failure.
"""

import csv
import json
import os
import pathlib
import re
import shutil
import subprocess

import nbformat
import pytest
from browser_support import BIN, FORMGRADER_READY, Server, chrome, have_chromium
from browser_support import offline as _offline
from mlbook_tools.config import layout
from mlbook_tools.mathjax import URL as MATHJAX_URL
from mlbook_tools.mathjax import copy_to
from ppo_checks import CHECKS

pytestmark = pytest.mark.browser

ROOT = layout().root

if not have_chromium():
    if os.environ.get("MLBOOK_CI"):
        raise RuntimeError("CI needs chromium and chromium-driver (apt-get install them)")
    pytest.skip(
        "chromium / chromium-driver not installed (.ci/run installs them)", allow_module_level=True
    )

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path):
    driver = chrome(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


# --------------------------------------------------------------------------- the reading HTML

RAW_MATH = """
const out = [];
for (const md of document.querySelectorAll('.jp-RenderedMarkdown')) {
  const c = md.cloneNode(true);
  c.querySelectorAll('code, pre, script, .MathJax_Preview, .MathJax, .MathJax_Display, .MJX_Assistive_MathML')
   .forEach(e => e.remove());
  const t = c.textContent;
  if (/\\$|\\\\\\(|\\\\\\[/.test(t)) out.push(t.slice(Math.max(0, t.search(/\\$|\\\\\\(|\\\\\\[/) - 40), t.search(/\\$|\\\\\\(|\\\\\\[/) + 40));
}
return out;
"""


def test_reading_html_typesets_every_formula_offline(browser, tmp_path):
    from html_support import (
        exporter,  # the exporter configured exactly as the Makefile's html target
    )

    exp = exporter()
    exp.mathjax_url = MATHJAX_URL
    assert "--HTMLExporter.mathjax_url='$(MATHJAX_URL)'" in (ROOT / "Makefile").read_text()
    assert MATHJAX_URL in (ROOT / "Makefile").read_text()
    html, _ = exp.from_notebook_node(
        nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4)
    )
    assert "How to work through it" not in html and "Check your work" not in html
    assert "libs/mathjax" not in html and f'src="{MATHJAX_URL}"' in html
    (tmp_path / "rlhf_ppo.html").write_text(html)
    copy_to(tmp_path / "mathjax")
    _offline(browser)
    browser.get((tmp_path / "rlhf_ppo.html").as_uri())
    WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: d.execute_script(
            "return !!(window.MathJax && MathJax.Hub && MathJax.isReady && MathJax.Hub.queue.pending === 0"
            " && !MathJax.Hub.queue.running)"
        )
    )
    n_tex = browser.execute_script(
        "return document.querySelectorAll('script[type^=\"math/tex\"]').length"
    )
    n_rendered = browser.execute_script(
        "return document.querySelectorAll('.MathJax, .MathJax_Display').length"
    )
    errors = browser.execute_script(
        "return [...document.querySelectorAll('.MathJax_Error, merror')].map(e => e.textContent + ' in: '"
        " + (e.closest('.MathJax, .MathJax_Display, span') || e).parentElement.textContent.slice(0, 200))"
    )
    raw = browser.execute_script(RAW_MATH)
    assert n_tex > 200, f"only {n_tex} formulas found"
    assert n_rendered >= n_tex and errors == [], (n_tex, n_rendered, errors)
    assert raw == [], f"raw TeX left in the page: {raw[:3]}"
    # the reading form's navigation: a table of contents whose links reach their headings, long
    # helper code folded away until asked for, a link to the notebook
    toc = browser.execute_script(
        "return [...document.querySelectorAll('nav.mlbook-toc a[href^=\"#\"]')]"
        ".map(a => !!document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1)))"
        " || !!document.getElementById(a.getAttribute('href').slice(1)))"
    )
    assert len(toc) > 20 and all(toc), toc
    folded = browser.execute_script(
        "return [...document.querySelectorAll('details.mlbook-helper')].map(d => [d.open, "
        "d.querySelector('.jp-InputArea').checkVisibility(), d.querySelector('summary').checkVisibility()])"
    )  # a closed <details> keeps its content's layout box in Chromium, hidden: checkVisibility
    assert len(folded) >= 4 and all(
        not is_open and not code and summary for is_open, code, summary in folded
    ), folded
    assert browser.execute_script(
        "return !!document.querySelector('p.mlbook-download a[download]')"
    )


# --------------------------------------------------------------------------- the student


def _grade_class(course: pathlib.Path, env: dict) -> subprocess.CompletedProcess:
    """`mlbook grade-class --course .` in ``course``, as the instructor types it."""
    return subprocess.run(
        [str(BIN / "mlbook"), "grade-class", "--course", "."],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )


def _answered_copy(work: pathlib.Path) -> pathlib.Path:
    """`mlbook start`'s copy with every answer cell holding the reference answer (a correct student)."""
    run = subprocess.run([str(BIN / "mlbook"), "start", str(work)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    path = work / "rlhf_ppo.ipynb"
    solved = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nbformat.read(layout().solved / "rlhf_ppo.ipynb", as_version=4).cells
        if "nbgrader" in c.metadata
    }
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = solved[meta["grade_id"]]
    nbformat.write(nb, path)
    return path


def _notebook_text(driver) -> str:
    return driver.execute_script("return document.querySelector('.jp-Notebook').textContent")


def _lab_busy(driver) -> bool:
    return driver.execute_script(
        "return [...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'))"
    )


def test_student_runs_all_in_jupyterlab(browser, tmp_path):
    work = tmp_path / "rlhf-ppo-work"
    _answered_copy(work)
    with Server("lab", work, tmp_path / "lab.log") as lab:
        browser.get(lab.url("/lab/tree/rlhf_ppo.ipynb"))
        wait = WebDriverWait(browser, 180, poll_frequency=0.5)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"))
        # The kernel is up (the server says so: JupyterLab's status bar shows no kernel state in
        # headless Chromium) and the notebook is the current widget (Run All acts on the current one).
        wait.until(lambda d: lab.kernels_idle())
        browser.find_element(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .jp-InputPrompt").click()
        # Run > Run All Cells, through the menu as a student would.
        menu = next(
            e
            for e in browser.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
            if e.text.strip() == "Run"
        )
        menu.click()
        wait.until(
            lambda d: d.find_elements(
                By.CSS_SELECTOR, '.lm-Menu-item[data-command="runmenu:run-all"]'
            )
        )
        browser.find_element(
            By.CSS_SELECTOR, '.lm-Menu-item[data-command="runmenu:run-all"]'
        ).click()
        # Run All ends with the "Check your work" cell, the last code cell: its summary means done.
        WebDriverWait(browser, 900, poll_frequency=1).until(
            lambda d: (
                re.search(r"\d+ of \d+ visible checks pass", _notebook_text(d))
                and not _lab_busy(d)
                and lab.kernels_idle()
            )
        )
        prompts = browser.execute_script(
            "return [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim())"
        )
        assert prompts and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), prompts[-5:]
        errors = browser.find_elements(
            By.CSS_SELECTOR, '[data-mime-type="application/vnd.jupyter.error"]'
        )
        assert not errors, errors[0].text[:500]
        text = _notebook_text(browser)
        assert text.count("✓") >= 8, "the check cells did not print their ✓"
        assert re.search(r"\d+ of \d+ visible checks pass", text)
        summary = re.search(r"(\d+) of (\d+) visible checks pass", text)
        assert summary.group(1) == summary.group(2), summary.group(0)
        # The §3.6 figure: the first image after the heading, scrolled into view and captured.
        image = browser.execute_script("""
            const h = [...document.querySelectorAll('.jp-MarkdownCell h3')].find(e => e.textContent.includes('3.6'));
            let cell = h.closest('.jp-Cell');
            while (cell && !cell.querySelector('.jp-OutputArea img')) cell = cell.nextElementSibling;
            const img = cell.querySelector('.jp-OutputArea img');
            img.scrollIntoView({block: 'center'});
            return img;""")
        assert image.get_attribute("naturalWidth") not in (None, "0")
        # The window's screenshot cropped to the figure's box (an element screenshot clips at the
        # wrong place inside JupyterLab's own scrolling panel).
        import io

        from PIL import Image

        def figure_in_view(d):
            """The figure's box once it lies wholly inside the notebook's visible area."""
            return d.execute_script(
                "const img = arguments[0], panel = img.closest('.jp-WindowedPanel-outer') ||"
                " img.closest('.jp-Notebook');"
                "img.scrollIntoView({block: 'center'});"
                "const r = img.getBoundingClientRect(), p = panel.getBoundingClientRect();"
                "return (r.top >= p.top && r.bottom <= p.bottom && r.height > 0) ?"
                " [r.left, r.top, r.right, r.bottom, window.devicePixelRatio] : null;",
                image,
            )

        box = WebDriverWait(browser, 30, poll_frequency=0.5).until(figure_in_view)
        window = Image.open(io.BytesIO(browser.get_screenshot_as_png()))
        figure = window.crop(tuple(round(v * box[4]) for v in box[:4]))
        assert figure.size[0] > 300 and figure.size[1] > 150, figure.size
        darkest, lightest = figure.convert("L").getextrema()
        assert lightest - darkest > 100, "the figure's box is blank"
        shot = tmp_path / "section-3.6.png"
        figure.save(shot)
        out = ROOT / "build" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)  # for a person to look at


# --------------------------------------------------------------------------- the instructor


@pytest.mark.full  # minutes; test_xss.py opens formgrader in make test
def test_instructor_grades_a_written_answer_in_formgrader(browser, tmp_path):
    mlbook = str(BIN / "mlbook")
    course = tmp_path / "course"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert subprocess.run([mlbook, "new-course", str(course)], capture_output=True).returncode == 0
    sub = course / "submitted" / "alice" / "rlhf_ppo"
    sub.mkdir(parents=True)
    shutil.copy(layout().solved / "rlhf_ppo.ipynb", sub / "rlhf_ppo.ipynb")
    (sub / "timestamp.txt").write_text("2026-11-30 12:00:00.000000 UTC")
    run = _grade_class(course, env)
    assert run.returncode == 0, run.stderr[-2000:]

    from nbgrader.api import Gradebook

    gid, comment = "ex5_why_sampler_logp", "Clear about the stale sampler; cite the numbers."
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb_id = gb.find_submission_notebook("rlhf_ppo", "rlhf_ppo", "alice").id
        assert gb.find_student("alice").last_name == "alice"
    with Server("server", course, tmp_path / "server.log") as server:
        browser.get(server.url("/formgrader/manage_students"))
        wait = WebDriverWait(browser, 120, poll_frequency=0.5)
        wait.until(lambda d: "alice" in d.find_element(By.TAG_NAME, "body").text)
        assert "None, None" not in browser.find_element(By.TAG_NAME, "body").text
        browser.get(server.url(f"/formgrader/submissions/{nb_id}/"))
        wait.until(lambda d: d.execute_script(FORMGRADER_READY))  # typed before: not saved
        # An exercise's written answer is extra credit: its nbgrader points are 0, so the score box
        # takes 0 (graded) and the points go in the cell's "extra credit" box.
        score = wait.until(lambda d: d.find_element(By.ID, gid))
        score.clear()
        score.send_keys("0")
        extra = browser.find_element(By.ID, f"{gid}_extra_credit")
        extra.clear()  # leaving the score box saves it: the extra credit after (FORMGRADER_READY)

        def score_saved(_):
            with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
                return gb.find_grade(gid, "rlhf_ppo", "rlhf_ppo", "alice").manual_score == 0

        WebDriverWait(browser, 90, poll_frequency=0.5).until(score_saved)
        extra.send_keys("0.5")
        box = browser.find_element(By.ID, f"{gid}-comment")
        box.clear()
        box.send_keys(comment)
        box.send_keys(
            Keys.TAB
        )  # leaving the comment box fires its change event: formgrader saves both

        def saved(_):
            with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
                grade = gb.find_grade(gid, "rlhf_ppo", "rlhf_ppo", "alice")
                note = gb.find_comment(gid, "rlhf_ppo", "rlhf_ppo", "alice")
                return (
                    grade.manual_score == 0
                    and grade.extra_credit == 0.5
                    and not grade.needs_manual_grade
                    and note.manual_comment == comment
                )

        WebDriverWait(browser, 90, poll_frequency=0.5).until(saved)
        browser.refresh()
        wait.until(
            lambda d: d.find_element(By.ID, f"{gid}_extra_credit").get_attribute("value") == "0.5"
        )
        # "Full credit" on an extra-credit answer gives its maximum (2 for ex3), shown beside its box.
        full = "ex3_whitening_argument"
        heading = wait.until(lambda d: d.find_element(By.ID, full)).find_element(
            By.XPATH, "ancestor::div[contains(@class, 'panel-heading')]"
        )
        assert "(extra credit, up to 2.0)" in heading.text, heading.text
        heading.find_element(By.CSS_SELECTOR, ".full-credit").click()

        def full_credit(_):
            with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
                grade = gb.find_grade(full, "rlhf_ppo", "rlhf_ppo", "alice")
                return (
                    grade.manual_score == 0
                    and grade.extra_credit == 2
                    and not grade.needs_manual_grade
                )

        WebDriverWait(browser, 90, poll_frequency=0.5).until(full_credit)
        # The grading page typesets its math offline (the MathJax the server ships).
        browser.get(server.url(f"/formgrader/submissions/{nb_id}/"))
        WebDriverWait(browser, 90, poll_frequency=0.5).until(
            lambda d: d.execute_script(
                "return !!(window.MathJax && MathJax.isReady && MathJax.Hub.queue.pending === 0)"
            )
        )
        typeset = browser.execute_script(
            "return document.querySelectorAll('.MathJax, .MathJax_Display, .MathJax_SVG').length"
        )
        assert typeset > 100, f"formgrader typeset only {typeset} formulas offline"

    for args in (
        ["generate_feedback", "rlhf_ppo", "--force"],
        ["export", "--to", "grades.csv"],
        ["export", "--exporter", "mlbook_tools.export.WideCsvExport", "--to", "wide.csv"],
    ):
        done = subprocess.run(
            [str(BIN / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
    feedback = course / "feedback" / "alice" / "rlhf_ppo" / "rlhf_ppo.html"
    _offline(browser)
    browser.get(
        feedback.as_uri()
    )  # its math is MathML written into the page: no script to wait for
    WebDriverWait(browser, 60, poll_frequency=0.5).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    assert browser.execute_script("return document.querySelectorAll('math').length") > 100
    body = browser.find_element(By.TAG_NAME, "body").text
    assert comment in body and f"Test {'test_gae_matches_brute_force_and_mc_return'}" in body
    assert f"Student's answer: {gid}" in body
    assert browser.execute_script(RAW_MATH) == []
    rows = list(csv.DictReader((course / "grades.csv").open()))
    auto_extra = sum(
        c.points for c in CHECKS.values() if c.extra
    )  # the graded exercises, all passed
    assert (
        rows[0]["student_id"] == "alice" and float(rows[0]["extra_credit"]) == auto_extra + 0.5 + 2
    )
    wide = list(csv.DictReader((course / "wide.csv").open()))
    assert len(wide) == 1 and wide[0][f"rlhf_ppo:{gid}"] == "0.5"
    assert wide[0]["rlhf_ppo:timestamp"].startswith("2026-11-30T12:00") and "email" in wide[0]
    json.dumps(wide)  # plain strings, ready for an LMS upload


@pytest.mark.full  # a minute: grade-class (nothing run) and formgrader's pages
def test_formgrader_flags_what_grade_class_could_not_grade(browser, tmp_path):
    """A misnamed, an unreadable and a refused submission: formgrader's list, Manual Grading's
    list, the submission page and the feedback page each say which and why (issue 32 item 4)."""
    mlbook = str(BIN / "mlbook")
    course = tmp_path / "course"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert subprocess.run([mlbook, "new-course", str(course)], capture_output=True).returncode == 0
    subs = {s: course / "submitted" / s / "rlhf_ppo" for s in ("alice", "bob", "carol")}
    for folder in subs.values():
        folder.mkdir(parents=True)
        (folder / "timestamp.txt").write_text("2026-11-30 12:00:00.000000 UTC")
    shutil.copy(layout().solved / "rlhf_ppo.ipynb", subs["alice"] / "rlhf_ppo-Copy1.ipynb")
    (subs["bob"] / "rlhf_ppo.ipynb").write_text('{"cells": [')  # cut short: unreadable
    cells = [nbformat.v4.new_code_cell("x = 1") for _ in range(2001)]  # past max_cells: refused
    nbformat.write(nbformat.v4.new_notebook(cells=cells), subs["carol"] / "rlhf_ppo.ipynb")
    run = _grade_class(course, env)
    assert run.returncode == 1, run.stderr[-2000:]  # a misnamed submission is not a success
    assert "REFUSED: too large" in run.stdout and "UNREADABLE: " in run.stdout, run.stdout
    assert "awaiting manual grading" not in run.stdout

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        carol = gb.find_submission_notebook("rlhf_ppo", "rlhf_ppo", "carol").id
    wait = WebDriverWait(browser, 120, poll_frequency=0.5)
    with Server("server", course, tmp_path / "server.log") as server:
        # the token logs in at /formgrader: the login cookie's default path covers every page below
        browser.get(server.url("/formgrader"))
        wait.until(lambda d: "manage_assignments" in d.current_url)
        browser.get(server.url("/formgrader/manage_submissions/rlhf_ppo"))

        def rows(d):
            found = {}
            for tr in d.find_elements(By.CSS_SELECTOR, "#main-table tr"):
                tds = tr.find_elements(By.TAG_NAME, "td")
                if len(tds) > 3 and tds[1].text in subs:
                    found[tds[1].text] = (tds[0].text, tds[3].text, tr)
            return found if len(found) == 3 and all(r[1] for r in found.values()) else None

        table = wait.until(rows)
        for student, kind, words in (
            ("alice", "misnamed", "rlhf_ppo-Copy1.ipynb"),
            ("bob", "unreadable", "not a readable notebook"),
            ("carol", "refused", "too large: 2001"),
        ):
            name, status, _ = table[student]
            assert name == student, name  # no names: the id alone, never "alice," or "None, None"
            assert status.startswith(kind) and words in status and "grade-class" in status, status
            assert "needs" not in status, status  # never "needs autograding"/"needs manual grading"
        # Autograde on the misnamed one: its one-line reason, no traceback
        table["alice"][2].find_element(By.CSS_SELECTOR, ".autograde a").click()
        modal = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#error-modal .modal-body"))
        wait.until(lambda d: "MISNAMED" in modal.text)
        assert "Traceback" not in modal.text and "generate_assignment" not in modal.text
        assert "Rename the notebook to rlhf_ppo.ipynb" in modal.text, modal.text
        # Manual Grading's list: the flag where "needs manual grade" was; written answers' extra credit
        browser.get(server.url("/formgrader/gradebook/rlhf_ppo/rlhf_ppo"))
        shown = wait.until(
            lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#main-table .mlbook-flag")]
        )
        assert len(shown) == 2 and "too large: 2001" in " ".join(shown), shown  # bob and carol
        assert "not a readable notebook" in " ".join(shown), shown
        assert "needs manual grade" not in browser.find_element(By.ID, "main-table").text
        written = browser.find_elements(By.CSS_SELECTOR, "#main-table .written-score")
        assert written and all(w.text == "0 / 6 extra credit" for w in written), [
            w.text for w in written
        ]
        # the submission page says it above the notebook
        browser.get(server.url(f"/formgrader/submissions/{carol}/"))
        banner = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".mlbook-flag"))
        assert banner.text.startswith("REFUSED: too large: 2001") and "grade-class" in banner.text
    done = subprocess.run(
        [str(BIN / "nbgrader"), "generate_feedback", "rlhf_ppo", "--force"],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    _offline(browser)
    for student, kind in (("bob", "unreadable"), ("carol", "refused")):
        browser.get((course / "feedback" / student / "rlhf_ppo" / "rlhf_ppo.html").as_uri())
        body = wait.until(lambda d: d.find_element(By.TAG_NAME, "body")).text
        assert f"Not graded ({kind}):" in body and "hand it in again" in body
        assert "Awaiting manual grading" not in body and "awaiting manual grading" not in body
