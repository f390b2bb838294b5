"""The configuration files ``mlbook hub`` writes: each role's Jupyter and nbgrader config
(``etc/{student,instructor}``) and the hub's ``jupyterhub_config.py``."""

from __future__ import annotations

import json
import pathlib

from mlbook_tools.config import assignment
from mlbook_tools.execute import KERNEL_ENCRYPTION

# nbgrader's JupyterLab plugins a student must not see (they keep the Assignments tab and validate)
STUDENT_HIDDEN = ["formgrader", "course-list", "create-assignment"]


def write_configs(
    hub: pathlib.Path, instructor: str, course: pathlib.Path, students: list[str]
) -> None:
    """``etc/{student,instructor}``: each role's nbgrader config, JupyterLab page config and Jupyter
    server config (``JUPYTER_CONFIG_PATH``)."""
    common = (
        f"c.Exchange.root = {str(hub / 'exchange')!r}\n"
        f"c.CourseDirectory.course_id = {assignment().course_id!r}\n"
        # nbgrader's own kernels (Validate, autograde) as the lab's: channels encrypted, no TCP warning
        f"c.KernelManager.transport_encryption = {KERNEL_ENCRYPTION!r}\n"
    )
    for role in ("student", "instructor"):
        etc = hub / "etc" / role
        (etc / "labconfig").mkdir(parents=True, exist_ok=True)
        text = "# written by `mlbook hub`\nc = get_config()  # noqa: F821\n" + common
        hidden, off = [], []
        if role == "instructor":  # formgrader and nbgrader's commands work in the course folder
            text += f"c.CourseDirectory.root = {str(course)!r}\n"
            (etc / f"{instructor}.role").write_text("instructor\n")
        else:
            hidden = [f"@jupyter/nbgrader:{p}" for p in STUDENT_HIDDEN]
            off = [
                "nbgrader.server_extensions.formgrader",
                "nbgrader.server_extensions.course_list",
            ]
        (etc / "nbgrader_config.py").write_text(text)
        (etc / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {name: True for name in hidden}}, indent=1)
        )
        # The terminal: a plain interactive bash. Under a spawner JupyterLab would start a login shell
        # (`bash -l`), whose /etc/profile resets PATH to the system's and loses the course tools.
        # Kernels: channels encrypted with CurveZMQ (execute.KERNEL_ENCRYPTION), so no "Kernel is running
        # over TCP without encryption" warning in the lab's log for each notebook opened.
        server = {
            "jpserver_extensions": {name: False for name in off},
            "terminado_settings": {"shell_command": ["/bin/bash"]},
        }
        kernels = {"transport_encryption": KERNEL_ENCRYPTION}
        (etc / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": server, "KernelManager": kernels}, indent=1)
        )


HUB_CONFIG = '''"""JupyterHub for the course (written by `mlbook hub`; rerun it rather than edit this file)."""
from jupyterhub.spawner import LocalProcessSpawner

from mlbook_tools.cgroups import ENTER_THEN_RUN, delegate, entering

c = get_config()  # noqa: F821


class CourseSpawner(LocalProcessSpawner):
    """Each server as its own user; the instructor's enters its delegated cgroups first, still as root
    (cgroup v2 lets a process in only by a writer of the common ancestor's cgroup.procs)."""

    groups = ()

    def make_preexec_fn(self, name):
        return entering(self.groups, super().make_preexec_fn(name))

HUB = {hub!r}
INSTRUCTOR = {instructor!r}
COURSE = {course!r}
ENV = {env!r}

c.JupyterHub.ip = {ip!r}
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{{HUB}}/state/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{{HUB}}/state/jupyterhub_cookie_secret"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.pid_file = f"{{HUB}}/state/proxy.pid"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.authenticator_class = "jupyterhub.auth.PAMAuthenticator"  # the machine's own passwords
c.Authenticator.allowed_users = {users!r}
c.Authenticator.admin_users = {{INSTRUCTOR}}
c.JupyterHub.spawner_class = CourseSpawner  # each server as its own user
c.Spawner.default_url = "/lab"
c.JupyterHub.implicit_spawn_seconds = 1  # a stopped server starts when its page is visited
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180


def per_role(spawner):
    role = "instructor" if spawner.user.name == INSTRUCTOR else "student"
    python = f"{{HUB}}/envs/{{role}}/bin/python"
    # started in the course folder: nbgrader (formgrader's buttons) reads nbgrader_config.py from the cwd
    where = COURSE if role == "instructor" else "."
    # the instructor's server starts in cgroups of its own (made here, as root): the sandboxes that
    # grade-class and Autograde make go under them, so student code may start processes, bounded
    spawner.groups = delegate(spawner.user.name) if role == "instructor" else []
    server = [where, python, "-m", "jupyterhub.singleuser"]
    spawner.cmd = ["/bin/sh", "-c", ENTER_THEN_RUN, "sh", "--", *server]  # entered already: cd, exec
    spawner.environment.update(ENV[role])
    if role == "instructor":
        spawner.notebook_dir = COURSE


c.Spawner.pre_spawn_hook = per_role
'''


def write_hub_config(hub, instructor, students, course, ip, port, env, proxy) -> None:
    """``jupyterhub_config.py`` (``HUB_CONFIG`` filled in) and its ``state/`` folder, root only;
    ``env``: each role's environment variables, ``proxy``: configurable-http-proxy's program."""
    state = hub / "state"
    state.mkdir(exist_ok=True)
    state.chmod(0o700)
    text = HUB_CONFIG.format(
        hub=str(hub),
        instructor=instructor,
        course=str(course),
        env=env,
        ip=ip,
        port=port,
        api_port=port + 1,
        hub_port=port + 2,
        proxy=str(proxy),
        users={instructor, *students},
    )
    (hub / "jupyterhub_config.py").write_text(text)
