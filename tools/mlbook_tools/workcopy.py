"""A student's work is never an output: ``mlbook start`` and the guard every notebook writer calls.

``mlbook start [DIR]`` copies the released notebooks into the student's own folder (default
``~/<course id>-work``, ``default_dir``), outside the checkout, so that no build, test, make target, ``git checkout``
or fresh clone ever writes there; a notebook already in DIR is never overwritten.

The guard decides by content, never by guessing what an answer looks like: ``mlbook build`` keeps
the SHA-256 of every file it writes in a manifest beside its outputs (``chapters/.generated.sha256``,
the format of ``sha256sum``, committed with them). A generated file is overwritten only when its
bytes are exactly the ones the manifest records (or exactly the bytes about to be written); any
other content (an answer with the stub commented out, a note in a markdown cell, a changed
space) is somebody's work, unless git holds exactly those bytes as the committed version (nothing
can be lost then: after a merge of two branches' generated files the manifest may not list them), and the command stops before writing anything, saying where the work
can go without replacing anything.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess

from mlbook_tools.config import assignment, layout

MANIFEST = ".generated.sha256"  # in the release folder (chapters/); paths in it are root-relative


def default_dir() -> pathlib.Path:
    """The student's work folder unless they name one: ``~/<course id>-work`` (the default
    assignment's course id, ``config.Assignment.course_id``)."""
    return pathlib.Path(f"~/{assignment().course_id}-work")


class HoldsAnswers(RuntimeError):
    """A file a command would overwrite is not what a build wrote: it holds someone's work."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_path() -> pathlib.Path:
    return layout().release / MANIFEST


def read_manifest(path: pathlib.Path | None = None) -> dict[str, str]:
    """Root-relative path -> SHA-256 of the bytes the last build wrote there ({} without a manifest)."""
    path = path or manifest_path()
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            out[parts[1].lstrip("*")] = parts[0]
    return out


def manifest_text(files: dict[pathlib.Path, str]) -> str:
    """The manifest for ``files`` (path -> text as written); ``sha256sum -c`` reads it from the root."""
    root = layout().root
    rows = sorted(
        (str(p.relative_to(root)), digest(t.encode()))
        for p, t in files.items()
        if p.name != MANIFEST
    )
    return "".join(f"{h}  {p}\n" for p, h in rows)


def _committed(path: pathlib.Path, data: bytes) -> bool:
    """Whether ``data`` is exactly the version of ``path`` committed at git's HEAD (False without git)."""
    root = layout().root
    try:
        run = subprocess.run(
            ["git", "-C", str(root), "show", f"HEAD:{path.relative_to(root)}"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return False
    return run.returncode == 0 and run.stdout == data


def _work_copy_hint(path: pathlib.Path) -> str:
    """Advice that replaces nothing: copy to a name that does not exist yet in the student's folder."""
    folder = default_dir().expanduser()
    shown = (
        f"~/{folder.relative_to(pathlib.Path.home())}"
        if folder.is_relative_to(pathlib.Path.home())
        else str(folder)
    )
    stem, n = f"{path.stem}-from-checkout", 1
    while (folder / f"{stem}{path.suffix}").exists():
        n += 1
        stem = f"{path.stem}-from-checkout-{n}"
    target = f"{shown}/{stem}{path.suffix}"
    root = layout().root
    restore = (
        f"`git -C {root} checkout -- {path.relative_to(root)}`"
        if path.is_relative_to(root)
        else "rerun the command"
    )
    return (
        f"Keep your work: `mkdir -p {shown} && cp -n {path} {target}` (cp -n never replaces a file; "
        f"{shown} is the folder `mlbook start` sets up, where no command writes), then continue there; "
        f"afterwards {restore} restores the generated file."
    )


def refuse_if_edited(planned: dict[pathlib.Path, str] | list[pathlib.Path], manifest=None) -> None:
    """Raise :class:`HoldsAnswers` if any existing file among ``planned`` is not byte-exactly what a
    build wrote (its manifest entry) nor what is about to be written (``planned``'s text, if given)."""
    manifest = read_manifest() if manifest is None else manifest
    root = layout().root
    texts = planned if isinstance(planned, dict) else {}
    edited = []
    for path in dict.fromkeys(map(pathlib.Path, planned)):  # each file once, in order
        if not path.is_file() or path.name == MANIFEST:
            continue
        data = path.read_bytes()
        rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        if manifest.get(rel) == digest(data):
            continue
        if path in texts and texts[path].encode() == data:
            continue
        if _committed(path, data):
            continue
        edited.append(path)
    if edited:
        first = edited[0]
        shown = ", ".join(str(p.relative_to(root) if p.is_relative_to(root) else p) for p in edited)
        raise HoldsAnswers(
            f"{shown}: not what `mlbook build` wrote (someone's work: answers or notes); nothing was "
            f"written. {_work_copy_hint(first)}"
        )


def release_paths() -> list[pathlib.Path]:
    """The released notebooks (and their .py forms) that ``mlbook build`` writes."""
    release = layout().release
    return sorted(release.glob("*.ipynb")) + sorted(release.glob("*.py"))


# A self-paced student's JupyterLab configuration (a folder on JUPYTER_CONFIG_PATH, above the
# environment's own): nbgrader's instructor plugins (Formgrader, Create Assignment, Course List) and
# its exchange (Assignments, which warns that no exchange exists) off, Validate kept. A course
# student's lab on the hub is configured by `mlbook hub` (hub.py) instead.
STUDENT_LAB = pathlib.Path(__file__).parent / "student_lab"


def lab_command(out: pathlib.Path, notebook: str = "") -> str:
    """The command that opens JupyterLab on a self-paced student's work folder (as root with
    ``--allow-root``, which Jupyter otherwise asks for and exits)."""
    import os
    import shlex
    import sys

    jupyter = pathlib.Path(sys.executable).parent / "jupyter"
    args = f" {shlex.quote(notebook)}" if notebook else ""
    args += " --allow-root" if os.geteuid() == 0 else ""
    return (
        f"cd {shlex.quote(str(out))} && JUPYTER_CONFIG_PATH={shlex.quote(str(STUDENT_LAB))} "
        f"{shlex.quote(str(jupyter))} lab{args}"
    )


def start(folder: str | pathlib.Path | None = None) -> tuple[pathlib.Path, list[str], list[str]]:
    """Copy the released notebooks into ``folder``; returns (folder, copied names, kept names)."""
    out = pathlib.Path(folder or default_dir()).expanduser().resolve()
    notebooks = sorted(layout().release.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no released notebook in {layout().release}: run `mlbook build`")
    if layout().root in (out, *out.parents):
        raise HoldsAnswers(
            f"{out} is inside the checkout, where commands write: pick a folder outside it"
        )
    out.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for nb in notebooks:
        target = out / nb.name
        if target.exists():
            kept.append(nb.name)
            continue
        shutil.copyfile(nb, target)
        copied.append(nb.name)
    return out, copied, kept
