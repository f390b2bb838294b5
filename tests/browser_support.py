"""What the browser tests share (not a test module): Debian's headless Chromium through Selenium, its
flags, and a Jupyter server on 127.0.0.1 with a token (test_browser.py, test_xss.py,
test_formgrader_server.py, test_hub.py, test_instructor_paths.py).
"""

import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
BIN = pathlib.Path(sys.executable).parent
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
    # no host but the test's own servers resolves: every page here is served offline
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
# formgrader's grading page (nbgrader's formgrade.js) saves a score or comment on its change event only
# once the page has fetched its grades and comments (each input's view is bound then): what is typed
# before is not saved.
# Each change saves the whole grade (score and extra credit): two saves in flight may arrive in either
# order, the score's overwriting the extra credit's, so a test types the extra credit once the score is
# in the gradebook.
FORMGRADER_READY = (
    "return !!(window.formgrader && formgrader.grades && formgrader.grades.loaded"
    " && formgrader.comments && formgrader.comments.loaded)"
)


def have_chromium() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def chrome(profile: pathlib.Path, performance_log: bool = False):
    """A headless Chromium (``FLAGS``, its own profile folder); the caller quits it.
    ``performance_log``: every request kept, by URL (``driver.get_log("performance")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    if performance_log:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def offline(driver) -> None:
    """No network for the page (file:// and the test's own 127.0.0.1 server excepted)."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*"]})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Jupyter server (``app``: lab, notebook or server; formgrader loads as its extension) on
    127.0.0.1, started in ``folder`` with a token; waited for on enter, stopped on exit.
    ``debug``: every request in its log (a 200 is logged at debug level; ``requests`` reads them)."""

    def __init__(self, app: str, folder: pathlib.Path, log: pathlib.Path, debug: bool = False):
        self.port, self.token = free_port(), os.urandom(12).hex()
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [
            str(BIN / "jupyter"),
            app,
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={folder}",
        ]
        if app == "lab":
            cmd += [
                "--ServerApp.open_browser=False",
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ]
        elif app != "server":
            cmd.append("--ServerApp.open_browser=False")
        if debug:
            cmd.append("--log-level=DEBUG")
        if os.geteuid() == 0:  # CI runs as root
            cmd.append("--allow-root")
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def url(self, path: str, token: bool = True) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}{path}" + (f"{sep}token={self.token}" if token else "")

    def get(self, path: str):
        """(status, headers, body) of a GET with the token; a redirect is answered, not followed."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args):
                return None

        try:
            with urllib.request.build_opener(NoRedirect).open(self.url(path), timeout=60) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def requests(self) -> list[str]:
        """The requests the server logged so far (all of them with ``debug``)."""
        self.log.flush()
        text = pathlib.Path(self.log.name).read_text(errors="replace")
        return [line for line in text.splitlines() if " GET " in line or " POST " in line]

    def kernels_idle(self) -> bool:
        """Every kernel of the server has started and is idle (the server's own REST API)."""
        import json

        with urllib.request.urlopen(self.url("/api/kernels"), timeout=5) as r:
            states = [k["execution_state"] for k in json.load(r)]
        return bool(states) and all(s == "idle" for s in states)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the Jupyter server exited; see its log"
            try:
                with urllib.request.urlopen(self.url("/api/status"), timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)  # polling interval of an explicit wait, not a fixed delay
        raise TimeoutError("the Jupyter server did not answer")

    def __enter__(self):
        self.wait_ready()
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
