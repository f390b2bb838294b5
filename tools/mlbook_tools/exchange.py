"""``nbgrader collect`` that takes the exchange's facts from the kernel, not from the student's client.

nbgrader's exchange believes the inbound folder's name, ``inbound/<student>+<assignment>+<time>+<random>``
(``inbound`` is writable by every student): its collect files a folder under the student it names,
even one another user owns (it only logs "cheating attempt?"), and dates it by the time in its name
(and ``timestamp.txt``, written by the student's client). So a student could replace a classmate's
work, or hand in late with an early time. ``TrustedCollect`` (the course's
``c.ExchangeFactory.collect``) collects a folder only when:

* its student id is in the safe set ``STUDENT_ID`` (letters, digits, ``.``, ``_``, ``-``; 1-64
  characters; not starting with ``.`` or ``-``), and a user of that name exists on this machine;
* the folder and everything in it is owned by that user's uid (``lstat``: never followed), and is a
  plain folder or file: a symbolic link, FIFO, socket or device is refused (a link would have the
  instructor's collect copy a file only the instructor can read). Files are opened with
  ``O_NOFOLLOW`` and checked again on the open file, so a swap during the copy is refused too.

Its submission time, the one the late penalty and ``--update``/``--before-duedate`` use, is the latest
*ctime* (inode change time) of the folder and of everything in it, read after the copy. ctime is set
by the kernel to its clock at every change; unlike the mtime (``touch -d``, ``os.utime``) no user
call can set it, so a student can make a submission later, never earlier. (The latest of all, not the
folder's alone: writing into an old file later changes that file's ctime, not its folder's.) The
time in the folder's name is ignored, and the student's ``timestamp.txt`` is replaced in
``submitted/<student>/<assignment>/`` by this time: ``nbgrader autograde`` and ``mlbook grade-class``
(``late.py``) read it there.

A refused folder is reported (an error line naming the folder, the student it names, its owner or
what is wrong) and not collected; everyone else's submissions are. An earlier collected submission
of that student stays. ``c.ExchangeCollect.check_owner = False`` (nbgrader's switch) turns the owner
check off, for a machine where every student submits under one account: then nothing tells the
students apart; the rest still holds.
"""

from __future__ import annotations

import datetime
import glob
import os
import pwd
import re
import shutil
import stat

from nbgrader.exchange.default.collect import ExchangeCollect, groupby
from nbgrader.plugins.zipcollect import FileNameCollectorPlugin
from nbgrader.utils import ignore_patterns

from mlbook_tools.inert import escaped

STUDENT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
STUDENT_ID_RULE = (
    "letters, digits, '.', '_', '-' (1 to 64 characters, not starting with '.' or '-')"
)


def student_id_problem(student: str) -> str | None:
    """Why ``student`` is not a safe student id (None when it is one)."""
    if STUDENT_ID.fullmatch(student):
        return None
    return f"student id {student!r} is not allowed: ids are {STUDENT_ID_RULE}"


class Refused(Exception):
    """A submission folder that is not collected; the message says why."""


def submission_time(folder: str, uid: int | None) -> datetime.datetime:
    """The latest ctime in ``folder`` (itself included) as naive UTC, after checking every entry:
    a plain folder or file, owned by ``uid`` (None: any owner). Raises ``Refused``."""
    latest = 0.0
    for dirpath, dirnames, filenames in os.walk(folder, onerror=_raise):
        for path in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            st = os.lstat(path)
            _check(path, st, uid)
            latest = max(latest, st.st_ctime)
    return datetime.datetime.fromtimestamp(latest, datetime.UTC).replace(tzinfo=None)


def _raise(err: OSError):
    raise Refused(f"cannot read {err.filename}: {err.strerror}")


def _check(path: str, st: os.stat_result, uid: int | None) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{path} is a symbolic link")
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise Refused(f"{path} is not a plain file or folder")
    if uid is not None and st.st_uid != uid:
        raise Refused(f"{path} is owned by {_user(st.st_uid)}")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def copy_owned(uid: int | None):
    """A ``copy_function`` for ``shutil.copytree``: the source opened without following a link,
    checked on the open file (plain file, owner ``uid``), then copied."""

    def copy(src: str, dst: str) -> str:
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as err:
            raise Refused(f"cannot open {src}: {err.strerror}") from None
        with open(fd, "rb") as fin:
            _check(src, os.fstat(fin.fileno()), uid)
            with open(dst, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        return dst

    return copy


class TrustedCollect(ExchangeCollect):
    """nbgrader's collect, with the owner, the files and the time checked as the module says."""

    def _uid(self, student: str) -> int | None:
        if not self.check_owner:
            return None
        try:
            return pwd.getpwnam(student).pw_uid
        except KeyError:
            raise Refused(f"there is no user {student!r} on this machine") from None

    def _record(self, path: str) -> dict:
        name = os.path.basename(path)
        student = name.split(f"+{self.coursedir.assignment_id}+", 1)[0]
        why = student_id_problem(student)
        if why:
            raise Refused(why)
        uid = self._uid(student)
        st = os.lstat(path)
        _check(path, st, uid)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"{path} is not a folder")
        return {
            "username": student,
            "filename": name,
            "uid": uid,
            "timestamp": submission_time(path, uid),
        }

    def _refuse(self, path: str, why: str) -> None:
        """Logged as an error (control characters shown escaped), kept in ``self.refused``."""
        why = escaped(why.replace(self.inbound_path + os.sep, ""))
        self.refused.append((path, why))
        self.log.error("REFUSED %s: %s; not collected", escaped(repr(os.path.basename(path))), why)

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        student = self.coursedir.student_id
        student = "*" if student in ("", "*") else glob.escape(student)
        assignment = glob.escape(self.coursedir.assignment_id)
        pattern = os.path.join(self.inbound_path, f"{student}+{assignment}+*")
        self.refused, records = [], []
        for path in sorted(glob.glob(pattern)):
            try:
                records.append(self._record(path))
            except (Refused, OSError) as err:
                self._refuse(path, str(err))
        self.duedate = self._duedate()
        self.src_records = []
        for group in groupby(records, lambda r: r["username"]).values():
            group = sorted(group, key=lambda r: r["timestamp"], reverse=True)
            if self.duedate is not None and self.before_duedate:
                early = [r for r in group if r["timestamp"] <= self.duedate]
                group = early or group
            self.src_records.append(group[0])

    def _duedate(self):
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                return gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                return None

    def copy_files(self):
        a = self.coursedir.assignment_id
        if not self.src_records:
            self.log.warning(
                f"No submissions of '{a}' for course '{self.coursedir.course_id}' to collect"
            )
        for rec in self.src_records:
            student, src = rec["username"], os.path.join(self.inbound_path, rec["filename"])
            dest = self.coursedir.format_path(self.coursedir.submitted_directory, student, a)
            if os.path.isdir(dest):
                old = self.coursedir.get_existing_timestamp(dest)
                newer = old is None or rec["timestamp"] > old
                if not (
                    (self.update and newer) or (self.before_duedate and old != rec["timestamp"])
                ):
                    self.log.info(f"No newer submission to collect (or no --update): {student} {a}")
                    continue
            try:
                self._copy(src, dest, rec)
            except (Refused, OSError, RuntimeError) as err:
                self._refuse(src, str(err))
                continue
            self.log.info(f"Collected submission: {student} {a} (submitted {rec['timestamp']} UTC)")
        if self.refused:
            self.log.error(
                "%d submission folder(s) refused: %s",
                len(self.refused),
                "; ".join(escaped(repr(os.path.basename(p))) for p, _ in self.refused),
            )

    def _notebooks_only(self, src: str, ignore):
        """copytree's ``ignore``: of a submission folder only its notebooks (``*.ipynb`` at the top;
        a misnamed one too, which grade-class then names) cross into the course. Anything else (a
        handed-in ``figs/derivation.html``, an ``nbgrader_config.py``) is never copied where the
        course's server could serve or load it; it is named in the log for the instructor."""

        def chosen(folder: str, names: list[str]) -> set[str]:
            out = set(ignore(folder, names))
            if os.path.samefile(folder, src):
                extra = sorted(
                    n
                    for n in names
                    if n not in out
                    and (not n.endswith(".ipynb") or not os.path.isfile(os.path.join(folder, n)))
                    and n not in ("timestamp.txt", "submission_secret.txt")
                )
                if extra:
                    shown = ", ".join(escaped(repr(n)) for n in extra[:20])
                    more = f" and {len(extra) - 20} more" if len(extra) > 20 else ""
                    self.log.warning(f"Not collected (only notebooks are): {src}: {shown}{more}")
                out |= set(extra)
            return out

        return chosen

    def _copy(self, src: str, dest: str, rec: dict) -> None:
        """Into a new folder beside ``dest``, checked, then in place of ``dest``; the time rechecked
        after the copy (what was copied is no newer than it) and written to ``timestamp.txt``."""
        if self.get_size(src) > 1000 * self.coursedir.max_dir_size:
            raise Refused(f"larger than {self.coursedir.max_dir_size} kB")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = dest + ".collecting"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(
                src,
                tmp,
                symlinks=True,  # a link is copied as a link, never followed; then refused below
                copy_function=copy_owned(rec["uid"]),
                ignore=self._notebooks_only(
                    src,
                    ignore_patterns(
                        exclude=self.coursedir.ignore,
                        include=self.coursedir.include,
                        max_file_size=self.coursedir.max_file_size,
                        log=self.log,
                    ),
                ),
            )
            os.chmod(tmp, 0o755)  # the student's folder modes were copied: ours are the course's
            for dirpath, dirnames, filenames in os.walk(tmp):
                for n in dirnames + filenames:
                    path = os.path.join(dirpath, n)
                    if os.path.islink(path):  # put there after the check: refused
                        raise Refused(f"{src}/{os.path.relpath(path, tmp)} is a symbolic link")
                    os.chmod(path, 0o755 if n in dirnames else 0o644)
            rec["timestamp"] = max(rec["timestamp"], submission_time(src, rec["uid"]))
            when = rec["timestamp"].replace(tzinfo=datetime.UTC)
            with open(os.path.join(tmp, "timestamp.txt"), "w") as fh:
                fh.write(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        os.rename(tmp, dest)


def unsafe_ids(course, assignment: str) -> dict[str, str]:
    """``mlbook grade-class``: the student folders ``submitted/<id>/<assignment>`` whose id is not a
    safe one, each with why (printable: the id escaped). They are not graded (nor put in the
    gradebook or the exports)."""
    refused = {}
    for folder in sorted(course.glob(f"submitted/*/{assignment}")):
        why = student_id_problem(folder.parent.name)
        if why:
            said = f"{why}; rename the folder {folder.parent} to such an id"
            refused[folder.parent.name] = escaped(said)
    return refused


class SafeIdCollector(FileNameCollectorPlugin):
    """``nbgrader zip_collect``'s file-name reader (``c.ZipCollectApp.collector_plugin``): a file whose
    name gives a student id outside the safe set is not collected; an error line names the file and
    the rule (``zip_collect`` would otherwise make ``submitted/<that id>/`` and grade it)."""

    def collect(self, submitted_file: str):
        info = super().collect(submitted_file)
        student = info.get("student_id") if isinstance(info, dict) else None
        if isinstance(student, str) and (why := student_id_problem(student)):
            self.log.error(
                "REFUSED %s: %s; not collected (rename the file, or fix named_regexp)",
                escaped(repr(os.path.basename(submitted_file))),
                escaped(why),
            )
            return None
        return info
