"""The student distribution leaks nothing, and the released notebook runs with only it installed.

``mlbook student-dist`` writes the library wheel, the released notebook, the student lock and a short
README. Here: (0) its requirements are requirements/student.txt, which is exactly what ``make
student-lock`` derives from the developer lock, and a real ``pip install`` of the folder into a fresh
venv installs no developer tool and no CUDA package (torch resolves to the CPU build); (1) no file in it holds a solution region of the source notebook, a hidden test, nbgrader's
markers, the source notebook or the reference package; (2) a fresh virtual environment with the wheel
installed (third-party packages borrowed read-only from this environment's site-packages, which are
NOT processed as a site dir, so the editable mlbook_solutions / mlbook_tools / mlbook installs of this
checkout stay invisible) runs the released notebook, from a folder holding nothing else, up to its
first stub, where it must stop with NotImplementedError and nothing earlier.
"""

import json
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import nbformat
import pytest
from mlbook_tools.config import layout
from mlbook_tools.dist import DEV_TOOLS, student_dist, student_lock
from mlbook_tools.excerpt import MARKERS
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

pytestmark = pytest.mark.slow

NB = "rlhf_ppo.ipynb"


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    return student_dist(tmp_path_factory.mktemp("dist") / "student")


def _texts(folder):
    """(name, text) of every file, wheel members included."""
    for path in sorted(folder.iterdir()):
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as whl:
                for member in whl.namelist():
                    yield f"{path.name}:{member}", whl.read(member).decode("utf-8", "replace")
        else:
            yield path.name, path.read_text()


def _regions():
    """The substantial lines of every solution and hidden-test region of the nbgrader source notebook."""
    source = nbformat.read(layout().course / "source" / "rlhf_ppo" / NB, as_version=4)
    regions, current = [], None
    for cell in source.cells:
        for line in cell.source.splitlines():
            stripped = line.strip()
            if stripped in MARKERS:
                current = [] if stripped.startswith("### BEGIN") else None
                if current is not None:
                    regions.append(current)
            elif (
                current is not None
                and len(stripped) >= 25
                and not stripped.startswith(("#", "import ", "from "))
            ):
                current.append(stripped)
    return [r for r in regions if len(r) >= 2]


def test_student_lock_is_derived_from_the_dev_lock():
    """requirements/student.txt is what `make student-lock` writes now: same versions as lock.txt."""
    committed = (layout().root / "requirements" / "student.txt").read_text()
    assert committed == student_lock(), "requirements/student.txt is stale: run `make student-lock`"
    names = {line.split("==")[0] for line in committed.splitlines() if "==" in line}
    assert {"torch", "numpy", "matplotlib", "tqdm", "jupyterlab", "ipykernel"} <= names
    assert not names & set(DEV_TOOLS), names & set(DEV_TOOLS)
    assert all("==" in line for line in committed.splitlines() if not line.startswith("#"))


def test_dist_readme_says_how_to_install_cpu_torch(dist):
    readme = (dist / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "macOS and Windows" in readme and "--allow-root" in readme
    assert "python -m mlbook.handin" in readme
    assert (dist / "requirements.txt").read_bytes() == (
        layout().root / "requirements" / "student.txt"
    ).read_bytes()
    assert "jupytext" not in json.loads((dist / NB).read_text())["metadata"]


@pytest.mark.slow
@pytest.mark.full  # a fresh venv and a pip install: make test-full (CI)
def test_dist_installs_without_dev_tools_or_cuda(dist, tmp_path):
    """What the README says, in a fresh venv: pip resolves the student lock plus the wheel. Here the
    torch pin resolves to the local CPU wheel, as --index-url .../whl/cpu does on a Linux laptop."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    wheel = next(dist.glob("mlbook-*.whl"))
    run = subprocess.run(
        [*pip, "install", "--quiet", "-r", str(dist / "requirements.txt"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    listed = subprocess.run(
        [*pip, "list", "--format=json"], capture_output=True, text=True, check=True
    )
    installed = {
        d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listed.stdout)
    }
    assert "mlbook" in installed and "jupyterlab" in installed and "ipykernel" in installed
    assert not set(DEV_TOOLS) & set(installed), set(DEV_TOOLS) & set(installed)
    cuda = sorted(n for n in installed if n.startswith(("nvidia-", "triton", "cuda-")))
    assert not cuda, cuda
    assert installed["torch"].startswith("2.13.0"), installed["torch"]
    pins = dict(
        line.split("==")
        for line in (dist / "requirements.txt").read_text().splitlines()
        if "==" in line
    )
    unpinned = {n: v for n, v in installed.items() if pins.get(n) != v.split("+")[0]}
    # pip's own and torch's build-time setuptools aside, nothing comes in unpinned (an extra's needs too)
    assert set(unpinned) <= {"mlbook", "pip", "setuptools"}, unpinned


def test_dist_holds_only_the_library_and_the_release(dist):
    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        n for n in names if n in {NB, "requirements.txt", "README.md"} or n.endswith(".whl")
    ]
    with zipfile.ZipFile(next(dist.glob("mlbook-*.whl"))) as whl:
        packages = {
            m.split("/")[0] for m in whl.namelist() if not m.split("/")[0].endswith(".dist-info")
        }
    assert packages == {"mlbook"}, packages
    regions = _regions()
    assert len(regions) >= 10, (
        "the source notebook should have solution and hidden-test regions to look for"
    )
    for name, text in _texts(dist):
        for package in (
            "mlbook_solutions",
            "mlbook_tools",
        ):  # prose may name them; no code may need them
            assert f"import {package}" not in text and f"from {package}" not in text, (
                f"{name} imports {package}"
            )
        for marker in MARKERS:
            assert marker not in text, f"{name} contains {marker!r}"
        assert "def check_" not in text and "ppo_checks" not in text, (
            f"{name} contains hidden-test code"
        )
        for region in regions:  # a stray common line may match; half of a region may not
            found = [line for line in region if line in text]
            assert len(found) < max(2, len(region) / 2), (
                f"{name} contains a solution or hidden test: {found[:3]}"
            )


def test_the_dist_notebook_speaks_to_a_course_student(dist):
    """The course's release (autograde/source), not the self-paced copy in chapters/: no checkout,
    no `mlbook start`, no grade command; saving, checking and handing in are said for a course."""
    nb = nbformat.read(dist / NB, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    for phrase in ("mlbook start", "chapters/", "git clone", "mlbook grade", "checkout"):
        assert phrase not in text, f"the dist's notebook tells a course student {phrase!r}"
    for phrase in ("Assignments tab", "to-upload/rlhf_ppo.ipynb", "Check your work", "Ctrl+S"):
        assert phrase in text, f"the dist's notebook lacks {phrase!r}"


def test_release_runs_to_its_first_stub_with_only_the_dist(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with zipfile.ZipFile(next(dist.glob("mlbook-*.whl"))) as whl:
        whl.extractall(purelib)  # a pure-Python wheel: installing it is unpacking it
    # Third-party packages, read-only, as a plain path (its .pth files are not run: no editable installs).
    (pathlib.Path(purelib) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import importlib, importlib.util as u, pkgutil, mlbook\n"
        "mods = [m.name for m in pkgutil.walk_packages(mlbook.__path__, 'mlbook.')]\n"
        "[importlib.import_module(m) for m in mods]\n"  # every module of the library imports on its own
        "print(len(mods), [u.find_spec(m) is None for m in ('mlbook_solutions', 'mlbook_tools')])"
    )
    run = subprocess.run(
        [py, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env={"MPLBACKEND": "Agg"}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    n_modules, hidden = run.stdout.strip().split(" ", 1)
    assert int(n_modules) >= 6 and hidden == "[True, True]", run.stdout
    kernels = tmp_path / "jupyter" / "kernels" / "student"
    kernels.mkdir(parents=True)
    spec = {
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "student",
        "language": "python",
    }
    (kernels / "kernel.json").write_text(json.dumps(spec))
    work = tmp_path / "student_home"
    work.mkdir()
    nb = nbformat.read(dist / NB, as_version=4)
    # defining a stub is fine; calling it raises
    first_stub = next(
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"
    )
    env = {"JUPYTER_PATH": str(tmp_path / "jupyter"), "MPLBACKEND": "Agg", "PYTHONNOUSERSITE": "1"}
    client = NotebookClient(
        nb, timeout=300, kernel_name="student", resources={"metadata": {"path": str(work)}}
    )
    import os

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        try:
            client.execute()
        except CellExecutionError:
            pass  # judged below, from the outputs
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    # nbclient goes on past cells tagged raises-exception (they need the student's answers) and stops
    # at the first error in any other cell: there must be none, and the first error of all must be
    # the first call of an unfilled stub.
    errors = [
        (i, o)
        for i, c in enumerate(nb.cells)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert errors and errors[0][0] >= first_stub, (
        f"first error in cell {errors[:1]}; the first stub is cell {first_stub}"
    )
    assert errors[0][1]["ename"] == "NotImplementedError", errors[0][1]["ename"]
    untagged = [
        i for i, _ in errors if "raises-exception" not in nb.cells[i].metadata.get("tags", [])
    ]
    assert not untagged, (
        f"cells {untagged} fail in the release although nothing marks them as needing answers"
    )
