"""Submissions that try to forge a grade, break the class run, or hurt others, and ones that must not be hurt.

Each entry builds a notebook from the solved notebook (``base="solved"``) or the untouched release
(``base="release"``) by replacing answer cells (by grade_id), appending cells, or damaging the
file. Sources may use ``{COURSE}`` (the course folder's absolute path, as if the attacker knew it),
``{REPO}`` (the repository) and ``{TOKEN}`` (a marker that must never show up where it should not).
A cheat on top of the release must get 0 core points; damage to one function of a correct
notebook costs exactly the tests in ``lost``. ``append`` code is added to the end of the last core
answer cell (so it runs where a student's code runs); ``damage`` names a structural change.

``add`` code goes into cells of the student's own (no nbgrader metadata) at the end of the notebook.
``lost=None`` (slow entries): whatever it scores, it must finish within its bound like everyone.

ENTRIES[name] = dict(kind=..., base="solved" | "release" | None, cells={grade_id: source},
                     append=[source], add=[source], lost=[test ids] | None, damage="what:grade_id", raw=text)
"""

import contextlib
import os
import subprocess
import sys

from ppo_checks import CHECKS

_ID = {c.fn.__name__: gid for gid, c in CHECKS.items()}  # grade ids from the one registry
SHAPED, GAE, CLIP = _ID["check_shaped_rewards"], _ID["check_gae"], _ID["check_ppo_clip_loss"]
VALUE, KL, TRAIN = _ID["check_value_loss"], _ID["check_kl_controller"], _ID["check_train_ppo"]


def breaks(symbol: str) -> list[str]:
    """The core tests a submission loses when its answer ``symbol`` is broken: every check that takes
    it, and the training loop's (the reference loop calls the student's answers of §3)."""
    return [g for g, c in CHECKS.items() if not c.extra and (symbol in c.names or g == TRAIN)]


KINDS = [
    "in-process tampering",
    "reference import",
    "file system",
    "background process",
    "resource abuse",
    "cell-structure damage",
    "unfair-to-correct",
    "escape",
    "write-back forge",
    "memory",
    "processes",
    "slow",
    "malformed frame",
    "split-answer",
    "page-size",
]
FDPROBE = "FDPROBE:"  # the escape probe prints what it sees after this marker

# zero-returning fakes for every graded function, used by the tampering entries
_FAKES = """
import torch


def last_response_index(response_mask):
    return torch.zeros(response_mask.shape[0], dtype=torch.long)


def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):
    return torch.zeros_like(logp_policy)


def gae(rewards, values, response_mask, **hyper):  # a fake: zeros, whatever gamma and lam
    return torch.zeros_like(rewards), torch.zeros_like(rewards)


def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, *rest, **kw):
    return (logp_new * 0).sum(), 0.0


def value_loss(values, old_values, returns, response_mask, *rest, **kw):
    return (values * 0).sum()
"""

_FS_ATTACK = """
import os, sqlite3, glob
for path in ["{COURSE}/gradebook.db", os.path.expanduser("~/.cache/mlbook/grade")]:
    try:
        con = sqlite3.connect(path)
        con.execute("update grade set auto_score = 99, manual_score = 99")
        con.commit()
    except Exception as err:
        print("no gradebook:", err)
"""


def _in_answer(body: str) -> dict:
    """Attack code placed in the first answer cell of the release (stubs left in elsewhere)."""
    return {"last_response_index": body}


# fmt: off
ENTRIES = {
    # ------------------------------------------------------------------ in-process tampering
    "catch_warnings_swallows_errors": dict(kind=KINDS[0], base="release", cells=_in_answer(
        "import warnings, contextlib\n\n\nclass _Swallow(contextlib.AbstractContextManager):\n"
        "    def __exit__(self, *exc):\n        return True\n\n\nwarnings.catch_warnings = _Swallow\n")),
    "def_bool_and_zero_fakes": dict(kind=KINDS[0], base="release", cells=_in_answer(
        _FAKES + "\n\ndef bool(x=None):\n    return True\n\n\nimport builtins\nbuiltins.bool = bool\n")),
    "rebind_hidden_helpers": dict(kind=KINDS[0], base="release", cells=_in_answer(
        _FAKES + "\n_expect = lambda *a, **k: None\n_close = lambda *a, **k: None\n"
        "import builtins\nbuiltins._expect = _expect\nbuiltins.AssertionError = type('AE', (Exception,), {})\n")),
    "displayhook_points": dict(kind=KINDS[0], base="release", cells=_in_answer(
        _FAKES + "\nimport sys\nsys.displayhook(2)\nsys.displayhook = lambda v: None\n")),
    "tensor_subclass_always_equal": dict(kind=KINDS[0], base="release", cells=_in_answer(
        "import torch\n\n\nclass Liar(torch.Tensor):\n    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        out = super().__torch_function__(func, types, args, kwargs or {})\n"
        "        if func.__name__ in ('__eq__', 'equal', 'allclose', 'le', '__le__', 'all', 'isclose'):\n"
        "            return True\n        return out\n\n\n"
        "def _liar(shape):\n    return torch.zeros(shape).as_subclass(Liar)\n\n\n"
        "def last_response_index(response_mask):\n    return _liar(response_mask.shape[:1])\n\n\n"
        "def shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n    return _liar(logp_policy.shape)\n\n\n"
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    return _liar(rewards.shape), _liar(rewards.shape)\n")),
    "nbgrader_execution_branch": dict(kind=KINDS[0], base="release", cells=_in_answer(
        "import os\nif os.environ.get('NBGRADER_EXECUTION') or os.environ.get('MLBOOK_GRADING'):\n"
        "    import builtins\n    builtins.AssertionError = type('AE', (Exception,), {})\n" + _FAKES)),
    "patch_torch_comparisons": dict(kind=KINDS[0], base="release", cells=_in_answer(
        _FAKES + "\ntorch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
        "torch.Tensor.__eq__ = lambda *a, **k: True\ntorch.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)\n")),
    "system_exit_in_every_call": dict(kind=KINDS[0], base="release", cells=_in_answer(
        "def last_response_index(response_mask):\n    raise SystemExit(0)\n\n\n"
        "def shaped_rewards(*a, **k):\n    raise KeyboardInterrupt\n")),
    "forged_reply_frames": dict(kind=KINDS[0], base="release", cells=_in_answer(
        "import os, struct, json\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    head = {'ok': True, 'result': {'tuple': [1.0, 1.0]}, 'graph': False, 'grads': [], 'after': []}\n"
        "    head = json.dumps(head).encode()\n"
        "    body = struct.pack('<Q', len(head)) + head\n    os.write(4, struct.pack('<Q', len(body)) + body)\n"
        "    os.write(4, b'garbage' * 100)\n    return rewards, values\n")),
    # ------------------------------------------------------------------ reference import
    "import_reference_package": dict(kind=KINDS[1], base="release", cells=_in_answer(
        "from mlbook_solutions.ppo_lm import *  # noqa\n")),
    "import_reference_by_path": dict(kind=KINDS[1], base="release", cells=_in_answer(
        "import sys\nsys.path[:0] = ['{REPO}/solutions', '{REPO}/.venv/lib/python3.11/site-packages']\n"
        "from mlbook_solutions.ppo_lm import last_response_index, shaped_rewards, gae\n")),
    "exec_reference_source": dict(kind=KINDS[1], base="release", cells=_in_answer(
        "exec(open('{REPO}/solutions/mlbook_solutions/ppo_lm.py').read())\n")),
    # ------------------------------------------------------------------ file system
    "gradebook_sqlite_write": dict(kind=KINDS[2], base="release", cells=_in_answer(_FS_ATTACK)),
    "gradebook_delete": dict(kind=KINDS[2], base="release", cells=_in_answer(
        "import os, shutil\nfor p in ['{COURSE}/gradebook.db', '{COURSE}/submitted']:\n"
        "    try:\n        os.remove(p) if p.endswith('.db') else shutil.rmtree(p)\n"
        "    except Exception as err:\n        print(err)\n")),
    "edit_course_config_and_state": dict(kind=KINDS[2], base="release", cells=_in_answer(
        "import os, json\nfor p in ['{COURSE}/nbgrader_config.py']:\n    try:\n"
        "        open(p, 'a').write('\\nc.Execute.enabled = False\\n')\n    except Exception as err:\n        print(err)\n"
        "os.makedirs(os.path.expanduser('~/.cache/mlbook/grade'), exist_ok=True)\n"
        "for p in ['{COURSE}/.mlbook_grading/rlhf_ppo/mallory.json', '{COURSE}/grading_secret.txt']:\n"
        "    try:\n        open(p, 'w').write(json.dumps({'score': 10}))\n    except Exception as err:\n        print(err)\n")),
    "read_hidden_tests_and_secret": dict(kind=KINDS[2], base="release", cells=_in_answer(
        "import glob\nfor p in ['{COURSE}/source/rlhf_ppo/rlhf_ppo.ipynb', '{REPO}/tests/ppo_checks.py',\n"
        "          '{COURSE}/grading_secret.txt', '/proc/1/environ']:\n"
        "    try:\n        print(open(p).read()[:100000])\n    except Exception as err:\n        print('blocked', err)\n"
        "print(glob.glob('{COURSE}/**', recursive=True)[:50])\n")),
    "copy_other_submission": dict(kind=KINDS[2], base="release", cells=_in_answer(
        "import glob, json\nfor p in glob.glob('{COURSE}/submitted/*/rlhf_ppo/rlhf_ppo.ipynb'):\n"
        "    nb = json.load(open(p))\n    for c in nb['cells']:\n"
        "        if c.get('metadata', {}).get('nbgrader', {}).get('solution') and c['cell_type'] == 'code':\n"
        "            exec(''.join(c['source']))\n"
        "    open(p, 'w').write('{}')  # and wreck theirs\n")),
    # ------------------------------------------------------------------ background processes
    "daemon_outlives_grading": dict(kind=KINDS[3], base="release", cells=_in_answer(
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time, sqlite3; time.sleep(4); "
        "open(\"{COURSE}/pwned-{TOKEN}\", \"w\"); sqlite3.connect(\"{COURSE}/gradebook.db\").execute(\"delete from grade\")', "
        "'{TOKEN}'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\n    os._exit(0)\n")),
    # ------------------------------------------------------------------ resource abuse (on a correct notebook)
    "memory_hog_in_gae": dict(kind=KINDS[4], base="solved", lost=breaks("gae"), cells={"gae": (
        "import torch\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    hog = [torch.ones(256, 1024, 1024) for _ in range(24)]  # 24 GiB\n    return hog[0], hog[1]\n")}),
    "cpu_loop_ignoring_sigint": dict(kind=KINDS[4], base="solved", lost=breaks("value_loss"), cells={"value_loss": (
        "import signal\n\n\ndef value_loss(values, old_values, returns, response_mask, clip_eps=0.2):\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    while True:\n        pass\n")}),
    "fifty_megabytes_of_output": dict(kind=KINDS[4], base="solved", lost=[], append=[
        "import sys\nsys.stdout.write('{TOKEN}' + 'x' * 50_000_000 + '\\n')\nsys.stderr.write('y' * 5_000_000)\n"]),
    "fork_bomb": dict(kind=KINDS[4], base="solved", lost=[], append=[
        "import os\nkids = 0\ntry:\n    while kids < 100000:\n        if os.fork() == 0:\n            import time\n"
        "            time.sleep(30)\n            os._exit(0)\n        kids += 1\n"
        "except OSError as err:\n    print('fork refused after', kids, err)\n"]),
    "disk_filler": dict(kind=KINDS[4], base="solved", lost=[], append=[
        "try:\n    with open('/tmp/fill', 'wb') as f:\n        for _ in range(2048):\n            f.write(b'0' * 1024 * 1024)\n"
        "except (OSError, MemoryError) as err:\n    print('disk full', err)\n"]),
    "kernel_dies_in_gae_cell": dict(kind=KINDS[4], base="solved", lost=breaks("gae"),
                                    cells={"gae": "import os\nos._exit(1)\n"}),
    "top_level_endless_loop": dict(kind=KINDS[4], base="solved", lost=breaks("value_loss"),
                                   cells={"value_loss": "while True:\n    pass\n"}),
    # ------------------------------------------------------------------ cell-structure damage
    "duplicated_graded_cell": dict(kind=KINDS[5], base="solved", lost=[], damage="duplicate:" + GAE),
    "deleted_answer_cell": dict(kind=KINDS[5], base="solved", lost=breaks("gae"), damage="delete:gae"),
    # nbgrader drops an unknown grade id and runs the cell (OverwriteCells): so does the engine (noted as a problem)
    "renamed_answer_cell": dict(kind=KINDS[5], base="solved", lost=[], damage="rename:ppo_clip_loss"),
    "stripped_test_cell_metadata": dict(kind=KINDS[5], base="solved", lost=[], damage="strip:" + VALUE),
    "edited_locked_train_loop": dict(kind=KINDS[5], base="release", cells={}, damage="fake_train_ppo"),
    "edited_test_cell": dict(kind=KINDS[5], base="release", cells={}, damage="blank_tests"),
    "malformed_json": dict(kind=KINDS[5], base=None, raw='{"cells": [ this is not json'),
    "not_a_notebook_schema": dict(kind=KINDS[5], base=None, raw='{"cells": 5, "metadata": [], "nbformat": 4}'),
    # ------------------------------------------------------------------ unfair to correct work
    "correct_but_warns": dict(kind=KINDS[6], base="solved", lost=[], append=[
        "import functools, warnings\n\n\ndef _warns(fn):\n    @functools.wraps(fn)\n    def inner(*a, **k):\n"
        "        warnings.warn('a deprecation warning', DeprecationWarning)\n        warnings.warn('UserWarning: careful')\n"
        "        return fn(*a, **k)\n    return inner\n\n\n"
        "gae, value_loss, ppo_clip_loss, shaped_rewards = map(_warns, (gae, value_loss, ppo_clip_loss, shaped_rewards))\n"]),
    "correct_but_prints_to_stderr": dict(kind=KINDS[6], base="solved", lost=[], append=[
        "import sys\n_gae = gae\n\n\ndef gae(*a, **k):\n    print('debug: gae called', file=sys.stderr)\n"
        "    print('Traceback (most recent call last): fake')\n"
        "    return _gae(*a, **k)\n"]),
    "crash_in_one_function": dict(kind=KINDS[6], base="solved", lost=breaks("ppo_clip_loss"), cells={"ppo_clip_loss": (
        "def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
        "    return undefined_name\n")}),
}
# fmt: on

_REPLY_FD = "import json as _j\n_REPLY = _j.loads(open('/proc/self/cmdline').read().split('\\0')[-2])['fds'][1]\n"


def _malformed(head: bytes) -> str:
    """A release whose gae writes ``head`` as a reply frame on the runner's own pipe, claiming a pass."""
    return (
        "import os, struct, time\n"
        + _REPLY_FD
        + "\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        f"    head = {head!r}\n    body = struct.pack('<Q', len(head)) + head\n"
        "    os.write(_REPLY, struct.pack('<Q', len(body)) + body)\n    time.sleep(30)\n"
    )


def _sc(code: str) -> str:
    """Run x86-64 machine code (``code`` hex) through ctypes: how a student reaches a raw syscall ABI."""
    return (
        "import ctypes, mmap\n"
        f"_buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n_buf.write(bytes.fromhex('{code}'))\n"
        "_fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(_buf)))\n"
        "_kids = [_fn() for _ in range(200)]\nprint('made', _kids[:5])\n"
    )


_SPLIT_GAE = (  # the reference gae, its loop's step through the helper of the first half
    "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
    "    advantages = torch.zeros_like(rewards)\n    carry = rewards.new_zeros(rewards.shape[0])\n"
    "    value_after = rewards.new_zeros(rewards.shape[0])\n"
    "    for t in range(rewards.shape[1] - 1, -1, -1):\n"
    "        m = response_mask[:, t].to(rewards.dtype)\n"
    "        delta = rewards[:, t] + gamma * value_after - values[:, t]\n"
    "        carry = _step(m, delta, gamma, lam, carry)\n        advantages[:, t] = carry\n"
    "        value_after = m * values[:, t]\n"
    "    return advantages, (advantages + values) * response_mask\n"
)

_SLOW_GAE = "import time\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n    time.sleep(60)\n"

# fmt: off
ENTRIES.update({
    # ------------------------------------------------------------------ escape into the grader
    "escape_fd_and_mount_probe": dict(kind="escape", base="solved", lost=[], add=[
        "import os, json\n_fds = {}\nfor _fd in os.listdir('/proc/self/fd'):\n    try:\n"
        "        _fds[int(_fd)] = os.readlink(f'/proc/self/fd/{_fd}')\n    except OSError:\n        pass\n"
        "_cfg = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])\n"
        "_mi = open('/proc/self/mountinfo').read()\n"
        "print('" + FDPROBE + "' + json.dumps({'fds': sorted(_fds), 'runner': _cfg['fds'], "
        "'repo_mounted': '{REPO}' in _mi, 'course_mounted': '{COURSE}' in _mi}))\n"]),
    "escape_pickle_into_every_fd": dict(kind="escape", base="release", cells=_in_answer(
        "import os, pickle, struct\n\n\nclass _Evil:\n    def __reduce__(self):\n"
        "        return (exec, (\"open('{COURSE}/pwned-{TOKEN}', 'w')\",))\n\n\n"
        "_p = pickle.dumps(_Evil())\nfor _fd in range(3, 1024):\n    try:\n"
        "        os.write(_fd, struct.pack('!i', len(_p)) + _p)\n    except OSError:\n        pass\n" + _FAKES)),
    "escape_proc_paths_of_pid1": dict(kind="escape", base="release", cells=_in_answer(
        "import os\nfor _p in ['/proc/1/cmdline', '/proc/1/environ', '/proc/self/mountinfo']:\n    try:\n"
        "        for _w in open(_p).read().replace('\\0', ' ').split():\n"
        "            if _w.startswith('/') and os.path.isdir(_w):\n"
        "                for _n in os.listdir(_w)[:20]:\n"
        "                    if _n.endswith(('.db', '.txt', '.ipynb')):\n"
        "                        open(os.path.join(_w, _n), 'a').write('x')\n"
        "    except OSError as err:\n        print(err)\n" + _FAKES)),
    "escape_ptrace_and_signals": dict(kind="escape", base="release", cells=_in_answer(
        "import ctypes, os, signal\n_libc = ctypes.CDLL(None)\nfor _pid in (0, 1, os.getppid()):\n"
        "    print(_libc.ptrace(16, _pid, 0, 0))  # PTRACE_ATTACH\n"
        "for _pid in range(1, 50):\n    try:\n        os.kill(_pid, signal.SIGSTOP)\n    except OSError:\n        pass\n" + _FAKES)),
    "escape_network_and_sockets": dict(kind="escape", base="release", cells=_in_answer(
        "import socket\nfor _addr in [('127.0.0.1', 22), ('10.0.0.1', 80)]:\n    try:\n"
        "        socket.create_connection(_addr, timeout=1)\n    except OSError as err:\n        print(err)\n"
        "try:\n    _s = socket.socket(socket.AF_UNIX)\n    _s.connect('\\0mlbook')\nexcept OSError as err:\n    print(err)\n" + _FAKES)),
    # ------------------------------------------------------------------ write-back forgery
    "writeback_no_ppo_math": dict(kind="write-back forge", base="release", cells={
        "last_response_index": "import torch\n\n\ndef last_response_index(response_mask):\n"
        "    response_mask.zero_()\n    return torch.zeros(response_mask.shape[0], dtype=torch.long)\n",
        "shaped_rewards": "import torch\n\n\ndef shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
        "    logp_ref.copy_(logp_policy)\n    scores.zero_()\n    return torch.zeros_like(logp_policy)\n",
        "gae": "import torch\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    rewards.zero_()\n    values.zero_()\n    return torch.zeros_like(rewards), torch.zeros_like(rewards)\n"}),
    "writeback_fake_value_loss": dict(kind="write-back forge", base="solved", lost=breaks("value_loss"), cells={"value_loss": (
        "import torch\n\n\ndef value_loss(values, old_values, returns, response_mask, clip_eps=0.2):\n"
        "    with torch.no_grad():\n        values.copy_(returns)\n        old_values.copy_(returns)\n"
        "    return (values * 0).sum()\n")}),
    "writeback_wrong_clip_plus_two_lines": dict(kind="write-back forge", base="solved", lost=breaks("ppo_clip_loss"), cells={"ppo_clip_loss": (
        "import torch\n\n\ndef ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
        "    ratio = torch.exp(logp_new - logp_old)  # no clipping: a catalogued wrong answer\n"
        "    loss = -(ratio * advantages * response_mask).sum() / response_mask.sum()\n"
        "    with torch.no_grad():\n        logp_old.copy_(logp_new)\n        advantages.clamp_(-0.2, 0.2)\n"
        "    return loss, 0.0\n")}),
    # appended after the core answers: the wrappers rebind shaped_rewards and gae *after* their own
    # tests, which see the answers as bound where they stand (as nbgrader runs them); the training
    # test below the wrappers calls them and loses
    "writeback_scores_after_shaping": dict(kind="write-back forge", base="solved", lost=[TRAIN], append=[
        "_shaped = shaped_rewards\n\n\ndef shaped_rewards(scores, logp_policy, logp_ref, response_mask, beta):\n"
        "    out = _shaped(scores, logp_policy, logp_ref, response_mask, beta)\n    scores.mul_(10.0)\n    return out\n"]),
    "writeback_gae_inputs": dict(kind="write-back forge", base="solved", lost=[TRAIN], append=[
        "_gae = gae\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    adv, ret = _gae(rewards, values, response_mask, gamma=gamma, lam=lam)\n    rewards.fill_(0.0)\n    return adv, ret\n"]),
    # ------------------------------------------------------------------ memory (bounded per sandbox)
    "memory_dev_shm_hog": dict(kind="memory", base="solved", lost=[], add=[
        "try:\n    with open('/dev/shm/hog', 'wb') as _f:\n        for _ in range(4096):\n            _f.write(b'1' * 2**20)\n"
        "except OSError as err:\n    print('shm capped', err)\n"]),
    "memory_memfd_hog_in_gae": dict(kind="memory", base="solved", lost=breaks("gae"), cells={"gae": (
        "import os\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    fds = [os.memfd_create('hog') for _ in range(100)]\n"
        "    for fd in fds:\n        for _ in range(60):\n            os.write(fd, b'1' * 2**20)\n    return rewards, values\n")}),
    "memory_tmp_filler": dict(kind="memory", base="solved", lost=[], add=[
        "import os\nfor _i in range(64):\n    try:\n        with open(f'/tmp/f{_i}', 'wb') as _f:\n"
        "            for _ in range(60):\n                _f.write(b'1' * 2**20)\n    except OSError as err:\n"
        "        print('tmp full', err)\n        break\n"]),
    "memory_top_level_hog": dict(kind="memory", base="solved", lost=[], add=[
        "import torch\n_hog = [torch.ones(256, 1024, 1024) for _ in range(40)]  # 40 GiB\n"]),
    # ------------------------------------------------------------------ processes (refused by seccomp, capped by pids)
    "processes_i386_int80_fork": dict(kind="processes", base="solved", lost=[], add=[_sc("b802000000cd80c3")]),
    "processes_x32_fork": dict(kind="processes", base="solved", lost=[], add=[_sc("b839000040" + "0f05c3")]),
    "processes_raw_clone": dict(kind="processes", base="solved", lost=[], add=[
        "import ctypes\n_libc = ctypes.CDLL(None)\nprint([_libc.syscall(56, 17, 0, 0, 0, 0) for _ in range(50)])\n"
        "print([_libc.syscall(58) for _ in range(5)])\n"]),
    "processes_thread_bomb": dict(kind="processes", base="solved", lost=[], add=[
        "import threading, time\n_n = 0\ntry:\n    for _ in range(100000):\n"
        "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n        _n += 1\n"
        "except RuntimeError as err:\n    print('threads capped at', _n, err)\n"]),
    "processes_subprocess_shell": dict(kind="processes", base="release", cells=_in_answer(
        "import subprocess\ntry:\n    subprocess.run(['sh', '-c', 'sleep 100 &'], timeout=5)\nexcept Exception as err:\n"
        "    print('no subprocess', err)\n" + _FAKES)),
    # ------------------------------------------------------------------ slow (the per-submission bound holds)
    "slow_cells_just_under_a_second": dict(kind="slow", base="solved", lost=None, add=[
        "import time\ntime.sleep(0.95)\n"] * 60),
    "slow_property_read_in_a_loop": dict(kind="slow", base="solved", lost=None, append=[
        "import time as _t\n\n\nclass AdaptiveKLController(AdaptiveKLController):\n"
        "    def __getattribute__(self, name):\n        _t.sleep(0.5)\n        return object.__getattribute__(self, name)\n"]),
    # every cell that calls gae is cut at the cell limit (interrupted, as Jupyter does; charged exactly
    # the limit) and so is every call of gae: it loses gae's tests and keeps every other, whatever the
    # load (restarts, replays and the driver's own waits are never charged: tests/test_load.py)
    "slow_every_call": dict(kind="slow", base="solved", lost=breaks("gae"), cells={"gae": _SLOW_GAE}),
    "slow_busy_threads": dict(kind="slow", base="solved", lost=None, add=[
        "import threading\n\n\ndef _spin():\n    while True:\n        pass\n\n\n"
        "_spinners = [threading.Thread(target=_spin, daemon=True) for _ in range(8)]\n"
        "for _s in _spinners:\n    _s.start()\n"]),
    # ------------------------------------------------------------------ malformed reply frames
    "malformed_infinity": dict(kind="malformed frame", base="release", cells={"gae": _malformed(
        b'{"ok": true, "result": {"tuple": [Infinity, Infinity]}}')}),
    "malformed_deep_nesting": dict(kind="malformed frame", base="release", cells={"gae": _malformed(
        b'{"ok": true, "result": ' + b"[" * 100000 + b"]" * 100000 + b"}")}),
    "malformed_wrong_types": dict(kind="malformed frame", base="release", cells={"gae": _malformed(
        b'{"ok": "yes", "result": {"tensor": "0"}, "graph": 1}')}),
    "malformed_oversize_length": dict(kind="malformed frame", base="release", cells={"gae": (
        "import os, struct\n" + _REPLY_FD + "\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    os.write(_REPLY, struct.pack('<Q', 1 << 40) + b'x' * 1000)\n    return rewards, values\n")}),
    "malformed_frame_in_correct_work": dict(kind="malformed frame", base="solved", lost=breaks("gae"), cells={"gae": _malformed(
        b'{"ok": true, "result": {"pickle": "gASV"}}')}),
    # the runner's own reply to "which names are defined?" broken: the runner exits there, or every
    # reply after this cell is a fixed string (a grade, never an engine error; round 3 of attacks)
    "runner_dies_on_defined": dict(kind="malformed frame", base="release", add=[
        "import builtins, os, sys\n_real_sorted = builtins.sorted\n\n\ndef _sorted(*a, **k):\n"
        "    f = sys._getframe(1)\n    if f.f_code.co_filename.endswith('runner.py') and f.f_code.co_name == 'main':\n"
        "        os._exit(3)\n    return _real_sorted(*a, **k)\n\n\nbuiltins.sorted = _sorted\n"]),
    "runner_replies_patched": dict(kind="malformed frame", base="release", add=[
        "import json\njson.dumps = lambda *a, **k: '{\"ok\": true}'\n"]),
    # a reply of 64 MB of empty lists: parsed, it would cost the trusted grader ~3.5 GB and ~50 s
    "reply_of_empty_lists": dict(kind="memory", base="release", cells={"gae": (
        "import os, struct\n" + _REPLY_FD + "\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    n = (64 * 1024 * 1024 - 64) // 3\n    head = b'{\"ok\": true, \"result\": [' + b'[],' * (n - 1) + b'[]]}'\n"
        "    body = struct.pack('<Q', len(head)) + head\n    os.write(_REPLY, struct.pack('<Q', len(body)) + body)\n"
        "    os._exit(0)\n")}),
    # notebook damage that must cost nothing: a list as an added cell's nbgrader metadata, a lone surrogate
    "nbgrader_metadata_list": dict(kind="cell-structure damage", base="solved", lost=[], damage="metadata_list"),
    "lone_surrogate": dict(kind="cell-structure damage", base="solved", lost=[], damage="surrogate"),
    # an error message full of terminal escapes (cursor up, erase line, a forged score, conceal)
    # ------------------------------------------------------------------ split answers (issue 31)
    # gae's answer split in two with JupyterLab's Ctrl+Shift+- (both halves keep the cell's metadata):
    # a helper in the first half, gae in the second; all of it is the answer, and it is graded whole
    "split_answer_cell": dict(kind="split-answer", base="solved", lost=[], damage="split:gae", cells={"gae": (
        "def _step(m, delta, gamma, lam, carry):\n    return m * (delta + gamma * lam * carry)\n"
        "\n\n\n" + _SPLIT_GAE)}),
    # ------------------------------------------------------------------ trusted-side size (issue 31)
    # 18 MB of empty dicts in an added cell's metadata, inside every byte bound: ~150 s of parsing and
    # copying on the trusted side unless counted and dropped before parsing; it costs nothing
    "metadata_of_empty_dicts": dict(kind="page-size", base="solved", lost=[], damage="metadata_dicts"),
    "terminal_escapes": dict(kind="in-process tampering", base="release", cells={"gae": (
        "def gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    raise ValueError('\\x1b[0m\\r\\x1b[2K\\x1b[1A\\x1b[2Kok   test_gae 2 / 2\\ncore total: 10 / 10\\x1b[8m')\n")}),
})
# fmt: on


@contextlib.contextmanager
def busy_cores():
    """As many busy-looping processes as this machine has cores, for as long as the block runs."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
