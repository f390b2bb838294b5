"""A student's work is never an output: no command that writes notebooks overwrites an answer.

The README sends students to work in their own copy (``mlbook start``, outside the checkout). Here:
answers typed there survive ``mlbook build`` and the file-writing parts of ``make chapter`` byte for
byte; and a release notebook in the checkout that is not byte for byte what the build wrote (an
answer with the stub line commented out or left after ``return``, a note in a markdown cell, an
answer in the ``.py`` form) makes ``mlbook build``, ``mlbook build --check`` and ``make notebooks``
(the path ``make chapter`` takes) refuse, writing nothing, with advice that replaces no file.
Those edits are made in a copy of the checkout (fixture ``checkout``): the real one is never edited.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jupytext
import pytest
from mlbook_tools.config import layout
from mlbook_tools.workcopy import MANIFEST, read_manifest
from ppo_checks import CORE_MAX

pytestmark = pytest.mark.slow

ROOT = layout().root
MLBOOK = [sys.executable, "-m", "mlbook_tools.cli"]
ANSWER = "    return rewards * 0.0  # my own answer"


def _fill(text: str, grade_id: str = "gae") -> str:
    """The release notebook's text with the stub of ``grade_id`` replaced by an answer."""
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            src = "".join(cell["source"])
            lines = [ANSWER if "raise NotImplementedError" in ln else ln for ln in src.split("\n")]
            cell["source"] = "\n".join(lines)
            return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    raise AssertionError(f"no cell {grade_id}")


def _run(cmd, cwd=ROOT):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture
def checkout(tmp_path) -> pathlib.Path:
    """A copy of the checkout (its files; the same .venv) for a test that edits generated
    files: the commands run there find it as their checkout, and the real one, which tests on other
    pytest-xdist workers read meanwhile, is never edited."""
    skip = {".git", ".venv", "build", "node_modules", "__pycache__", ".ruff_cache", ".pytest_cache"}
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=lambda folder, names: [n for n in names if n in skip])
    # dated before the .venv's install stamp: make sees the shared .venv as installed from them
    stamp = (ROOT / ".venv" / ".installed").stat().st_mtime - 1
    for path in (copy, *copy.rglob("*")):
        os.utime(path, (stamp, stamp))
    (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


def test_start_copies_the_release_and_never_overwrites(tmp_path):
    work = tmp_path / "rlhf-ppo-work"
    run = _run([*MLBOOK, "start", str(work)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    nb = work / "rlhf_ppo.ipynb"
    assert nb.read_bytes() == (layout().release / "rlhf_ppo.ipynb").read_bytes()
    assert sorted(work.iterdir()) == [nb]  # nothing the student did not ask for
    assert "jupytext" not in json.loads(nb.read_text())["metadata"]  # no paired .py on first save
    filled = _fill(nb.read_text()).encode()
    nb.write_bytes(filled)
    again = _run([*MLBOOK, "start", str(work)], cwd=tmp_path)
    assert again.returncode == 0 and "kept your" in again.stdout, again.stdout + again.stderr
    assert nb.read_bytes() == filled
    inside = _run([*MLBOOK, "start", str(ROOT / "chapters" / "mine")])
    assert inside.returncode == 1 and "inside the checkout" in inside.stderr
    assert "Traceback" not in inside.stderr


def test_answers_in_the_work_folder_survive_build_and_make(tmp_path):
    """Fill a stub where the README says to work; the commands that write files leave it byte for byte."""
    work = tmp_path / "rlhf-ppo-work"
    assert _run([*MLBOOK, "start", str(work)]).returncode == 0
    nb = work / "rlhf_ppo.ipynb"
    nb.write_text(_fill(nb.read_text()))
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    # `make chapter` = train (writes build/) + html (mlbook build, then nbconvert into build/): the
    # build is what writes notebooks; training and nbconvert write only under build/.
    build = _run([*MLBOOK, "build", "--no-execute"])
    assert build.returncode == 0, build.stdout + build.stderr
    dry = _run(["make", "-n", "chapter"])
    assert str(work) not in dry.stdout and "rlhf-ppo-work" not in dry.stdout
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before


def _edit(text: str, how: str) -> str:
    """The release notebook's text with one edit a student makes (none leaves a stub-free answer cell)."""
    nb = json.loads(text)
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        src = "".join(cell["source"])
        if how == "markdown" and gid == "00_intro-0":
            cell["source"] = src + "\n\nMy note: the KL term keeps the policy near the reference."
        elif gid == "gae" and how in ("commented", "after-return"):
            stub = next(ln for ln in src.split("\n") if "raise NotImplementedError" in ln)
            answer = "    return rewards * 0.0, values * 0.0  # my own answer"
            if how == "commented":
                new = answer + "\n    # " + stub.strip()
            else:
                new = answer + "\n" + stub
            cell["source"] = src.replace(stub, new)
        else:
            continue
        return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how,suffix",
    [
        ("commented", ".ipynb"),  # each one an `mlbook build`: the others in make test-full (CI)
        pytest.param("after-return", ".ipynb", marks=pytest.mark.full),
        pytest.param("markdown", ".ipynb", marks=pytest.mark.full),
        pytest.param("commented", ".py", marks=pytest.mark.full),
    ],
)
def test_build_refuses_to_overwrite_work_in_the_release(how, suffix, checkout):
    """Any edit of a generated file stops every writer before it writes anything; the advice is safe."""
    path = layout(checkout).release / f"rlhf_ppo{suffix}"
    release = {p: p.read_bytes() for p in layout(checkout).release.iterdir() if p.is_file()}
    ipynb = _edit((layout(checkout).release / "rlhf_ppo.ipynb").read_text(), how)
    assert "raise NotImplementedError" in ipynb  # a stub-text heuristic would call this untouched
    filled = (
        ipynb
        if suffix == ".ipynb"
        else jupytext.writes(jupytext.reads(ipynb, "ipynb"), "py:percent")
    )
    path.write_text(filled)
    for cmd in ([*MLBOOK, "build"], [*MLBOOK, "build", "--check"], ["make", "notebooks"]):
        run = _run(cmd, cwd=checkout)
        out = run.stdout + run.stderr
        assert run.returncode != 0, f"{cmd} did not refuse:\n{out}"
        assert f"rlhf_ppo{suffix}: not what `mlbook build` wrote" in out, out
        shown = out.split(": not what")[0].rsplit("refused: ", 1)[-1].split(", ")
        assert len(shown) == len(set(shown)), out  # each edited file named once
        assert "Traceback" not in out and not re.search("^wrote ", out, re.M), out
        assert (
            "mv " not in out and "cp -n " in out and "rlhf-ppo-work/rlhf_ppo-from-checkout" in out
        ), out
        assert path.read_text() == filled
        for p, data in release.items():
            if p != path:
                assert p.read_bytes() == data, f"{cmd} wrote {p}"


def test_manifest_lists_every_generated_file_and_check_catches_a_stale_one(checkout):
    """The fingerprints beside the outputs are exact, and `mlbook build --check` compares them too."""
    manifest = read_manifest()
    assert "chapters/rlhf_ppo.ipynb" in manifest and "chapters/rlhf_ppo.py" in manifest
    assert any(p.startswith("solutions/notebooks/") for p in manifest)
    assert any(p.startswith("autograde/source/") for p in manifest)
    import hashlib

    for rel, digest in manifest.items():
        assert hashlib.sha256((ROOT / rel).read_bytes()).hexdigest() == digest, rel
    path = layout(checkout).release / MANIFEST
    path.write_text(path.read_text() + f"{'0' * 64}  chapters/removed_long_ago.ipynb\n")
    run = _run([*MLBOOK, "build", "--check"], cwd=checkout)
    assert run.returncode == 1 and f"chapters/{MANIFEST}" in run.stdout, run.stdout + run.stderr


def test_student_dist_refuses_to_replace_a_folder_with_answers(tmp_path):
    out = tmp_path / "dist"
    out.mkdir()
    nb = out / "rlhf_ppo.ipynb"
    nb.write_text(_fill((layout().release / "rlhf_ppo.ipynb").read_text()))
    before = nb.read_bytes()
    run = _run([*MLBOOK, "student-dist", "--out", str(out)])
    assert run.returncode == 1 and "refused:" in run.stderr, run.stderr
    assert "did not write (rlhf_ppo.ipynb)" in run.stderr, run.stderr
    assert nb.read_bytes() == before and sorted(out.iterdir()) == [nb]


def test_commands_find_the_checkout_from_any_folder(tmp_path):
    """`mlbook` run by its full path in a folder outside the checkout, no MLBOOK_ROOT: no traceback."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "MLBOOK_ROOT"}
    env["PATH"] = "/usr/bin:/bin"  # not activated: nbgrader's `alembic` must still be found
    mlbook = str(pathlib.Path(sys.executable).parent / "mlbook")
    course = tmp_path / "course"
    run = subprocess.run(
        [mlbook, "new-course", str(course)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert (course / "nbgrader_config.py").exists()
    assert (course / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb").exists()
    missing = subprocess.run(
        [mlbook, "grade", "nothing.ipynb"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert "nothing.ipynb" in missing.stderr


# ------------------------------------------------------------------------------------- hand-in


def _solved_copy(path: pathlib.Path) -> bytes:
    """The release with every answer cell holding the reference answer (what a full-marks student saves)."""
    nb = json.loads((layout().release / "rlhf_ppo.ipynb").read_text())
    solved = {
        c["id"]: c for c in json.loads((layout().solved / "rlhf_ppo.ipynb").read_text())["cells"]
    }
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
            cell["source"] = solved[cell["id"]]["source"]
    data = (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()
    path.write_bytes(data)
    return data


def test_handin_writes_exactly_the_saved_file_under_the_course_name(tmp_path):
    """A copy named rlhf_ppo-Copy1.ipynb with full answers: the visible checks pass, and the file to
    upload is the saved bytes under the name the course expects; an earlier upload is kept."""
    nb = tmp_path / "rlhf_ppo-Copy1.ipynb"
    data = _solved_copy(nb)
    (tmp_path / "to-upload").mkdir()
    (tmp_path / "to-upload" / "rlhf_ppo.ipynb").write_text("{}")
    run = _run([*MLBOOK, "handin", str(nb)], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (
        "the course expects the name rlhf_ppo.ipynb; this file is rlhf_ppo-Copy1.ipynb"
        in run.stdout
    )
    # one count with the Check your work cell: a check that needs the run is in the total, said apart
    counted = re.search(r"(\d+) of (\d+) visible checks pass(?:, (\d+) not run here)?", run.stdout)
    assert "✗" not in run.stdout and counted, run.stdout
    passed, total, not_run = (int(g or 0) for g in counted.groups())
    assert passed + not_run == total and "fail" not in run.stdout.split("wrote")[-1], run.stdout
    assert "cell " not in run.stdout.replace("Check your work cell", ""), (
        run.stdout
    )  # names, not numbers
    assert (tmp_path / "to-upload" / "rlhf_ppo.ipynb").read_bytes() == data
    assert len(list((tmp_path / "to-upload").glob("rlhf_ppo.earlier-*.ipynb"))) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rlhf_ppo-Copy1.ipynb", "to-upload"]


@pytest.mark.parametrize("damage", ["truncated", "duplicate", "syntax"])
def test_handin_refuses_a_damaged_notebook_and_writes_nothing(tmp_path, damage):
    nb = tmp_path / "rlhf_ppo.ipynb"
    text = (layout().release / "rlhf_ppo.ipynb").read_text()
    if damage == "truncated":
        text = text[: len(text) // 2]
    else:
        doc = json.loads(text)
        i = next(
            i
            for i, c in enumerate(doc["cells"])
            if c["metadata"].get("nbgrader", {}).get("grade_id") == "gae"
        )
        if damage == "duplicate":  # a second copy of gae's test cell (a split answer is fine)
            t = next(
                j
                for j, c in enumerate(doc["cells"])
                if c["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("test_gae")
            )
            doc["cells"].insert(t + 1, dict(doc["cells"][t], id="gae-test-copy"))
        else:
            doc["cells"][i]["source"] = "def gae(rewards, values:\n    return rewards\n"
        text = json.dumps(doc)
    nb.write_text(text)
    run = _run([*MLBOOK, "handin", str(nb)], cwd=tmp_path)
    assert run.returncode == 1 and "nothing was written" in run.stderr, run.stdout + run.stderr
    expected = {
        "truncated": "not a readable notebook",
        "duplicate": "appears twice (delete the copy)",
        "syntax": "'gae' has a syntax error, line 1",
    }[damage]
    assert expected in run.stderr and "Traceback" not in run.stderr, run.stderr
    if damage == "syntax":  # how to hand in the rest
        assert "comment that cell's code out" in run.stderr, run.stderr
    assert not (tmp_path / "to-upload").exists()


def test_handin_in_a_cell_refuses_answers_the_file_does_not_hold(tmp_path):
    """In the kernel: a gae edited (or saved) but not both saved and run is named; nothing written."""
    from mlbook.handin import CannotHandIn, handin, unsaved_answers

    nb = tmp_path / "rlhf_ppo.ipynb"
    _solved_copy(nb)
    doc = json.loads(nb.read_text())
    saved = {
        c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
        for c in doc["cells"]
        if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"
    }
    assert unsaved_answers(doc, list(saved.values())) == []
    assert (
        unsaved_answers(doc, [*saved.values(), "# a comment is no change\n" + saved["gae"]]) == []
    )
    edited = saved["gae"].replace("return ", "return 2 * ", 1)
    assert unsaved_answers(doc, [*saved.values(), edited]) == ["gae"]
    with pytest.raises(CannotHandIn, match="disagree about gae: save"):
        handin(nb, namespace={"In": [*saved.values(), edited]})
    assert not (tmp_path / "to-upload").exists()


# ------------------------------------------------------------------------------------ progress


@pytest.mark.full  # two builds and a grading: make test-full (CI); test_progress.py in make test
def test_long_commands_print_a_line_per_stage_only_when_watched():
    """Quiet when captured (CI, logs); a line per stage on a terminal or in a notebook's `!` cell."""
    import os

    quiet_env = {
        k: v for k, v in os.environ.items() if k not in ("MLBOOK_PROGRESS", "JPY_PARENT_PID")
    }
    quiet = subprocess.run(
        [*MLBOOK, "build", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=quiet_env,
        timeout=900,
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = subprocess.run(
        [*MLBOOK, "build", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**quiet_env, "MLBOOK_PROGRESS": "1"},
        timeout=900,
    )
    stages = re.findall(r"^\[\s*\d+s\] (.+)$", loud.stderr, re.M)
    assert loud.returncode == 0 and len(stages) >= 3, loud.stderr
    assert any("generate_assignment" in s for s in stages), stages
    cell = subprocess.run(
        [*MLBOOK, "grade", str(layout().release / "rlhf_ppo.ipynb")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**quiet_env, "JPY_PARENT_PID": "1"},
        timeout=900,
    )
    stages = re.findall(r"^\[\s*\d+s\] (.+)$", cell.stderr, re.M)
    assert (
        len(stages) == 2 and stages[0].startswith("grading ") and stages[1].startswith("graded in")
    )
    assert f"core total: 0 / {CORE_MAX:g}" in cell.stdout and "[" not in cell.stdout.split("\n")[0]


def test_readme_student_section_covers_root_and_a_clean_checkout():
    """What a new student trips over, said where they read: --allow-root, `make env` after git clean,
    CPU-only torch for a graded course on Linux, and how to hand in."""
    readme = (ROOT / "README.md").read_text()
    students = readme[readme.index("## Students") : readme.index("## Instructors")]
    assert "--allow-root" in students
    assert "git clean -fdx" in students and "make env" in students.split("git clean -fdx")[1][:200]
    assert (
        "--index-url https://download.pytorch.org/whl/cpu" in students
        and "macOS and Windows" in students
    )
    assert "mlbook handin" in students and "mlbook.handin" in students
    assert "holds answers" not in students and " mv " not in students


def test_student_dist_never_ships_an_edited_release(tmp_path, checkout):
    path = (
        layout(checkout).course / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb"
    )  # what the dist releases
    path.write_text(_edit(path.read_text(), "markdown"))
    run = _run([*MLBOOK, "student-dist", "--out", str(tmp_path / "dist")], cwd=checkout)
    assert run.returncode == 1 and "not what `mlbook build` wrote" in run.stderr, run.stderr
    assert not (tmp_path / "dist").exists()


def test_the_self_paced_lab_has_no_instructor_menus_and_no_exchange(tmp_path):
    """Issue 32: a self-paced student's lab showed nbgrader's Formgrader, Create Assignment and Course
    List menus and warned about a missing exchange. The command `mlbook start` prints opens a lab with
    those plugins and server extensions off (Validate kept)."""
    import os
    import socket
    import time
    import urllib.error
    import urllib.request

    work = tmp_path / "rlhf-ppo-work"
    started = _run([*MLBOOK, "start", str(work)])
    command = [ln for ln in started.stdout.splitlines() if ln.startswith("work there: ")]
    assert command and "JUPYTER_CONFIG_PATH=" in command[0], started.stdout
    assert command[0].split(" lab ")[1].split()[0] == "rlhf_ppo.ipynb", (
        command
    )  # opens the notebook
    assert ("--allow-root" in command[0]) == (os.geteuid() == 0), command  # runs as printed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = os.urandom(8).hex()
    extra = f" --no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_CONFIG")}
    log = (tmp_path / "lab.log").open("w")
    lab = subprocess.Popen(
        [
            "bash",
            "-c",
            command[0][len("work there: ") :] + extra,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def get(path):
        url = f"http://127.0.0.1:{port}{path}?token={token}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, ""

    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # an explicit wait for the server, not a fixed sleep
            assert lab.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
            try:
                if get("/api/status")[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        status, page = get("/lab")
        assert status == 200
        config = json.loads(
            re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1)
        )
        off = config.get("disabledExtensions", [])  # JupyterLab's page config: a list of ids
        off = [k for k, v in off.items() if v] if isinstance(off, dict) else off
        for plugin in ("formgrader", "course-list", "create-assignment", "assignment-list"):
            assert f"@jupyter/nbgrader:{plugin}" in off, off
        assert get("/formgrader")[0] == 404  # formgrader's server extension is off too
        # a kernel started in this lab gets CurveZMQ keys (its connection file holds them), so
        # ipykernel has no "running over TCP without encryption" to warn about
        from jupyter_core.paths import jupyter_runtime_dir

        start = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/kernels",
            data=b'{"name": "python3"}',
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(start, timeout=60) as r:
            kernel = json.load(r)["id"]
        connection = pathlib.Path(jupyter_runtime_dir()) / f"kernel-{kernel}.json"
        assert json.loads(connection.read_text()).get("curve_publickey"), connection
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, 15)
            lab.wait(30)
        log.close()
    said = (tmp_path / "lab.log").read_text()
    assert "Loading the formgrader" not in said and "exchange" not in said.lower(), said[-3000:]
    assert "running over TCP" not in said, said[-3000:]
