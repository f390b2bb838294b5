"""How long the chapter takes, and the systems figures of §4.2, measured on this machine.

    python scripts/benchmark.py [--repeats 3] [--only chapter|systems|grading|command|pages|tail]

Chapter targets on a 2-core CPU: execution <= 30 s (plus <= 30 s for the exercises); the line
"§4.2 cells" says what the section's measurements add. Grading targets (issue 16): one correct
submission graded by the sandboxed engine <= 5 s (median); the whole `mlbook grade` command on it,
as a user runs it, <= 4 s wall on a quiet machine (issue 32; the engine's share and the CPU time
of the command and its sandbox printed with it; `--only command` measures just that); a class of
16 mixed submissions graded
by `mlbook grade-class` >= 4x faster than sequential `nbgrader autograde` on the same
submissions, both measured in this run; and what the sandbox's bounds cost: the start-up (and close)
of one sandbox with its cgroup and without (memfd denied instead). Pages (issue 31): formgrader's
submission page and the feedback page each render in <= 3 s of CPU for the solved notebook and every
page-size kind of tests/xss_payloads.py (`--only pages`; tests/test_xss.py bounds their tag count,
which is what the render's time follows).
The tail (issue 32, docs/scale.md; `--only tail` alone, ~15 min on 2 cores, not part of a plain run):
per-submission p50/p95/p99 of one grade-class run over the correct styles of tests/fairness_styles.py
and the slow-but-honest entries of tests/adversarial_catalog.py (CPU and wall, from grade-class's own
records), what ten budget-exhausting submissions add to a class of 16, and a student's kernel running
the chapter (peak memory, CPU seconds): the one-machine ceiling. Prints the markdown rows of scale.md.
Systems targets (issues 11, 19): the KV-cached sampler >= 8x faster than the naive one at 64 new
tokens, batch 64, printed next to its bound (the naive sampler over a one-token-per-step floor,
`time_samplers`); the roofline model's generation share within a factor 2 of the measured one across the
sweep over response length (batch 64) and batch size (16, 64, 128 at 64 new tokens); rows outside
are listed. Reports medians of --repeats runs (not a test: timings are noisy).
"""

import argparse
import contextlib
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from functools import partial

import nbformat
import torch
from mlbook_solutions.ppo_lm import PPOConfig, collect_rollouts, ppo_update
from mlbook_tools.classgrade import grade_class
from mlbook_tools.config import layout
from mlbook_tools.grading import grade_notebook, run_nbgrader, use_kernel_autograde
from nbclient import NotebookClient

from mlbook.posttrain.roofline import Shape, measure_machine
from mlbook.posttrain.systems import (
    calibrate_latency,
    format_sweep,
    predicted_split,
    sweep_time_split,
    time_samplers,
)
from mlbook.posttrain.toy_lm import ToyLMConfig, build_models, good_count_reward

ROOT = layout().root
sys.path.insert(0, str(ROOT / "tests"))
import grading_catalog as cat  # noqa: E402

SWEEP_LENGTHS, SWEEP_BATCH, SWEEP_BATCHES, EPOCHS = (8, 16, 32, 64, 128), 64, (16, 64, 128), 4


def execute(path: pathlib.Path) -> tuple[float, float]:
    """Seconds to execute the notebook, and the seconds its §4.2 cells took (0 if it has none)."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=True).execute()
    total, section, in_42 = time.perf_counter() - t0, 0.0, False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "### 4." in cell.source:
            in_42 = "### 4.2" in cell.source
        if in_42 and cell.cell_type == "code" and "execution" in cell.metadata:
            ex = cell.metadata["execution"]
            start, end = (
                datetime.fromisoformat(ex[k])
                for k in ("iopub.execute_input", "shell.execute_reply")
            )
            section += (end - start).total_seconds()
    return total, section


def chapter_lines(repeats: int) -> list[tuple[str, list[float]]]:
    rows = []
    for nb in sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")):
        runs = [execute(nb) for _ in range(repeats)]
        rows.append((f"execute {nb.name}", [t for t, _ in runs]))
        if any(s for _, s in runs):
            rows.append((f"  of which §4.2 cells ({nb.name})", [s for _, s in runs]))
    return rows


def _class_of_16(course: pathlib.Path) -> None:
    """4 solved, 4 untouched releases, 4 with classic mistakes, 4 with equivalent correct forms."""
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    wrong = sorted(cat.WRONG)
    correct = sorted(cat.CORRECT)
    for i in range(16):
        nb = nbformat.read(
            solved if i % 4 != 1 else course / "release" / "rlhf_ppo" / "rlhf_ppo.ipynb",
            as_version=4,
        )
        answers = {}
        if i % 4 == 2:
            answers = {cat.WRONG[w][1]: cat.WRONG[w][2] for w in wrong[i::7][:2]}
        elif i % 4 == 3:
            answers = dict(cat.CORRECT[c] for c in correct[i % len(correct) :][:2])
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell.source = answers[gid]
        target = course / "submitted" / f"s{i:02d}" / "rlhf_ppo" / "rlhf_ppo.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)


def _fresh_course(tmp: pathlib.Path, name: str) -> pathlib.Path:
    course = tmp / name
    course.mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "autograde" / "source", course / "source")
    if name == "nbgrader":  # the reference: plain nbgrader in a kernel, as before the sandbox
        use_kernel_autograde(course)
    run_nbgrader(["generate_assignment", "rlhf_ppo", "--force"], course)
    _class_of_16(course)
    return course


def _cpu_group() -> pathlib.Path | None:
    """A cpuacct cgroup of its own for the measured command: the sandbox's groups are made under the
    grader's own, so its ``cpuacct.usage`` counts the command and every sandboxed process (which are
    killed, not waited for, and so never reach RUSAGE_CHILDREN). None where no group can be made."""
    from mlbook_tools import cgroups

    parent = cgroups.own_cgroup("cpuacct")
    if parent is None:
        return None
    group = parent / f"mlbook-bench-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
    except OSError:
        return None
    return group


def command_rows(repeats: int) -> list:
    """``mlbook grade`` on one correct notebook as a user runs it: the whole command (interpreter
    start, imports, the sandbox, the report), its wall time, the engine's share (``grade_notebook``,
    the ``seconds`` of --json), and the CPU time of the command and of every process under it, the
    sandbox's included (user + sys, from a cpuacct cgroup of its own). CPU time is what a busy machine
    changes least (the sandbox and the grader overlap on two cores: wall can be less than CPU)."""
    import json
    import resource
    import subprocess

    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    cmd = [str(pathlib.Path(sys.executable).with_name("mlbook")), "grade", str(solved), "--json"]
    group = _cpu_group()
    if group is not None:  # the command enters the group before it becomes mlbook
        enter = 'echo $$ > "$0" && exec "$@"'
        cmd = ["/bin/sh", "-c", enter, str(group / "cgroup.procs"), *cmd]
    walls, engines, cpus = [], [], []
    try:
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            usage0 = int((group / "cpuacct.usage").read_text()) if group else 0
            t0 = time.perf_counter()
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            walls.append(time.perf_counter() - t0)
            if group is not None:
                cpus.append((int((group / "cpuacct.usage").read_text()) - usage0) / 1e9)
            else:
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            if run.returncode != 0:
                raise RuntimeError(f"mlbook grade failed:\n{run.stderr[-2000:]}")
            result = json.loads(run.stdout)
            if result["score"] != result["max_score"]:
                raise RuntimeError(f"the solved notebook lost core points: {run.stdout[:2000]}")
            engines.append(float(result["seconds"]))
    finally:
        if group is not None:
            group.rmdir()
    share = statistics.median(e / w for e, w in zip(engines, walls, strict=True))
    what = "the command and its sandbox" if group else "the command (its sandbox not counted)"
    return [
        ("mlbook grade <solved> --json: whole command, wall (<= 4 s quiet)", walls),
        (f"  of which the engine (grade_notebook), {share:.0%} of it", engines),
        (f"  CPU of {what}, user+sys", cpus),
    ]


def grading_rows(repeats: int) -> list:
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    rows = []
    for label, path in (
        ("grade one correct submission (sandboxed)", solved),
        ("grade the untouched release (sandboxed)", ROOT / "chapters" / "rlhf_ppo.ipynb"),
    ):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            grade_notebook(path)
            times.append(time.perf_counter() - t0)
        rows.append((label, times))
        if path == solved:
            rows += command_rows(repeats)
    with tempfile.TemporaryDirectory() as tmp:
        ours = _fresh_course(pathlib.Path(tmp), "engine")
        theirs = _fresh_course(pathlib.Path(tmp), "nbgrader")
        t0 = time.perf_counter()
        grade_class(ours, "rlhf_ppo", progress=False, out=open(os.devnull, "w"))
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_nbgrader(["autograde", "rlhf_ppo", "--force"], theirs, check=False)
        t_theirs = time.perf_counter() - t0
    rows.append((f"class of 16: mlbook grade-class ({os.cpu_count()} workers)", [t_ours]))
    rows.append(("class of 16: sequential nbgrader autograde", [t_theirs]))
    rows.append(
        (f"class of 16: speed-up {t_theirs / t_ours:.2f}x (target >= 4x)", [t_theirs / t_ours])
    )
    rows += _bounds_rows(repeats)
    return rows


def _bounds_rows(repeats: int) -> list:
    """Start and close one sandbox (staging cached), with its cgroup and without one."""
    from mlbook_tools import sandbox

    rows = []
    for label, env in (
        ("sandbox start+close, cgroup + seccomp", None),
        ("sandbox start+close, no cgroup", "1"),
    ):
        old = os.environ.pop("MLBOOK_NO_CGROUP", None)
        if env:
            os.environ["MLBOOK_NO_CGROUP"] = env
        sandbox.cgroups_available.cache_clear()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sandbox.Runner().close()
            times.append(time.perf_counter() - t0)
        rows.append((label, times))
        os.environ.pop("MLBOOK_NO_CGROUP", None)
        if old is not None:
            os.environ["MLBOOK_NO_CGROUP"] = old
        sandbox.cgroups_available.cache_clear()
    return rows


def page_rows(repeats: int) -> list:
    """CPU seconds to render formgrader's submission page and the feedback page (target <= 3 s each)."""
    import json

    import xss_payloads as X
    from mlbook_tools import build
    from pages_support import autograded, feedback_page, formgrader_page

    release = nbformat.reads(build.course_release("rlhf_ppo"), as_version=4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("honest", *X.PAGE_SIZE_KINDS):
            if kind == "honest":
                student = json.loads(
                    (ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb").read_text()
                )
            else:
                student = X.size_notebook(release, kind)
            path = pathlib.Path(tmp) / f"{kind}.ipynb"
            nbformat.write(autograded(student), path)
            for render in (formgrader_page, feedback_page):
                times = []
                for _ in range(repeats):
                    t0 = time.process_time()
                    render(path)
                    times.append(time.process_time() - t0)
                rows.append((f"page {render.__name__} {kind} (CPU, target <= 3 s)", times))
    return rows


# ------------------------------------------------------------------ the tail (issue 32, docs/scale.md)
TAIL_BUDGET = 20.0  # charged seconds: the class runs' --budget (a solved notebook is charged ~6 s)
EXHAUSTING = (  # catalog entries that spend a whole budget, each its own way (two of each: ten)
    "slow_busy_threads",  # threads spinning beside the checks: their CPU is charged
    "top_level_endless_loop",  # a cell cut at its limit
    "cpu_loop_ignoring_sigint",  # calls that ignore the interrupt: killed, restarted
    "slow_cells_just_under_a_second",  # sixty sleeps: time asleep inside a request is charged
    "slow_every_call",  # every call of gae sleeps past the call limit
)
LAB_MINUTES = 10  # the synchronous lab: every student runs the whole chapter once within this
_PROBE = """import json as _json, resource as _resource
_s, _c = _resource.getrusage(_resource.RUSAGE_SELF), _resource.getrusage(_resource.RUSAGE_CHILDREN)
_rss = next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]
print("PROBE" + _json.dumps({"cpu": _s.ru_utime + _s.ru_stime, "child_cpu": _c.ru_utime + _c.ru_stime,
      "peak_kib": _s.ru_maxrss, "child_peak_kib": _c.ru_maxrss, "rss_kib": int(_rss)}))
"""


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _percentiles(xs: list[float]) -> tuple[float, ...]:
    """p50, p95, p99 and the maximum (inclusive quantiles: below 100 samples p99 is interpolated
    between the two largest, so it says little more than the maximum)."""
    if len(xs) < 2:
        return (xs[0],) * 4 if xs else (float("nan"),) * 4
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return q[49], q[94], q[98], max(xs)


@contextlib.contextmanager
def _cpu_clock():
    """This process in a cpuacct group of its own, and with it every worker and sandbox it starts
    (a sandbox makes its groups under its grader's); yields the group's CPU seconds so far as a
    function, or None where no group can be made."""
    from mlbook_tools.cgroups import own_cgroup

    home = own_cgroup("cpuacct")
    group = _cpu_group()
    if group is None:
        yield None
        return
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):  # a sandbox still being torn down: left behind, empty
            group.rmdir()


class _Lines:
    """grade-class's ``out``: when each student's line was printed, (wall, CPU seconds so far)."""

    def __init__(self, students, cpu):
        self.students, self.cpu, self.at = set(students), cpu, {}

    def write(self, text: str) -> None:
        who = text.split(" ", 1)[0]
        if who in self.students and who not in self.at:
            self.at[who] = (time.perf_counter(), self.cpu() if self.cpu else float("nan"))

    def flush(self) -> None:
        pass


def _class_run(course: pathlib.Path, cpu, **kw) -> dict:
    """One ``grade_class`` run: its entries, when each line came, its wall and CPU seconds."""
    students = [p.parts[-3] for p in course.glob("submitted/*/rlhf_ppo/rlhf_ppo.ipynb")]
    lines = _Lines(students, cpu)
    cpu0, t0 = cpu() if cpu else float("nan"), time.perf_counter()
    results = grade_class(course, "rlhf_ppo", progress=False, out=lines, **kw)
    wall = time.perf_counter() - t0
    cpu_all = cpu() - cpu0 if cpu else float("nan")
    bad = {s: e.why for s, e in results.items() if e.result is None}
    if bad:
        raise RuntimeError(f"not graded: {bad}")
    return dict(results=results, at=lines.at, wall=wall, cpu=cpu_all, start=(t0, cpu0))


def _row(label: str, n: int, cpus: list[float], walls: list[float]) -> str:
    c, w = _percentiles(cpus), _percentiles(walls)
    return (
        f"| {label} | {n} | {' / '.join(f'{x:.1f}' for x in c)} | "
        f"{' / '.join(f'{x:.1f}' for x in w)} |"
    )


def tail_per_submission(tmp: pathlib.Path, cpu) -> list[str]:
    """One grade-class run, one worker, over the correct styles and the slow-but-honest entries:
    each one's CPU (the group's, from the line before its own to its own: its worker, sandbox and
    the parent's recording) and wall (the ``seconds`` grade-class records: its worker, from reading
    the file to writing the autograded notebook). A warm-up student, sorted first, takes the
    worker's start-up. Limits: the shared test class's (tests/graded_class.py, budget 45 s)."""
    import adversarial_catalog as adv
    import graded_class as gc
    from fairness_reference import student as style_student
    from fairness_styles import STYLES, style_notebook

    course = gc.new_course(tmp / "tail")
    gc.submit(course, "a_warm_up", gc.SOLVED.read_text())
    base = nbformat.read(gc.SOLVED, as_version=4)
    styles = [style_student(n) for n in STYLES]
    for name in STYLES:
        gc.submit(course, style_student(name), nbformat.writes(style_notebook(base, STYLES[name])))
    slow = [n for n, e in adv.ENTRIES.items() if e["kind"] == "slow" and e.get("lost") is None]
    for name in slow:
        gc.submit(course, name, gc.build_submission(adv.ENTRIES[name], course))
    print(f"tail run: {len(styles)} styles, {len(slow)} slow-but-honest, one worker; {_load()}")
    run = _class_run(course, cpu, workers=1, limits=gc.LIMITS)
    order = sorted(run["at"], key=lambda s: run["at"][s][0])
    cpu_of = {
        s: run["at"][s][1] - run["at"][p][1] for p, s in zip(order[:-1], order[1:], strict=True)
    }
    wall_of = {s: run["results"][s].seconds for s in order}
    t_first = run["at"][order[0]][0] - run["start"][0]
    c_first = run["at"][order[0]][1] - run["start"][1]
    print(
        f"  run {run['wall']:.0f} s wall, {run['cpu']:.0f} s CPU; start-up + warm-up "
        f"{t_first:.1f} s wall, {c_first:.1f} s CPU (left out below); {_load()}"
    )
    for name in slow:
        core = run["results"][name].result.core
        print(
            f"  {name}: {cpu_of[name]:.1f} s CPU, {wall_of[name]:.1f} s wall, "
            f"core {core.score:g}/{core.max_score:g}"
        )
    head = [
        "| submissions (one worker) | n | CPU s: p50 / p95 / p99 / max | wall s: p50 / p95 / p99 / max |",
        "|---|---|---|---|",
    ]
    return [
        *head,
        _row(
            "correct styles (tests/fairness_styles.py)",
            len(styles),
            [cpu_of[s] for s in styles],
            [wall_of[s] for s in styles],
        ),
        _row(
            "slow-but-honest (adversarial_catalog, kind slow, lost=None)",
            len(slow),
            [cpu_of[s] for s in slow],
            [wall_of[s] for s in slow],
        ),
        _row(
            "both",
            len(styles) + len(slow),
            [cpu_of[s] for s in [*styles, *slow]],
            [wall_of[s] for s in [*styles, *slow]],
        ),
    ]


def tail_exhausting(tmp: pathlib.Path, cpu) -> list[str]:
    """The class of 16 of the grading rows graded twice at ``--budget TAIL_BUDGET``, the second time
    with ten budget-exhausting submissions more: what they add, against the backstop's arithmetic."""
    import adversarial_catalog as adv
    import graded_class as gc
    from mlbook_tools.grading import course_limits

    plain, loaded = _fresh_course(tmp, "plain"), _fresh_course(tmp, "loaded")
    added = [f"x{k}_{EXHAUSTING[k % len(EXHAUSTING)]}" for k in range(10)]
    for student in added:
        name = student.split("_", 1)[1]
        gc.submit(loaded, student, gc.build_submission(adv.ENTRIES[name], loaded))
    workers = os.cpu_count() or 1
    runs = {}
    for label, course in (("class of 16", plain), ("+ ten budget-exhausting", loaded)):
        print(f"{label}: --budget {TAIL_BUDGET:g}, {workers} workers; {_load()}")
        runs[label] = _class_run(course, cpu, workers=workers, budget=TAIL_BUDGET)
        print(f"  {runs[label]['wall']:.0f} s wall, {runs[label]['cpu']:.0f} s CPU; {_load()}")
    limits = course_limits(loaded).replace(budget_seconds=TAIL_BUDGET)
    backstop = TAIL_BUDGET * limits.wall_factor + limits.grace_seconds
    base, more = runs["class of 16"], runs["+ ten budget-exhausting"]
    walls = [more["results"][s].seconds for s in added]
    for s in added:
        core = more["results"][s].result.core
        print(
            f"  {s}: {more['results'][s].seconds:.1f} s wall, core {core.score:g}/{core.max_score:g}"
        )
    d_wall, d_cpu = more["wall"] - base["wall"], more["cpu"] - base["cpu"]
    return [
        f"| class run (`grade-class --workers {workers} --budget {TAIL_BUDGET:g}`) | wall s | CPU s |",
        "|---|---|---|",
        f"| class of 16 | {base['wall']:.0f} | {base['cpu']:.0f} |",
        f"| the same + ten budget-exhausting submissions | {more['wall']:.0f} | {more['cpu']:.0f} |",
        f"| added by the ten | {d_wall:.0f} | {d_cpu:.0f} |",
        f"| added per exhausting submission, worker-seconds (added wall x {workers} / 10; CPU / 10) "
        f"| {d_wall * workers / 10:.1f} | {d_cpu / 10:.1f} |",
        f"| one exhausting submission as grade-class records it (wall: median / max) "
        f"| {statistics.median(walls):.1f} / {max(walls):.1f} | - |",
        f"| arithmetic: the budget (charged) / its backstop (budget x wall_factor {limits.wall_factor:g} "
        f"+ grace {limits.grace_seconds:g}) | {TAIL_BUDGET:g} / {backstop:g} | - |",
    ]


def _lab_server_mib() -> float:
    """RSS of a JupyterLab server (what a hub's single-user server runs) started with no browser,
    a few seconds after it listens."""
    import subprocess

    lab = pathlib.Path(sys.executable).with_name("jupyter-lab")
    with tempfile.TemporaryDirectory() as home:
        cmd = [
            str(lab),
            "--no-browser",
            "--port=0",
            "--ip=127.0.0.1",
            f"--ServerApp.root_dir={home}",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": home}
        proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        try:
            for line in proc.stderr:
                if "http://127.0.0.1" in line:
                    break
            else:
                raise RuntimeError("jupyter-lab did not start")
            time.sleep(3)
            status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
            return (
                int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1]) / 1024
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def tail_ceiling() -> list[str]:
    """A student's kernel running the solved chapter (nbclient, as a student's Run All): its RSS
    idle and at peak (its children's peak added), CPU seconds (user+sys, children included), wall."""
    import json

    nb = nbformat.read(ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb", as_version=4)
    nb.cells = [nbformat.v4.new_code_cell(_PROBE), *nb.cells, nbformat.v4.new_code_cell(_PROBE)]
    print(f"chapter in a kernel: {_load()}")
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    wall = time.perf_counter() - t0
    idle, end = (
        json.loads(next(o["text"] for o in c.outputs if "PROBE" in o.get("text", ""))[5:])
        for c in (nb.cells[0], nb.cells[-1])
    )
    peak = (end["peak_kib"] + end["child_peak_kib"]) / 1024
    cpu = end["cpu"] + end["child_cpu"] - idle["cpu"] - idle["child_cpu"]
    print(f"  {_load()}")
    per_core = LAB_MINUTES * 60 / cpu
    server = _lab_server_mib()
    return [
        "| a student's kernel running the chapter (`solutions/notebooks/rlhf_ppo.ipynb`) | measured |",
        "|---|---|",
        f"| RSS of the kernel started, nothing run | {idle['rss_kib'] / 1024:.0f} MiB |",
        f"| peak RSS, kernel + its children | {peak:.0f} MiB |",
        f"| CPU, user+sys (kernel + children) / wall | {cpu:.1f} s / {wall:.1f} s |",
        f"| students per core, each running the chapter once in {LAB_MINUTES} min "
        f"({LAB_MINUTES} x 60 / CPU s) | {per_core:.0f} |",
        f"| RSS of a JupyterLab server, started, no browser | {server:.0f} MiB |",
        f"| memory per active student (server + kernel peak) | {server + peak:.0f} MiB |",
        f"| memory for 100 students running it at once | {100 * (server + peak) / 1024:.0f} GiB |",
    ]


def tail_lines() -> None:
    import subprocess

    print(
        f"{os.cpu_count()} cores; {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )
    with tempfile.TemporaryDirectory() as tmp, _cpu_clock() as cpu:
        if cpu is None:
            print("no cpuacct group could be made: CPU columns are nan")
        blocks = [
            tail_per_submission(pathlib.Path(tmp), cpu),
            tail_exhausting(pathlib.Path(tmp), cpu),
        ]
    blocks.append(tail_ceiling())
    print(f"end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for block in blocks:
        print("\n" + "\n".join(block))


def systems_lines(repeats: int) -> None:
    torch.set_num_threads(1)  # as the chapter runs
    machine = measure_machine()
    flops, bw = machine.flop_rate / 1e9, machine.bandwidth / 1e9
    print(f"machine: {flops:.1f} GFLOP/s (fp32 512x512 matmul), {bw:.1f} GB/s (64 MB copy)")

    cfg = ToyLMConfig(max_len=2 + max(SWEEP_LENGTHS))
    models = build_models(seed=0, batch=SWEEP_BATCH, cfg=cfg)
    policy, ref, critic, prompts = models[:4]
    policy.eval()
    kv = time_samplers(policy, prompts, 64, repeats=max(repeats, 5))
    ratio, bound = kv["naive"] / kv["cached"], kv["naive"] / kv["floor"]
    verdict = "PASS" if ratio >= 8 else "FAIL"
    print(
        f"sampling 64 new tokens, batch 64: naive {1e3 * kv['naive']:.0f} ms, cached {1e3 * kv['cached']:.0f} ms, "
        f"one-token floor {1e3 * kv['floor']:.0f} ms; cached is {ratio:.1f}x faster (target >= 8x): {verdict}; "
        f"bound from the floor {bound:.1f}x, the cache reaches {kv['floor'] / kv['cached']:.0%} of it"
    )
    # The same at the sweep's other batch sizes: the naive sampler's work grows with the batch.
    for batch in sorted(set(SWEEP_BATCHES) - {SWEEP_BATCH}):
        at_b = build_models(seed=0, batch=batch, cfg=cfg)
        kv = time_samplers(at_b.policy.eval(), at_b.prompts, 64, repeats=max(repeats, 5))
        print(
            f"  batch {batch:>3}: cached {kv['naive'] / kv['cached']:.1f}x faster than naive, "
            f"bound {kv['naive'] / kv['floor']:.1f}x"
        )

    update = partial(ppo_update, beta=0.3, cfg=PPOConfig(ppo_epochs=EPOCHS))
    step_fns = dict(rollout=collect_rollouts, reward_fn=good_count_reward, update=update)
    shape = Shape(cfg.n_layers, cfg.d_model, cfg.vocab_size)
    latency = calibrate_latency(
        policy, ref, critic, prompts[:1], shape, machine, EPOCHS, repeats=repeats, **step_fns
    )
    for name, lat in latency.items():
        print(f"latency ({name}): {lat}")
    rows = sweep_time_split(
        policy, ref, critic, prompts, SWEEP_LENGTHS, repeats=repeats, **step_fns
    )
    big = build_models(seed=0, batch=max(SWEEP_BATCHES), cfg=cfg).prompts
    for b in SWEEP_BATCHES:  # and the batch size, at 64 new tokens
        if b != SWEEP_BATCH:
            rows += sweep_time_split(
                policy, ref, critic, big[:b], (64,), repeats=repeats, **step_fns
            )
    predicted = [predicted_split(r, shape, machine, EPOCHS, latency) for r in rows]
    print(format_sweep(rows, predicted))
    ratios = [
        (p["fractions"]["generation"] / r["fractions"]["generation"], r)
        for r, p in zip(rows, predicted, strict=True)
    ]
    worse = [
        f"{r['new_tokens']} tokens {r['sampler']} ({q:.2f})" for q, r in ratios if not 0.5 <= q <= 2
    ]
    lo, hi = min(q for q, _ in ratios), max(q for q, _ in ratios)
    verdict = "PASS" if not worse else "FAIL, worse than 2x at: " + ", ".join(worse)
    print(
        f"roofline / measured generation share over the sweep: {lo:.2f} to {hi:.2f} (target within 2x): {verdict}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--only",
        choices=("chapter", "systems", "grading", "command", "pages", "tail"),
        default=None,
    )
    args = ap.parse_args()
    if args.only == "tail":
        tail_lines()
        return
    if args.only in (None, "systems"):
        systems_lines(args.repeats)
    rows = chapter_lines(args.repeats) if args.only in (None, "chapter") else []
    rows += grading_rows(args.repeats) if args.only in (None, "grading") else []
    rows += command_rows(args.repeats) if args.only == "command" else []
    rows += page_rows(args.repeats) if args.only in (None, "pages") else []
    for label, times in rows:
        print(
            f"{label:55s} median {statistics.median(times):6.1f}   runs {', '.join(f'{t:.1f}' for t in times)}"
        )


if __name__ == "__main__":
    main()
