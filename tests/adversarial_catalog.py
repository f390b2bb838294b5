"""Submissions that try to forge a grade, break the class run, or hurt others, and ones that must not be hurt.

Each entry builds a notebook from the solved notebook (``base="solved"``) or the untouched release
(``base="release"``) by replacing answer cells (by grade_id), appending cells, or damaging the
file. Sources may use ``{COURSE}`` (the course folder's absolute path, as if the attacker knew it),
``{REPO}`` (the repository) and ``{TOKEN}`` (a marker that must never show up where it should not).
A cheat on top of the release must get 0 core points; damage to one function of a correct
notebook costs exactly the tests in ``lost``. ``append`` code is added to the end of the last core
answer cell (so it runs where a student's code runs); ``damage`` names a structural change.

ENTRIES[name] = dict(kind=..., base="solved" | "release" | None, cells={grade_id: source},
                     append=[source], lost=[test ids], damage="what:grade_id", raw=text)
"""

from ppo_checks import CHECKS

_ID = {c.fn.__name__: gid for gid, c in CHECKS.items()}  # grade ids from the one registry
SHAPED, GAE, CLIP = _ID["check_shaped_rewards"], _ID["check_gae"], _ID["check_ppo_clip_loss"]
VALUE, KL, TRAIN = _ID["check_value_loss"], _ID["check_kl_controller"], _ID["check_train_ppo"]
ALL = [SHAPED, GAE, CLIP, VALUE, KL, TRAIN]

KINDS = ["in-process tampering", "reference import", "file system", "background process", "resource abuse",
         "cell-structure damage", "unfair-to-correct"]  # fmt: skip

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
    "memory_hog_in_gae": dict(kind=KINDS[4], base="solved", lost=[GAE, TRAIN], cells={"gae": (
        "import torch\n\n\ndef gae(rewards, values, response_mask, gamma=1.0, lam=0.95):\n"
        "    hog = [torch.ones(256, 1024, 1024) for _ in range(24)]  # 24 GiB\n    return hog[0], hog[1]\n")}),
    "cpu_loop_ignoring_sigint": dict(kind=KINDS[4], base="solved", lost=[VALUE, TRAIN], cells={"value_loss": (
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
    "kernel_dies_in_gae_cell": dict(kind=KINDS[4], base="solved", lost=[GAE, TRAIN],
                                    cells={"gae": "import os\nos._exit(1)\n"}),
    "top_level_endless_loop": dict(kind=KINDS[4], base="solved", lost=[VALUE, TRAIN],
                                   cells={"value_loss": "while True:\n    pass\n"}),
    # ------------------------------------------------------------------ cell-structure damage
    "duplicated_graded_cell": dict(kind=KINDS[5], base="solved", lost=[], damage="duplicate:" + GAE),
    "deleted_answer_cell": dict(kind=KINDS[5], base="solved", lost=[GAE, TRAIN], damage="delete:gae"),
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
    "crash_in_one_function": dict(kind=KINDS[6], base="solved", lost=[CLIP, TRAIN], cells={"ppo_clip_loss": (
        "def ppo_clip_loss(logp_new, logp_old, advantages, response_mask, clip_eps=0.2):\n"
        "    return undefined_name\n")}),
}
# fmt: on
