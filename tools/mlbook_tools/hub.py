"""``mlbook hub``: the course on a JupyterHub on one machine, with nbgrader's exchange (run as root).

What it sets up (idempotent; a rerun keeps users, passwords, the course and its gradebook):

- system users (``useradd``): one instructor, the students; homes mode 0700. The hub logs them in
  with PAM (JupyterHub's default authenticator: the machine's own passwords; ``--passwords FILE``
  of ``user:password`` lines sets them through ``chpasswd``). The default local-process spawner
  starts each user's Jupyter server as that user, so the exchange's file permissions apply.
- ``<dir>/exchange``: nbgrader's exchange root, mode 0777 as nbgrader's docs say (nbgrader itself
  makes ``<course>/inbound`` write-only for students and ``feedback/`` unlistable).
- the course folder ``~instructor/<course_id>`` (``mlbook new-course``; the course id is the
  default assignment's, ``config.Assignment.course_id``), owned by the instructor,
  mode 0700: its gradebook, submissions and grading secret are readable by nobody else.
- two Python environments made from the checkout's ``.venv`` (hard links, seconds), run by a
  Python every user can execute: ``envs/student`` has the library ``mlbook`` and JupyterLab with
  nbgrader's Assignments tab only (no formgrader, no reference solutions, no tooling);
  ``envs/instructor`` runs the course tooling from a copy of the checkout in ``instructor/`` (mode
  0750, group of the instructor), so formgrader's Autograde button and ``mlbook grade-class`` grade
  through the sandbox exactly as in the checkout.
- ``etc/{student,instructor}``: the Jupyter config each kind of user gets (``JUPYTER_CONFIG_PATH``).
- ``jupyterhub_config.py`` and ``state/`` (the hub's database and cookie secret, root only), and
  configurable-http-proxy from npm, pinned in ``tools/hub-proxy/package-lock.json``.

Then ``mlbook hub`` runs JupyterHub in the foreground (``--setup-only`` stops before).
"""

from __future__ import annotations

import os
import pathlib
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig

from mlbook_tools.config import assignment, layout
from mlbook_tools.hub_config import write_configs, write_hub_config

PROXY_DIR = "tools/hub-proxy"  # package.json + package-lock.json (configurable-http-proxy 5.3.0)
SKIP_SITE = ("__editable__", "mlbook", "a1_coverage")  # never copied into a hub environment


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def as_user(
    user: str, cmd: list[str], hub: pathlib.Path, cwd: str | None = None, check: bool = True
):
    """Run ``cmd`` as ``user`` with the environment the hub gives that user's server (tests, README)."""
    role = "instructor" if (hub / "etc" / "instructor" / f"{user}.role").exists() else "student"
    home = pwd.getpwnam(user).pw_dir
    env = {"HOME": home, "USER": user, "LANG": "C.UTF-8", **user_env(hub, role)}
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *cmd],
        cwd=cwd or home,
        text=True,
        capture_output=True,
        check=check,
    )


def user_env(hub: pathlib.Path, role: str) -> dict[str, str]:
    """The environment variables of a ``role`` user's server (and of commands run as that user)."""
    env = {
        "PATH": f"{hub / 'envs' / role / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "JUPYTER_CONFIG_PATH": str(hub / "etc" / role),
    }
    if role == "instructor":
        env["MLBOOK_ROOT"] = str(hub / "instructor" / "checkout")
    return env


# ------------------------------------------------------------------------------------- users


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        run(["useradd", "--create-home", "--shell", "/bin/bash", name])
        pw = pwd.getpwnam(name)
    os.chmod(pw.pw_dir, 0o700)
    return pw


def set_passwords(path: pathlib.Path) -> None:
    """``user:password`` lines into ``chpasswd`` (PAM then accepts them)."""
    run(["chpasswd"], input=path.read_text())


# ------------------------------------------------------------------------------ environments


def world_python(hub: pathlib.Path) -> pathlib.Path:
    """This Python, runnable by every user. If its folders are closed to them (pyenv under /root), a
    copy in ``<hub>/python`` (hard links) whose binary finds its shared library next to it: the
    absolute RUNPATH is rewritten in place to ``$ORIGIN/../lib`` (padded, same length). The same
    interpreter, not the system's: Debian's 3.11.2 breaks the soupsieve that nbconvert's HTML needs."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = pathlib.Path(sys.base_prefix).resolve()
    mine = base / "bin" / f"python{ver}"
    if _open_to_all(mine.resolve()):
        return mine
    copy = hub / "python"
    _link_tree(base, copy, skip=lambda p: p.parts[:3] == ("lib", f"python{ver}", "site-packages"))
    exe = copy / "bin" / f"python{ver}"
    data = mine.resolve().read_bytes()
    old = str(base / "lib").encode()
    if old in data:
        new = b"$ORIGIN/../lib"
        data = data.replace(old + b"\0", new + b"\0" * (len(old) - len(new) + 1), 1)
    exe.unlink()
    exe.write_bytes(data)
    exe.chmod(0o755)
    return exe


def _open_to_all(path: pathlib.Path) -> bool:
    if not os.stat(path).st_mode & stat.S_IROTH:
        return False
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)


def _link_tree(src: pathlib.Path, dst: pathlib.Path, skip=lambda p: False) -> None:
    """Hard links where the file system allows, copies otherwise; a file already there is kept."""

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    for dirpath, dirnames, filenames in os.walk(src):
        rel = pathlib.Path(dirpath).relative_to(src)
        dirnames[:] = [d for d in dirnames if not skip(rel / d)]
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for f in filenames:
            s, d = pathlib.Path(dirpath) / f, dst / rel / f
            if skip(rel / f) or d.exists() or d.is_symlink():
                continue
            if s.is_symlink():
                d.symlink_to(os.readlink(s))
            else:
                link(s, d)


def make_env(target: pathlib.Path, role: str, checkout: pathlib.Path) -> None:
    """A venv at ``target`` holding the packages of this one (hard links), without the editable
    project packages; ``mlbook`` copied in for students, the checkout copy on the path for the instructor."""
    venv = pathlib.Path(sys.prefix)
    python = world_python(target.parent.parent)
    if not (target / "bin" / "python").exists():
        run([str(python), "-m", "venv", "--without-pip", str(target)])
    site_rel = pathlib.Path(sysconfig.get_paths()["purelib"]).relative_to(venv)
    site = target / site_rel
    _link_tree(
        venv / site_rel,
        site,
        skip=lambda p: (
            p.parts[0].startswith(SKIP_SITE)
            and not (role == "instructor" and p.parts[0].endswith(".dist-info"))
        ),
    )
    for folder in ("share", "etc"):
        if (venv / folder).exists():
            _link_tree(venv / folder, target / folder)
    if role == "student":  # the library, a real copy (the checkout is not theirs to read)
        L = layout()
        _link_tree(
            L.root / "src" / "mlbook", site / "mlbook", skip=lambda p: "__pycache__" in p.parts
        )
        dist = next((venv / site_rel).glob("mlbook-*.dist-info"))
        _link_tree(dist, site / dist.name, skip=lambda p: p.name in ("direct_url.json", "RECORD"))
    else:
        paths = [checkout / "src", checkout / "solutions", checkout / "tools"]
        (site / "mlbook_hub_checkout.pth").write_text("".join(f"{p}\n" for p in paths))
    # console scripts: the same ones, pointing at this environment's interpreter
    new = f"#!{target / 'bin' / 'python'}\n"
    for script in (venv / "bin").iterdir():
        out = target / "bin" / script.name
        if out.exists() or out.is_symlink() or script.is_symlink() or not script.is_file():
            continue
        head = script.read_bytes()[:200]
        if head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]:
            body = script.read_text().split("\n", 1)[1]
            out.write_text(new + body)
            out.chmod(0o755)


def copy_checkout(dst: pathlib.Path) -> None:
    """What the course tooling reads (pyproject, src, solutions, tools, tests, autograde), hard-linked."""
    root = layout().root
    ignore = {".git", ".venv", "build", "node_modules", "__pycache__", ".ipynb_checkpoints"}
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "pyproject.toml", dst / "pyproject.toml")
    for name in ("src", "solutions", "tools", "tests", "autograde", "chapters"):
        if (root / name).exists():
            _link_tree(root / name, dst / name, skip=lambda p: bool(set(p.parts) & ignore))


# ------------------------------------------------------------------------------------ proxy


def ensure_proxy() -> pathlib.Path:
    """configurable-http-proxy, pinned by ``tools/hub-proxy/package-lock.json``; ``npm ci`` when missing."""
    folder = layout().root / PROXY_DIR
    exe = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    if not exe.exists():
        if shutil.which("npm") is None:
            raise RuntimeError("npm is not installed: apt-get install nodejs npm (Node 20 works)")
        run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder)
    return exe


# ------------------------------------------------------------------------------------ setup


def readable_by_others(path: pathlib.Path) -> bool:
    """Whether any user can read ``path``: every folder above it searchable by others (o+x), and
    it readable (o+r; a folder also o+x)."""
    path = path.resolve()
    for parent in path.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    mode = path.stat().st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


def exposed(checkout: pathlib.Path) -> list[pathlib.Path]:
    """What students must not read but can, where the checkout sits: the reference solutions and
    the graded checks (the hub's own copy of the checkout is the instructor's only)."""
    secret = [checkout / "solutions", checkout / "tests"]
    return [p for p in secret if p.exists() and readable_by_others(p)]


def setup(
    hub: pathlib.Path,
    instructor: str,
    students: list[str],
    ip: str = "127.0.0.1",
    port: int = 8000,
    passwords: pathlib.Path | None = None,
) -> pathlib.Path:
    """Everything the module docstring lists; returns the course folder."""
    from mlbook_tools.course import new_course

    if os.geteuid() != 0:
        raise PermissionError(
            "mlbook hub creates system users and spawns their servers: run it as root"
        )
    if instructor in students:
        raise ValueError(f"{instructor} is both the instructor and a student")
    hub = hub.resolve()
    hub.mkdir(parents=True, exist_ok=True)
    hub.chmod(0o755)
    teacher = ensure_user(instructor)
    for s in students:
        ensure_user(s)
    if passwords:
        set_passwords(passwords)
    # the exchange: open to all, as nbgrader documents; nbgrader sets the course's own folders' modes
    exchange = hub / "exchange"
    exchange.mkdir(exist_ok=True)
    exchange.chmod(0o777)
    # the instructor's tooling: a copy of the checkout only the instructor (and root) can read
    private = hub / "instructor"
    private.mkdir(exist_ok=True)
    copy_checkout(private / "checkout")
    os.chown(private, 0, teacher.pw_gid)
    private.chmod(0o750)
    for role in ("student", "instructor"):
        make_env(hub / "envs" / role, role, private / "checkout")
    # the course folder, the instructor's own
    course = pathlib.Path(teacher.pw_dir) / assignment().course_id
    new_course(course)
    for dirpath, _, filenames in os.walk(course):
        for p in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            os.chown(p, teacher.pw_uid, teacher.pw_gid)
    course.chmod(0o700)
    write_configs(hub, instructor, course, students)
    env = {role: user_env(hub, role) for role in ("student", "instructor")}
    write_hub_config(hub, instructor, students, course, ip, port, env, ensure_proxy())
    # the class list into the gradebook (formgrader lists students from it), as the instructor
    roster = course / "students.csv"
    roster.write_text("id,last_name,first_name\n" + "".join(f"{s},{s},\n" for s in students))
    os.chown(roster, teacher.pw_uid, teacher.pw_gid)
    as_user(instructor, ["nbgrader", "db", "student", "import", str(roster)], hub, cwd=str(course))
    return course


def serve(hub: pathlib.Path) -> None:
    """Become JupyterHub (this checkout's interpreter, as root, in ``state/``): a signal to this
    process stops the hub, which stops the users' servers and the proxy."""
    bindir = pathlib.Path(sys.executable).parent
    os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.chdir(hub / "state")
    config = str(hub / "jupyterhub_config.py")
    os.execv(sys.executable, [sys.executable, "-m", "jupyterhub", "-f", config])
