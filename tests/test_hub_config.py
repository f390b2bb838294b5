"""The per-role Jupyter configuration `mlbook hub` writes (files only: no user, no hub started)."""

import json
import pathlib

import pytest
from mlbook_tools import hub, hub_config

pytestmark = pytest.mark.unit


def test_the_hub_terminal_is_not_a_login_shell_that_resets_path(tmp_path):
    """JupyterLab under a spawner starts `bash -l` unless told a shell; Debian's /etc/profile then
    resets PATH and the README's `mlbook grade-class` answers "command not found"."""
    hub_config.write_configs(tmp_path, "teacher", tmp_path / "course", ["alice"])
    for role in ("instructor", "student"):
        server = json.loads((tmp_path / "etc" / role / "jupyter_server_config.json").read_text())
        shell = server["ServerApp"]["terminado_settings"]["shell_command"]
        assert shell == ["/bin/bash"], (role, shell)
        assert hub.user_env(tmp_path, role)["PATH"].startswith(
            str(tmp_path / "envs" / role / "bin")
        )


def test_hub_kernels_run_with_encrypted_channels(tmp_path):
    """Each kernel a hub user starts (the lab's, nbgrader's Validate and autograde) gets CurveZMQ
    channels: the kernel manager built from the files `mlbook hub` writes asks for encryption, so
    ipykernel logs no "Kernel is running over TCP without encryption" for each notebook opened."""
    from jupyter_client import KernelManager
    from jupyter_server.services.kernels.kernelmanager import ServerKernelManager
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    hub_config.write_configs(tmp_path, "teacher", tmp_path / "course", ["alice"])
    for role in ("instructor", "student"):
        etc = tmp_path / "etc" / role
        server = JSONFileConfigLoader("jupyter_server_config.json", path=str(etc)).load_config()
        grader = PyFileConfigLoader("nbgrader_config.py", path=str(etc)).load_config()
        for config, manager in ((server, ServerKernelManager), (grader, KernelManager)):
            assert manager(config=config).transport_encryption == "auto", (role, manager)
        assert KernelManager().transport_encryption != "auto"  # what the files change


def test_hub_says_when_students_could_read_the_solutions():
    """`mlbook hub` warns when the checkout it runs from lets every user read the reference solutions
    or the graded checks (the README's walk found them readable under a checkout in /tmp)."""
    import shutil
    import tempfile

    from mlbook_tools.hub import exposed, readable_by_others

    top = pathlib.Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp_path sits in a 0700 folder
    try:
        assert all(readable_by_others(p) for p in (top.parent, *top.parent.parents))
        checkout = top / "checkout"
        for sub in ("solutions/mlbook_solutions", "tests"):
            (checkout / sub).mkdir(parents=True)
        for folder in (top, checkout, checkout / "solutions"):
            folder.chmod(0o755)
        (checkout / "tests").chmod(0o750)
        assert exposed(checkout) == [checkout / "solutions"]
        (checkout / "tests").chmod(0o755)
        assert exposed(checkout) == [checkout / "solutions", checkout / "tests"]
        checkout.chmod(0o750)  # a checkout others cannot enter hides both
        assert exposed(checkout) == [] and not readable_by_others(checkout / "solutions")
    finally:
        shutil.rmtree(top)
