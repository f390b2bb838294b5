"""The course's ``nbgrader collect`` (mlbook_tools/exchange.py) on a fake exchange folder, in-process.

The machine's own users stand in for students (``daemon`` and ``bin``: ids in the safe set, with
uids); files are handed to them with ``os.chown`` (needs root, as ``mlbook hub`` does). Each attack
is what a student could do in the hub's ``inbound/`` (mode 0733): a folder in a classmate's name,
a link to a file only the instructor can read, an unsafe id, a backdated name and timestamp.txt.
"""

import datetime
import json
import os
import pwd
import time

import pytest
from mlbook_tools.exchange import STUDENT_ID_RULE, TrustedCollect, student_id_problem
from nbgrader.utils import parse_utc

pytestmark = pytest.mark.unit

if os.geteuid() != 0:
    pytest.skip("needs root (files handed to other uids)", allow_module_level=True)

NB, COURSE = "rlhf_ppo", "rlhf-ppo"
ALICE, BOB = "daemon", "bin"  # system users with uids: the two students


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


@pytest.fixture
def exchange(tmp_path):
    inbound = tmp_path / "exchange" / COURSE / "inbound"
    inbound.mkdir(parents=True)
    inbound.chmod(0o733)
    course = tmp_path / "course"
    course.mkdir()
    return tmp_path / "exchange", inbound, course


def hand_in(inbound, name: str, owner: str | int, text: str, stamp: str | None = None):
    """A folder as a student's client (or the student by hand) would put it in inbound/."""
    uid = owner if isinstance(owner, int) else pwd.getpwnam(owner).pw_uid
    folder = inbound / name
    folder.mkdir()
    (folder / f"{NB}.ipynb").write_text(json.dumps({"who": text}))
    (folder / "timestamp.txt").write_text(stamp or name.split("+")[2])
    for p in (folder, *folder.iterdir()):
        os.lchown(p, uid, uid)
    return folder


def collect(root, course, duedate=None, **options) -> TrustedCollect:
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(root=str(course))
    coursedir.course_id, coursedir.assignment_id = COURSE, NB
    app = TrustedCollect(coursedir=coursedir, root=str(root), **options)
    app._duedate = lambda: duedate  # the gradebook's due date (nbgrader's, read by the app)
    app.start()
    return app


def collected(course, student):
    folder = course / "submitted" / student / NB
    who = json.loads((folder / f"{NB}.ipynb").read_text())["who"]
    return who, parse_utc((folder / "timestamp.txt").read_text())


def test_student_ids_are_a_documented_safe_set():
    for ok in ("alice", "bob_2", "a.b-c", "X" * 64, "0day"):
        assert student_id_problem(ok) is None, ok
    for bad in ("x;=2+2", "a,b", "a\tb", ".hidden", "-rf", "", "X" * 65, "<img>", "a b", "a+b"):
        why = student_id_problem(bad)
        assert why and repr(bad) in why and STUDENT_ID_RULE in why, bad


def test_collect_refuses_what_the_named_student_does_not_own(exchange, tmp_path):
    root, inbound, course = exchange
    hand_in(inbound, f"{BOB}+{NB}+2026-12-01 10:00:00.000000 UTC+b1", BOB, "bob's work")
    # alice, in bob's name, "later": nbgrader's own collect files it as bob's (a warning only)
    hand_in(inbound, f"{BOB}+{NB}+2099-01-01 00:00:00.000000 UTC+a1", ALICE, "alice's zero")
    # alice's own, with a link to a file only the instructor can read
    secret = tmp_path / "source.ipynb"
    secret.write_text("HIDDEN TESTS")
    secret.chmod(0o600)
    linked = hand_in(inbound, f"{ALICE}+{NB}+2026-12-01 10:00:00.000000 UTC+a2", ALICE, "alice")
    (linked / "extra.ipynb").symlink_to(secret)
    os.lchown(linked / "extra.ipynb", *(pwd.getpwnam(ALICE).pw_uid,) * 2)
    # bob's folder with a file of someone else in it (uid 12345: no user)
    odd = hand_in(inbound, f"{BOB}+{NB}+2098-01-01 00:00:00.000000 UTC+b2", BOB, "bob, mixed")
    os.chown(odd / f"{NB}.ipynb", 12345, 12345)
    hand_in(inbound, f"x;=2+2+{NB}+2026-12-01 10:00:00.000000 UTC+c", ALICE, "bad id")
    hand_in(inbound, f"nosuchuser42+{NB}+2026-12-01 10:00:00.000000 UTC+d", 12345, "nobody")

    app = collect(root, course)

    assert collected(course, BOB)[0] == "bob's work"  # not replaced by the forged, later folder
    assert not (course / "submitted" / ALICE).exists()  # her folder with a link: refused whole
    assert "HIDDEN TESTS" not in "".join(
        p.read_text() for p in (course / "submitted").rglob("*") if p.is_file()
    )
    refused = {os.path.basename(p): why for p, why in app.refused}
    assert len(refused) == 5, refused
    assert "owned by daemon (uid 1)" in refused[f"{BOB}+{NB}+2099-01-01 00:00:00.000000 UTC+a1"]
    assert "symbolic link" in refused[f"{ALICE}+{NB}+2026-12-01 10:00:00.000000 UTC+a2"]
    assert "owned by uid 12345" in refused[f"{BOB}+{NB}+2098-01-01 00:00:00.000000 UTC+b2"]
    assert "'x;=2+2' is not allowed" in refused[f"x;=2+2+{NB}+2026-12-01 10:00:00.000000 UTC+c"]
    assert (
        "no user 'nosuchuser42'" in refused[f"nosuchuser42+{NB}+2026-12-01 10:00:00.000000 UTC+d"]
    )
    assert not (course / "submitted" / "x;=2+2").exists()


def test_the_submission_time_is_the_file_systems_not_the_students(exchange):
    root, inbound, course = exchange
    due = _now() - datetime.timedelta(hours=1)
    before = _now()
    # bob hands in after the due date, under an early name and timestamp.txt, every mtime backdated
    early = "2026-01-01 00:00:00.000000 UTC"
    late = hand_in(inbound, f"{BOB}+{NB}+{early}+b1", BOB, "bob, late", stamp=early)
    for p in (*late.iterdir(), late):
        os.utime(p, (0, 0), follow_symlinks=False)
    collect(root, course, duedate=due)
    who, when = collected(course, BOB)
    assert who == "bob, late" and before - datetime.timedelta(seconds=1) <= when <= _now()
    assert when > due  # late: the penalty applies (late.py reads this timestamp.txt)

    # --update takes the latest by that same clock: a folder made later wins, whatever its name says
    time.sleep(0.05)
    hand_in(inbound, f"{ALICE}+{NB}+2099-01-01 00:00:00.000000 UTC+a1", ALICE, "first")
    time.sleep(0.05)
    second = hand_in(inbound, f"{ALICE}+{NB}+2000-01-01 00:00:00.000000 UTC+a2", ALICE, "second")
    collect(root, course, update=True)
    assert collected(course, ALICE)[0] == "second"
    # writing into an old file later (same inode, folder untouched) makes the submission later too
    made = collected(course, ALICE)[1]
    time.sleep(0.05)
    with open(second / f"{NB}.ipynb", "r+") as fh:
        fh.write(json.dumps({"who": "rewritten"}))
    collect(root, course, update=True)
    who, when = collected(course, ALICE)
    assert who == "rewritten" and when > made


def test_only_the_notebooks_of_a_submission_cross_into_the_course(exchange, caplog):
    """An extra file beside the notebook (a page with a script, a config nbgrader would load) stays
    in the exchange; the log names it for the instructor."""
    root, inbound, course = exchange
    folder = hand_in(inbound, f"{BOB}+{NB}+2026-12-01 10:00:00.000000 UTC+b1", BOB, "bob's work")
    (folder / "figs").mkdir()
    (folder / "figs" / "derivation.html").write_text("<script>fetch('/formgrader/api')</script>")
    (folder / "nbgrader_config.py").write_text("open('/tmp/pwned', 'w')")
    for p in (folder / "figs", folder / "figs" / "derivation.html", folder / "nbgrader_config.py"):
        os.lchown(p, *(pwd.getpwnam(BOB).pw_uid,) * 2)
    with caplog.at_level("WARNING"):
        collect(root, course)
    kept = sorted(p.name for p in (course / "submitted" / BOB / NB).iterdir())
    assert kept == [f"{NB}.ipynb", "timestamp.txt"], kept
    assert collected(course, BOB)[0] == "bob's work"
    said = caplog.text
    assert "Not collected" in said and "'figs'" in said and "'nbgrader_config.py'" in said, said
