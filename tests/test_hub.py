"""The course on a real JupyterHub with nbgrader's exchange, driven in a browser (Chromium, Selenium).

`mlbook hub` sets up one instructor and two students as system users (PAM passwords), the exchange,
the per-role environments and JupyterHub on 127.0.0.1; the test starts the hub and stops it, and
removes the users at the end. The loop, each step asserted:

  instructor (formgrader)  generate + release
  alice (Assignments tab)  fetch; submit half-done; submit again, correct (the resubmission counts)
  instructor (terminal)    sets the due date to now (`nbgrader db assignment add --duedate`), typed
                           in JupyterLab's terminal (File > New > Terminal) as the README says
  bob (Assignments tab)    fetch; submit half-done, late, through a doctored client: nbgrader's
                           submit with its clock an hour before the due date (folder name,
                           timestamp.txt, cache), every mtime backdated
  alice (by hand)          a folder in inbound/ in bob's name, "later", with her notebook
  instructor               collect (formgrader): alice's folder refused and said, bob's own work
                           collected, late by the file system's time (mlbook_tools/exchange.py);
                           `mlbook grade-class --course .` typed in the terminal (the sandbox),
                           formgrader opened from the lab's Nbgrader menu (its table, in the lab's
                           tab), one written answer graded in formgrader, generate + release
                           feedback (formgrader), `nbgrader export` typed in the terminal
  alice, bob (Assignments) fetch feedback, open it: their own scores, nothing of the other's

The notebooks are filled by writing the fetched file as the student would save it (the typing itself
is `tests/test_browser.py`'s). Isolation is checked as each student user: no listing of the exchange's
inbound or feedback folders, no access to the course folder (gradebook, secret, config, submissions),
to the instructor's tooling copy, or to the reference solutions from the student's Python.
Needs root (users, the spawner) and Chromium; skipped otherwise, except under CI (MLBOOK_CI=1).
"""

import csv
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request

import nbformat
import pytest
from browser_support import BIN, FORMGRADER_READY, chrome, have_chromium
from mlbook_tools import hub as H
from mlbook_tools.config import layout
from mlbook_tools.grading import read_scores
from ppo_checks import CORE_MAX

pytestmark = [
    pytest.mark.browser,
    pytest.mark.full,
]  # a hub, its proxy and a browser: minutes; make test-full (CI)

NB = "rlhf_ppo"
TEACH, ALICE, BOB = "mlbteach", "mlbalice", "mlbbob"
WRITTEN = "ex5_why_sampler_logp"

_why = ("needs chromium + chromium-driver" if not have_chromium() else "") or (
    "needs root (system users, the hub's spawner)" if os.geteuid() != 0 else ""
)
if _why:
    if os.environ.get("MLBOOK_CI"):
        raise RuntimeError(f"CI: the hub test {_why}")
    pytest.skip(_why, allow_module_level=True)

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _free_port() -> int:
    """P with P, P+1, P+2 free (the proxy, its API, the hub's own port: `mlbook hub --port P`)."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


def _drop_users():
    for user in (TEACH, ALICE, BOB):
        subprocess.run(
            ["pkill", "-KILL", "-u", user], capture_output=True
        )  # only these test users' processes
        subprocess.run(["userdel", "--remove", user], capture_output=True)


@pytest.fixture(scope="module")
def hub():
    _drop_users()  # a crashed earlier run
    folder = pathlib.Path(tempfile.mkdtemp(prefix="mlbook-hub-", dir="/tmp"))
    folder.chmod(0o755)
    port = _free_port()
    pw = {u: secrets.token_hex(8) for u in (TEACH, ALICE, BOB)}
    pwfile = folder / "passwords.txt"
    pwfile.write_text("".join(f"{u}:{p}\n" for u, p in pw.items()))
    pwfile.chmod(0o600)
    hub = [str(BIN / "mlbook"), "hub", "--dir", str(folder / "hub"), "--instructor", TEACH]
    hub += ["--students", f"{ALICE},{BOB}", "--port", str(port)]
    run = subprocess.run(
        [*hub, "--passwords", str(pwfile), "--setup-only"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    log = (folder / "hub.log").open("w")
    proc = subprocess.Popen(
        hub,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (folder / "hub.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/api/", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the hub did not answer"
                time.sleep(0.5)  # polling interval of an explicit wait
        yield dict(
            dir=folder / "hub",
            port=port,
            pw=pw,
            course=pathlib.Path(f"/home/{TEACH}/rlhf-ppo"),
            log=folder / "hub.log",
        )
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()
        if os.environ.get("MLBOOK_HUB_DEBUG"):
            shutil.copy(folder / "hub.log", os.environ["MLBOOK_HUB_DEBUG"])
        _drop_users()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(request):
    profile = tempfile.mkdtemp(prefix="mlbook-hub-chromium-")
    driver = chrome(pathlib.Path(profile))
    try:
        yield driver
    finally:
        debug = os.environ.get("MLBOOK_HUB_DEBUG")  # a folder: the last page, if the test failed
        if debug:
            driver.save_screenshot(f"{debug}/last.png")
            pathlib.Path(debug, "last.txt").write_text(
                driver.current_url + "\n" + driver.page_source
            )
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# ----------------------------------------------------------------------------------- helpers


def login(driver, hub, user: str, next_path: str) -> None:
    base = f"http://127.0.0.1:{hub['port']}"
    driver.delete_all_cookies()
    driver.get(f"{base}/hub/logout")
    driver.get(f"{base}/hub/login?next={urllib.request.quote(next_path)}")
    wait = WebDriverWait(driver, 60, poll_frequency=0.5)
    wait.until(lambda d: d.find_element(By.ID, "username_input")).send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(hub["pw"][user] + Keys.ENTER)
    WebDriverWait(driver, 240, poll_frequency=0.5).until(
        lambda d: d.current_url.startswith(base + next_path)
    )


def as_user(hub, user, *cmd, cwd=None, check=True):
    run = H.as_user(user, list(cmd), hub["dir"], cwd=cwd, check=False)
    if check:
        assert run.returncode == 0, (
            f"{user}: {' '.join(cmd)}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
        )
    return run


def formgrader_click(driver, icon: str) -> str:
    """Click one of formgrader's per-assignment buttons and wait for its success dialog."""
    wait = WebDriverWait(driver, 240, poll_frequency=0.5)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"tr .glyphicon-{icon}"))[0].click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#success-modal, #error-modal"))
    assert not driver.find_elements(By.ID, "error-modal"), driver.find_element(
        By.TAG_NAME, "body"
    ).text[-2000:]
    said = driver.find_element(By.ID, "success-modal").get_attribute("textContent")
    driver.execute_script(
        "$('#success-modal').modal('hide'); $('#success-modal').remove(); $('.modal-backdrop').remove()"
    )
    return said


def assignment_list(driver) -> None:
    """JupyterLab's Nbgrader menu > Assignment List (nbgrader's Assignments tab)."""
    wait = WebDriverWait(driver, 240, poll_frequency=0.5)
    menu = wait.until(
        lambda d: [
            e
            for e in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel")
            if e.text == "Nbgrader"
        ]
    )
    menu[0].click()
    wait.until(
        lambda d: [
            e
            for e in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
            if e.text == "Assignment List"
        ]
    )[0].click()


def click_button(driver, label: str, timeout: float = 240) -> None:
    """The first enabled button with this text in the Assignments tab (its lists refresh by themselves)."""

    def find(d):
        return [
            b
            for b in d.find_elements(By.CSS_SELECTOR, "button.btn-primary, button.btn")
            if b.text == label and b.is_enabled() and b.is_displayed()
        ]

    WebDriverWait(driver, timeout, poll_frequency=0.5).until(find)[0].click()


def fetch(browser, student: str) -> None:
    """Assignments tab, "Fetch", until the notebook is in the student's home."""
    assignment_list(browser)
    click_button(browser, "Fetch")
    WebDriverWait(browser, 120).until(
        lambda d: pathlib.Path(f"/home/{student}/{NB}/{NB}.ipynb").exists()
    )


def fill(hub, student: str, answers: str) -> None:
    """The fetched notebook with the reference answer in every core answer cell ('all') or the first half."""
    path = pathlib.Path(f"/home/{student}/{NB}/{NB}.ipynb")
    solved = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nbformat.read(layout().solved / f"{NB}.ipynb", as_version=4).cells
        if "nbgrader" in c.metadata
    }
    nb = nbformat.read(path, as_version=4)
    cells = [
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
        and c.cell_type == "code"
        and not c.metadata["nbgrader"]["grade_id"].startswith("ex")
    ]  # the core answers
    for cell in cells if answers == "all" else cells[: len(cells) // 2]:
        cell.source = solved[cell.metadata["nbgrader"]["grade_id"]]
    nbformat.write(nb, path)
    pw = __import__("pwd").getpwnam(student)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def submissions_in_exchange(hub, student):
    return sorted((hub["dir"] / "exchange" / "rlhf-ppo" / "inbound").glob(f"{student}+{NB}+*"))


def feedback_text(driver, hub, student) -> tuple[str, pathlib.Path]:
    """Fetch feedback in the Assignments tab; the fetched page, opened from the student's own server."""
    click_button(driver, "Fetch Feedback")
    home = pathlib.Path(f"/home/{student}/{NB}/feedback")
    WebDriverWait(driver, 120, poll_frequency=0.5).until(lambda d: list(home.glob(f"*/{NB}.html")))
    page = sorted(home.glob(f"*/{NB}.html"))[-1]
    rel = page.relative_to(f"/home/{student}")
    driver.get(f"http://127.0.0.1:{hub['port']}/user/{student}/files/{rel}")
    WebDriverWait(driver, 60, poll_frequency=0.5).until(
        lambda d: "Core:" in d.find_element(By.TAG_NAME, "body").text
    )
    return driver.find_element(By.TAG_NAME, "body").text, page


def lab_menu(driver, top: str, *path: str) -> None:
    """Click JupyterLab's menu bar item ``top``, hover each of ``path[:-1]``, click ``path[-1]``."""
    from selenium.webdriver.common.action_chains import ActionChains

    wait = WebDriverWait(driver, 240, poll_frequency=0.5)

    def item(selector: str, label: str):
        return wait.until(
            lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, selector) if e.text == label]
        )[0]

    item(".lm-MenuBar-itemLabel", top).click()
    for label in path[:-1]:
        ActionChains(driver).move_to_element(item(".lm-Menu-itemLabel", label)).perform()
    item(".lm-Menu-itemLabel", path[-1]).click()


def _prompt_back(text: str) -> bool:
    """The shell prints its prompt again (the command ended): the last line ends with ``$``."""
    return text.rstrip().endswith("$")


def terminal_text(driver) -> str:
    """What the open terminal shows, one line per row (xterm.js's screen-reader rows: the terminal
    draws on a canvas, so the test turns on JupyterLab's own "Screen Reader Mode" setting)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('.jp-Terminal .xterm-accessibility-tree > div')]"
        ".map(e => e.textContent.replace(/\\u00a0/g, ' ').trimEnd()).join('\\n')"
    )


def type_in_terminal(driver, command: str, until, timeout: float = 600) -> str:
    """Type ``command`` and Enter into the focused terminal, as a person does; wait until ``until(text)``."""
    before = terminal_text(driver)
    driver.switch_to.active_element.send_keys(command + Keys.ENTER)
    WebDriverWait(driver, timeout, poll_frequency=1).until(
        lambda d: (t := terminal_text(d)) != before and until(t)
    )
    return terminal_text(driver)


def open_terminal(driver, hub, user: str) -> None:
    """File > New > Terminal in the user's JupyterLab (Screen Reader Mode on: its rows are text)."""
    settings = pathlib.Path(
        f"/home/{user}/.jupyter/lab/user-settings/@jupyterlab/terminal-extension/plugin.jupyterlab-settings"
    )
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('{"screenReaderMode": true}')
    for p in [settings, *settings.parents]:
        if p == pathlib.Path(f"/home/{user}"):
            break
        shutil.chown(p, user, user)
    login(driver, hub, user, f"/user/{user}/lab")
    lab_menu(driver, "File", "New", "Terminal")
    # the focused element can be replaced while it is read (the lab re-renders): read it again
    WebDriverWait(
        driver, 120, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)
    ).until(
        lambda d: (
            d.switch_to.active_element.get_attribute("class") == "xterm-helper-textarea"
            and "$" in terminal_text(d)
        )
    )


def numbers(text: str) -> dict:
    core = re.search(r"Core: ([\d.]+) / ([\d.]+) points", text)
    extra = re.search(r"Extra credit: ([\d.]+) / ([\d.]+) \(optional", text)
    late = re.search(r"Late submission penalty \(Score: -([\d.]+)\)", text)
    return {
        "core": float(core[1]),
        "core_max": float(core[2]),
        "extra": float(extra[1]),
        "extra_max": float(extra[2]),
        "late": float(late[1]) if late else 0.0,
    }


# -------------------------------------------------------------------------------------- the loop


def test_release_fetch_submit_collect_grade_feedback_on_a_hub(hub, browser):
    course, base = hub["course"], f"http://127.0.0.1:{hub['port']}"
    # --- the instructor releases from formgrader
    login(browser, hub, TEACH, f"/user/{TEACH}/formgrader/manage_assignments")
    WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: NB in d.find_element(By.TAG_NAME, "body").text
    )
    formgrader_click(browser, "education")  # generate
    formgrader_click(browser, "cloud-upload")  # release
    outbound = hub["dir"] / "exchange" / "rlhf-ppo" / "outbound" / NB / f"{NB}.ipynb"
    assert outbound.exists()
    released = outbound.read_text()
    assert (
        "NotImplementedError" in released
        and "BEGIN HIDDEN TESTS" not in released
        and "BEGIN SOLUTION" not in released
    )

    # --- alice: fetch, submit half-done, then resubmit correct
    login(browser, hub, ALICE, f"/user/{ALICE}/lab")
    assert not [
        e
        for e in browser.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel")
        if e.text == "Formgrader"
    ]
    fetch(browser, ALICE)
    fill(hub, ALICE, "half")
    click_button(browser, "Submit")
    WebDriverWait(browser, 120).until(lambda d: len(submissions_in_exchange(hub, ALICE)) == 1)
    fill(hub, ALICE, "all")
    time.sleep(
        1.1
    )  # nbgrader's timestamps name the submission folders; two in one second would collide
    click_button(browser, "Submit")
    WebDriverWait(browser, 120).until(lambda d: len(submissions_in_exchange(hub, ALICE)) == 2)

    # --- the due date passes (CLI, as the instructor); bob submits half-done, late
    due_at = int(time.time()) + 2  # whole seconds, strictly after alice's last submission
    due = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due_at))
    # README step 1, typed in the instructor's JupyterLab terminal (File > New > Terminal)
    open_terminal(browser, hub, TEACH)
    typed = type_in_terminal(
        browser, f'nbgrader db assignment add {NB} --duedate="{due}"', until=_prompt_back
    )
    assert "command not found" not in typed, typed
    while time.time() < due_at + 1:  # bob's submission strictly after the due date
        time.sleep(0.2)
    login(browser, hub, BOB, f"/user/{BOB}/lab")
    fetch(browser, BOB)
    fill(hub, BOB, "half")
    # bob's client is doctored: nbgrader's own submit, its clock set an hour before the due date (the
    # inbound folder's name, its timestamp.txt and bob's cache all say "on time"); every mtime backdated
    early = time.strftime("%Y-%m-%d %H:%M:%S.000000 UTC", time.gmtime(due_at - 3600))
    as_user(hub, BOB, "python", "-c", BACKDATED_SUBMIT, early, NB, cwd=f"/home/{BOB}")
    assert len(submissions_in_exchange(hub, BOB)) == 1
    assert early in submissions_in_exchange(hub, BOB)[0].name
    # alice puts a folder in bob's name, "later" than his, with her own notebook in it
    forged = f"{BOB}+{NB}+2099-01-01 00:00:00.000000 UTC+forged"
    exchange = str(hub["dir"] / "exchange")
    as_user(hub, ALICE, "python", "-c", FORGE, forged, NB, exchange, cwd=f"/home/{ALICE}")
    assert len(submissions_in_exchange(hub, BOB)) == 2

    # --- isolation, as each student user
    check_isolation(hub, course)

    # --- the instructor collects (formgrader), grades the class (CLI), grades a written answer
    login(browser, hub, TEACH, f"/user/{TEACH}/formgrader/manage_assignments")
    said = formgrader_click(browser, "cloud-download")  # collect
    assert (course / "submitted" / BOB / NB / "timestamp.txt").exists(), said
    from nbgrader.utils import parse_utc

    stamps = {
        s: parse_utc((course / "submitted" / s / NB / "timestamp.txt").read_text().strip())
        for s in (ALICE, BOB)
    }
    latest = submissions_in_exchange(hub, ALICE)[-1] / f"{NB}.ipynb"
    mine = {s: (course / "submitted" / s / NB / f"{NB}.ipynb").read_text() for s in (ALICE, BOB)}
    assert mine[ALICE] == latest.read_text(), "the resubmission is the one collected"
    # the exchange's facts are the kernel's (mlbook_tools/exchange.py): alice's folder in bob's name
    # is refused and said; bob's work is his; his time is when he handed in, not what his client said
    assert "REFUSED" in said and "forged" in said and "owned by mlbalice" in said, said
    assert mine[BOB] == pathlib.Path(f"/home/{BOB}/{NB}/{NB}.ipynb").read_text()
    due_dt = parse_utc(due)
    assert stamps[ALICE] < due_dt < stamps[BOB], (stamps, due)
    # README step 3, typed in the instructor's terminal as written: it starts in the course folder
    # with the course tools on PATH (a login shell would reset PATH: "command not found")
    open_terminal(browser, hub, TEACH)
    shown = type_in_terminal(
        browser,
        "mlbook grade-class --course .",
        until=lambda t: "graded now" in t and _prompt_back(t),
    )
    if os.environ.get("MLBOOK_HUB_DEBUG"):
        pathlib.Path(os.environ["MLBOOK_HUB_DEBUG"], "grade_class.txt").write_text(shown)
    assert "command not found" not in shown, shown
    assert "2 submissions graded now" in shown.replace("\n", ""), shown
    # the instructor's server is in the cgroups the hub gave it (cgroups.delegate): the sandboxes go under
    # them, so student code may start processes, bounded; grade-class says nothing of "no cgroup"
    assert "no cgroup" not in shown.replace("\n", ""), shown
    server = H.run(["pgrep", "-u", TEACH, "-f", "jupyterhub.singleuser"]).stdout.split()
    assert (
        server and f"mlbook-grader-{TEACH}" in pathlib.Path(f"/proc/{server[0]}/cgroup").read_text()
    )
    # formgrader as an instructor opens it: JupyterLab's Nbgrader menu, in a tab of the lab
    lab_menu(browser, "Nbgrader", "Formgrader")
    frame = WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: [
            f
            for f in d.find_elements(By.CSS_SELECTOR, "iframe")
            if "formgrader" in (f.get_attribute("src") or "")
        ]
    )[0]
    browser.switch_to.frame(frame)
    WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "table")
            and NB in d.find_element(By.TAG_NAME, "body").text
        )
    )
    browser.switch_to.default_content()
    flat = shown.replace("\n", "")  # a long line wraps over rows
    assert BOB in flat and "late by" in flat, shown
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb_id = gb.find_submission_notebook(NB, NB, ALICE).id
        penalty = {
            s: gb.find_submission_notebook(NB, NB, s).late_submission_penalty for s in (ALICE, BOB)
        }
        bob_score = gb.find_submission_notebook(NB, NB, BOB).score
    assert (
        penalty[ALICE] is None
        and penalty[BOB] == pytest.approx(round(0.1 * bob_score, 4))
        and bob_score > 0
    )
    browser.get(f"{base}/user/{TEACH}/formgrader/submissions/{nb_id}/")
    wait = WebDriverWait(browser, 120, poll_frequency=0.5)
    wait.until(lambda d: d.execute_script(FORMGRADER_READY))  # typed before: not saved
    box = wait.until(lambda d: d.find_element(By.ID, WRITTEN))
    box.clear()
    box.send_keys("0")
    extra = browser.find_element(By.ID, f"{WRITTEN}_extra_credit")
    extra.clear()  # leaving the score box saves it: the extra credit after (FORMGRADER_READY)

    def score_saved(_):
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            return gb.find_grade(WRITTEN, NB, NB, ALICE).manual_score == 0

    WebDriverWait(browser, 90, poll_frequency=0.5).until(score_saved)
    extra.send_keys("1" + Keys.TAB)

    def saved(_):
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            g = gb.find_grade(WRITTEN, NB, NB, ALICE)
            return g.manual_score == 0 and g.extra_credit == 1 and not g.needs_manual_grade

    WebDriverWait(browser, 90, poll_frequency=0.5).until(saved)
    browser.get(f"{base}/user/{TEACH}/formgrader/manage_assignments")
    formgrader_click(browser, "comment")  # generate feedback
    formgrader_click(browser, "envelope")  # release feedback
    open_terminal(browser, hub, TEACH)  # README step 4, typed
    typed = type_in_terminal(browser, "nbgrader export --to grades.csv", until=_prompt_back)
    assert "command not found" not in typed and (course / "grades.csv").exists(), typed
    rows = {r["student_id"]: r for r in csv.DictReader((course / "grades.csv").open())}

    # --- each student fetches feedback: their own scores, and nothing of the other's
    seen = {}
    for student, other in ((ALICE, BOB), (BOB, ALICE)):
        login(browser, hub, student, f"/user/{student}/lab")
        assignment_list(browser)
        text, page = feedback_text(browser, hub, student)
        html = page.read_text()
        assert other not in html and "BEGIN HIDDEN TESTS" not in html
        seen[student] = numbers(text)
        assert list((hub["dir"] / "exchange" / "rlhf-ppo" / "feedback").iterdir())  # released there
    for student in (ALICE, BOB):
        book = read_scores(course / "gradebook.db", NB, student)
        row = rows[student]
        fb = seen[student]
        # nbgrader's raw_score is the core score before the late penalty, stated apart in the feedback.
        assert (
            (fb["core"], fb["core_max"])
            == (book["score"], book["max_score"])
            == (float(row["raw_score"]), float(row["max_score"]))
        )
        assert (
            (fb["extra"], fb["extra_max"])
            == (book["extra_credit"]["score"], book["extra_credit"]["max_score"])
            == (float(row["extra_credit"]), float(row["extra_credit_max"]))
        )
        assert fb["late"] == pytest.approx(
            float(row["late_submission_penalty"]), abs=0.01
        )  # stated apart, the same
    # the correct resubmission counts
    assert seen[ALICE]["core"] == CORE_MAX and seen[ALICE]["late"] == 0
    assert seen[BOB]["core"] < CORE_MAX and seen[BOB]["late"] == pytest.approx(
        penalty[BOB], abs=0.01
    )
    assert seen[ALICE]["extra"] >= 1  # the written answer graded in formgrader


# A doctored client (run as bob): nbgrader's own `nbgrader submit`, its clock set to argv[1], then
# every mtime in the new inbound folder set back to that time too (utime: the owner may).
BACKDATED_SUBMIT = """
import calendar, os, sys, time
from nbgrader.exchange.abc import exchange
from nbgrader.exchange.default.submit import ExchangeSubmit
early, nb = sys.argv[1], sys.argv[2]
exchange.Exchange.set_timestamp = lambda self: setattr(self, "timestamp", early)
copy_files = ExchangeSubmit.copy_files
def doctored(self):
    copy_files(self)
    t = calendar.timegm(time.strptime(early, "%Y-%m-%d %H:%M:%S.000000 UTC"))
    folder = os.path.join(self.inbound_path, self.assignment_filename)
    for p in [os.path.join(folder, f) for f in os.listdir(folder)] + [folder]:
        os.utime(p, (t, t))
ExchangeSubmit.copy_files = doctored
from nbgrader.apps.nbgraderapp import NbGraderApp
NbGraderApp.launch_instance(argv=["submit", nb])
"""

# alice, by hand: a folder in bob's name (argv[1]) holding her own notebook and a timestamp.txt
FORGE = """
import os, shutil, sys
name, nb, exchange = sys.argv[1:4]
folder = os.path.join(exchange, "rlhf-ppo", "inbound", name)
os.mkdir(folder)
shutil.copy(os.path.join(nb, nb + ".ipynb"), folder)
with open(os.path.join(folder, "timestamp.txt"), "w") as fh:
    fh.write(name.split("+")[2])
"""


def check_isolation(hub, course: pathlib.Path) -> None:
    exchange = hub["dir"] / "exchange" / "rlhf-ppo"
    secret_paths = [
        course / "gradebook.db",
        course / "grading_secret.txt",
        course / "nbgrader_config.py",
        course / "source" / NB / f"{NB}.ipynb",
        hub["dir"] / "instructor" / "checkout" / "tests" / "ppo_checks.py",
    ]
    for student, other in ((ALICE, BOB), (BOB, ALICE)):
        probe = (
            "import os, sys\n"
            "bad = []\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        (os.listdir if os.path.isdir(p) or p.endswith('/') else lambda q: open(q).read(1))(p.rstrip('/'))\n"
            "        bad.append(p)\n"
            "    except OSError:\n"
            "        pass\n"
            "try:\n"
            "    import mlbook_solutions; bad.append('mlbook_solutions')\n"
            "except ImportError:\n"
            "    pass\n"
            "print(repr(bad))\n"
        )
        targets = [
            f"{exchange}/inbound/",
            f"{exchange}/feedback/",
            f"{course}/",
            f"/home/{other}/",
            f"{hub['dir']}/instructor/",
            *map(str, secret_paths),
        ]
        run = as_user(hub, student, "python", "-c", probe, *targets)
        assert run.stdout.strip() == "[]", f"{student} could read: {run.stdout}"
