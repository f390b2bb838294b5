"""Which cgroup hierarchy the sandbox uses (``cgroups.parse_mounts``, ``parse_own``, ``pick``), read from
the /proc files of real machines: this project's v1 machines (a v1 hierarchy per controller beside an
empty cgroup2 mount), a current distribution or Kubernetes node (v2 only), a hybrid systemd machine whose
v2 mount holds no controller, and one that splits them. The bounds themselves: tests/test_cgroup_bounds.py.
"""

import os
import pathlib

import pytest
from mlbook_tools import cgroups

pytestmark = pytest.mark.unit

V1_MACHINE = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_OWN = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/ab12\n1:cpu:/\n2:cpuacct:/\n0::/\n"
CO_MOUNTED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
V2_MACHINE = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
V2_OWN = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n"


def test_a_v1_machine_uses_v1_even_beside_a_cgroup2_mount():
    v1, v2 = cgroups.parse_mounts(V1_MACHINE)
    assert v1["memory"] == pathlib.Path("/sys/fs/cgroup/memory")
    assert v2 == pathlib.Path("/sys/fs/cgroup/unified")
    assert cgroups.pick(v1, v2, {"hugetlb"}) == (1, "")
    own = cgroups.parse_own(V1_OWN)
    assert own["memory"] == "/process_api/ab12" and own[""] == "/"


def test_co_mounted_cpu_and_cpuacct_count_as_both():
    v1, _ = cgroups.parse_mounts(
        V1_MACHINE.replace(
            "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n", CO_MOUNTED
        ).replace("cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n", "")
    )
    assert v1["cpu"] == v1["cpuacct"] == pathlib.Path("/sys/fs/cgroup/cpu,cpuacct")
    assert cgroups.parse_own("3:cpu,cpuacct:/a\n")["cpuacct"] == "/a"


def test_a_v2_only_machine_uses_v2_where_it_offers_the_controllers():
    v1, v2 = cgroups.parse_mounts(V2_MACHINE)
    assert v1 == {} and v2 == pathlib.Path("/sys/fs/cgroup")
    offers = {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}
    assert cgroups.pick(v1, v2, offers) == (2, "")
    assert cgroups.parse_own(V2_OWN)[""].endswith("/run-r1.scope")


def test_no_usable_hierarchy_says_which_holds_what():
    v1, v2 = cgroups.parse_mounts(V2_MACHINE)
    version, why = cgroups.pick(v1, v2, {"cpu", "io"})
    assert version is None and "offers cpu" in why and "memory, pids and cpu" in why
    split = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n" + V2_MACHINE
    version, why = cgroups.pick(*cgroups.parse_mounts(split), {"cpu", "pids"})
    assert version is None and "cgroup v1 holds memory" in why, why
    assert cgroups.pick({}, None, set()) == (None, "no cgroup file system is mounted")


def _group(
    path: pathlib.Path, offers: str, procs: str, enabled: str = "", root: bool = False
) -> pathlib.Path:
    path.mkdir(parents=True)
    if not root:  # every group but the hierarchy's true root has a type
        (path / "cgroup.type").write_text("domain")
    (path / "cgroup.controllers").write_text(offers)
    (path / "cgroup.subtree_control").write_text(enabled)
    (path / "cgroup.procs").write_text(procs)
    return path


def test_v2_moves_the_groups_processes_into_a_leaf_before_it_enables_controllers(tmp_path):
    """v2's no-internal-process rule, on a stand-in tree of plain files: the grader's group hands out
    controllers only once its processes are in the leaf beside the sandboxes."""
    parent = _group(tmp_path / "grader", "cpuset cpu io memory pids", "11\n12\n")
    assert cgroups.prepare_v2(parent) == parent
    assert (parent / cgroups.LEAF / "cgroup.procs").read_text() == "12"  # each pid written in turn
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    ready = _group(tmp_path / "ready", "cpu memory pids", "", enabled="memory pids cpu")
    assert cgroups.prepare_v2(ready) == ready and not (ready / cgroups.LEAF).exists()


def test_v2_the_root_group_keeps_its_processes_and_a_missing_controller_is_named(tmp_path):
    root = _group(tmp_path / "root", "cpu memory pids", "1\n2\n", root=True)
    cgroups.prepare_v2(root)
    assert not (root / cgroups.LEAF).exists()
    poor = _group(tmp_path / "poor", "cpu io", "7\n")
    with pytest.raises(OSError, match="memory and pids controller"):
        cgroups.prepare_v2(poor)
    assert (poor / "cgroup.subtree_control").read_text() == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="a non-root user owns what it made: delegated to it")
def test_v2_a_systemd_unit_nobody_delegated_is_left_to_systemd(tmp_path, monkeypatch):
    monkeypatch.delenv("MLBOOK_CGROUP_DELEGATED", raising=False)
    scope = _group(tmp_path / "session-3.scope", "cpu memory pids", "40\n")
    with pytest.raises(OSError, match="systemd-run --scope -p Delegate=yes"):
        cgroups.prepare_v2(scope)
    assert not (scope / cgroups.LEAF).exists()  # nothing moved, nothing enabled
    assert (scope / "cgroup.subtree_control").read_text() == ""
    monkeypatch.setenv("MLBOOK_CGROUP_DELEGATED", "1")
    assert cgroups.prepare_v2(scope) == scope


def test_the_refusal_line_names_the_back_end_found_and_why_it_cannot_be_used(monkeypatch):
    """What grade-class and mlbook grade print where no sandbox can have a group: the hierarchy found,
    why it is unusable, what that costs honest work, and the ways out."""
    v2 = cgroups.Hierarchy(2, pathlib.Path("/sys/fs/cgroup/user.slice/session-4.scope"))
    monkeypatch.setattr(cgroups, "hierarchy", lambda: v2)

    def refuse(_limits):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(cgroups, "Cgroup", refuse)
    cgroups.cgroups_available.cache_clear()
    try:
        note = cgroups.refusal_note()
    finally:
        cgroups.cgroups_available.cache_clear()
    assert "cgroup v2 group at /sys/fs/cgroup/user.slice/session-4.scope: Permission denied" in note
    assert "is refused" in note and "Delegate=yes" in note and "mlbook doctor" in note
    monkeypatch.setattr(
        cgroups,
        "hierarchy",
        lambda: cgroups.Hierarchy(None, None, "no cgroup file system is mounted"),
    )
    assert "no usable cgroup: no cgroup file system is mounted" in cgroups.refusal_note()
    cgroups.cgroups_available.cache_clear()
