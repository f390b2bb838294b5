"""The notebook execution of `make chapter` (`python -m mlbook_tools.execute`) shows where it is.

On a terminal (a pseudo-terminal here) a line per section the kernel reaches; piped (CI, a log),
one line per notebook. Either way it writes what `jupyter nbconvert --to notebook --execute` wrote:
the executed notebook in --output-dir, run in the notebook's own folder, with the caller's
environment (TQDM_DISABLE reaches the kernel), and a failing cell stops it with exit 1.
Its pure parts (the headings, the Makefile's call, what the build records) are test_build.py's (unit).
"""

import os
import pathlib
import pty
import re
import select
import subprocess
import sys

import nbformat
import pytest
from mlbook_tools.config import layout
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

pytestmark = pytest.mark.slow  # starts kernels

EXECUTE = [sys.executable, "-m", "mlbook_tools.execute", "--timeout", "60", "--output-dir", "out"]
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
# progress.enabled() would also be switched on by these: the tests decide by the terminal alone
ENV = {k: v for k, v in os.environ.items() if k not in ("MLBOOK_PROGRESS", "JPY_PARENT_PID")}


def _tiny(folder: pathlib.Path, last: str = "x + 1") -> pathlib.Path:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Tiny\nNo code here."),
            new_code_cell("import os\nx = 1"),
            new_markdown_cell("## 1. First part\nText."),
            new_code_cell("print(os.environ.get('TQDM_DISABLE'), os.getcwd())"),
            new_code_cell(""),  # empty: not counted, not executed
            new_markdown_cell("### 1.1 A subsection"),
            new_code_cell(last),
        ],
        metadata={"kernelspec": KERNELSPEC},
    )
    path = folder / "nbs" / "tiny.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


def _on_a_terminal(cmd, cwd) -> tuple[int, str]:
    """Run ``cmd`` with stdout and stderr on a fresh pseudo-terminal; its exit code and all it wrote."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env={**ENV, "TQDM_DISABLE": "1"},
    )
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def _executed(tmp_path: pathlib.Path, nb: pathlib.Path) -> list:
    out = nbformat.read(tmp_path / "out" / "tiny.ipynb", as_version=4)
    return [c for c in out.cells if c.cell_type == "code" and c.source]


def test_a_terminal_shows_a_line_per_section(tmp_path):
    nb = _tiny(tmp_path)
    rc, text = _on_a_terminal([*EXECUTE, "nbs/tiny.ipynb"], tmp_path)
    assert rc == 0, text
    lines = [ln for ln in text.splitlines() if "tiny: " in ln]
    assert [re.sub(r"^\[\s*\d+s\] ", "", ln) for ln in lines] == [
        "tiny: executing 3 code cells (nbs/tiny.ipynb)",
        "tiny: cell 1/3  Tiny",
        "tiny: cell 2/3  1. First part",
        "tiny: cell 3/3  1.1 A subsection",
    ], text
    assert re.search(r"executed nbs/tiny.ipynb -> out/tiny.ipynb \(\d+ s\)", text), text
    code = _executed(tmp_path, nb)
    # TQDM_DISABLE reached the kernel, which ran in the notebook's folder
    assert code[1].outputs[0]["text"] == f"1 {nb.parent}\n"
    assert code[2].outputs[0]["data"]["text/plain"] == "2"


def _execute_tiny(tmp_path) -> subprocess.CompletedProcess:
    """``mlbook_tools.execute`` on nbs/tiny.ipynb, piped (no terminal)."""
    return subprocess.run(
        [*EXECUTE, "nbs/tiny.ipynb"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_piped_output_has_one_line_per_notebook(tmp_path):
    nb = _tiny(tmp_path)
    run = _execute_tiny(tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    ours = [ln for ln in run.stderr.splitlines() if "tiny" in ln]
    assert len(ours) == 1, run.stderr
    assert ours[0].startswith("executed nbs/tiny.ipynb -> out/tiny.ipynb"), run.stderr
    assert _executed(tmp_path, nb)[1].outputs[0]["text"].startswith("None ")  # none was given


def test_a_failing_cell_stops_with_exit_1(tmp_path):
    _tiny(tmp_path, last="raise ValueError('broken on purpose')")
    run = _execute_tiny(tmp_path)
    assert run.returncode == 1, run.stderr
    assert "error: nbs/tiny.ipynb failed while executing" in run.stderr
    assert "broken on purpose" in run.stderr
    assert not (tmp_path / "out" / "tiny.ipynb").exists()


def test_mlbook_build_shows_a_line_per_stage_when_watched():
    """`mlbook build` (~1 min, silent before): a line per stage when a person watches (here forced with
    MLBOOK_PROGRESS=1, as a terminal or a `!` cell does). Quiet when piped: tests/test_student_work.py."""
    run = subprocess.run(
        [sys.executable, "-m", "mlbook_tools.cli", "build", "--check"],
        cwd=layout().root,
        capture_output=True,
        text=True,
        env={**ENV, "MLBOOK_PROGRESS": "1"},
        timeout=900,
    )
    stages = re.findall(r"^\[\s*\d+s\] (.+)$", run.stderr, re.M)
    assert run.returncode == 0 and len(stages) >= 3, run.stderr
    assert any("generate_assignment" in s for s in stages), stages


def test_the_kernel_runs_encrypted_and_says_no_tcp_warning(tmp_path):
    """`make chapter`'s kernels get CurveZMQ keys from their kernel manager (the kernelspec declares
    curve support): ipykernel's "Kernel is running over TCP without encryption" is not printed, and
    the kernel's own connection file holds the key (not hidden: there is nothing to warn about)."""
    nb = _tiny(
        tmp_path,
        last="import json, ipykernel.connect as c\nprint(bool(json.load(open(c.get_connection_file())).get('curve_publickey')))",
    )
    run = _execute_tiny(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "running over TCP" not in run.stderr, run.stderr
    assert _executed(tmp_path, nb)[2].outputs[0]["text"] == "True\n"


def test_make_chapter_says_what_it_installs_and_ends_on_where_to_look():
    """The first `make chapter` installs .venv (minutes, pip quiet): its first line says so; the last
    line of `make chapter` is where to look, not nbconvert's byte count (`make -n` prints the plan)."""
    env = {k: v for k, v in ENV.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    fresh = subprocess.run(
        ["make", "-n", "-B", "chapter", "VENV=/nonexistent-venv"],
        cwd=layout().root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fresh.returncode == 0, fresh.stderr
    lines = [  # under an outer make (make test) make says where it is: not part of the plan
        ln for ln in fresh.stdout.splitlines() if ln.strip() and not ln.startswith("make[")
    ]
    assert lines[0].startswith("echo") and "installing the pinned environment" in lines[0], lines[
        :3
    ]
    assert lines[-1].startswith("echo") and "open build/rlhf_ppo.html" in lines[-1], lines[-3:]
