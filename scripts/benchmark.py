"""How long the chapter takes, and the systems figures of §4.2, measured on this machine.

    python scripts/benchmark.py [--repeats 3] [--only chapter|systems]

Chapter targets on a 2-core CPU: execution <= 30 s (plus <= 30 s for the exercises), grading one
submission <= 20 s; the line "§4.2 cells" says what the section's measurements add.
Systems targets (issue 11): the KV-cached sampler >= 3x faster than the naive one at 64 new tokens,
batch 64; the roofline model's generation share within a factor 2 of the measured one across the
sweep over response length (batch 64) and batch size (16, 64, 128 at 64 new tokens); rows outside
are listed. Reports medians of --repeats runs (not a test: timings are noisy).
"""

import argparse
import pathlib
import statistics
import time
from datetime import datetime
from functools import partial

import nbformat
import torch
from mlbook_solutions.ppo_lm import PPOConfig, collect_rollouts, ppo_update
from mlbook_tools.grading import grade_notebook
from nbclient import NotebookClient

from mlbook.posttrain.roofline import Shape, measure_machine
from mlbook.posttrain.systems import calibrate_latency, format_sweep, predicted_split, sweep_time_split
from mlbook.posttrain.toy_lm import ToyLMConfig, build_models, good_count_reward, sample

ROOT = pathlib.Path(__file__).resolve().parents[1]
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
            start, end = (datetime.fromisoformat(ex[k]) for k in ("iopub.execute_input", "shell.execute_reply"))
            section += (end - start).total_seconds()
    return total, section


def chapter_lines(repeats: int) -> list[tuple[str, list[float]]]:
    solved = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
    rows = []
    for nb in sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")):
        runs = [execute(nb) for _ in range(repeats)]
        rows.append((f"execute {nb.name}", [t for t, _ in runs]))
        if any(s for _, s in runs):
            rows.append((f"  of which §4.2 cells ({nb.name})", [s for _, s in runs]))
    for label, path in (("grade solved submission", solved), ("grade untouched release", ROOT / "chapters" / "rlhf_ppo.ipynb")):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            grade_notebook(path)
            times.append(time.perf_counter() - t0)
        rows.append((label, times))
    return rows


def systems_lines(repeats: int) -> None:
    torch.set_num_threads(1)  # as the chapter runs
    machine = measure_machine()
    flops, bw = machine.flop_rate / 1e9, machine.bandwidth / 1e9
    print(f"machine: {flops:.1f} GFLOP/s (fp32 512x512 matmul), {bw:.1f} GB/s (64 MB copy)")

    cfg = ToyLMConfig(max_len=2 + max(SWEEP_LENGTHS))
    models = build_models(seed=0, batch=SWEEP_BATCH, cfg=cfg)
    policy, ref, critic, prompts = models[:4]
    policy.eval()
    secs = {}
    for cached in (False, True):
        runs = []
        for i in range(repeats + 1):  # the first is a warm-up
            gen = torch.Generator().manual_seed(i)
            t0 = time.perf_counter()
            sample(policy, prompts, 64, eos_id=None, generator=gen, use_cache=cached)
            runs.append(time.perf_counter() - t0)
        secs[cached] = statistics.median(runs[1:])
    ratio = secs[False] / secs[True]
    verdict = "PASS" if ratio >= 3 else "FAIL"
    print(f"sampling 64 new tokens, batch 64: naive {1e3 * secs[False]:.0f} ms, cached {1e3 * secs[True]:.0f} ms, "
          f"cached is {ratio:.1f}x faster (target >= 3x): {verdict}")  # fmt: skip

    update = partial(ppo_update, beta=0.3, cfg=PPOConfig(ppo_epochs=EPOCHS))
    step_fns = dict(rollout=collect_rollouts, reward_fn=good_count_reward, update=update)
    shape = Shape(cfg.n_layers, cfg.d_model, cfg.vocab_size)
    latency = calibrate_latency(policy, ref, critic, prompts[:1], shape, machine, EPOCHS, repeats=repeats, **step_fns)
    for name, lat in latency.items():
        print(f"latency ({name}): {lat}")
    rows = sweep_time_split(policy, ref, critic, prompts, SWEEP_LENGTHS, repeats=repeats, **step_fns)
    big = build_models(seed=0, batch=max(SWEEP_BATCHES), cfg=cfg).prompts
    for b in SWEEP_BATCHES:  # and the batch size, at 64 new tokens
        if b != SWEEP_BATCH:
            rows += sweep_time_split(policy, ref, critic, big[:b], (64,), repeats=repeats, **step_fns)
    predicted = [predicted_split(r, shape, machine, EPOCHS, latency) for r in rows]
    print(format_sweep(rows, predicted))
    ratios = [(p["fractions"]["generation"] / r["fractions"]["generation"], r) for r, p in zip(rows, predicted, strict=True)]
    worse = [f"{r['new_tokens']} tokens {r['sampler']} ({q:.2f})" for q, r in ratios if not 0.5 <= q <= 2]
    lo, hi = min(q for q, _ in ratios), max(q for q, _ in ratios)
    verdict = "PASS" if not worse else "FAIL, worse than 2x at: " + ", ".join(worse)
    print(f"roofline / measured generation share over the sweep: {lo:.2f} to {hi:.2f} (target within 2x): {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=("chapter", "systems"), default=None)
    args = ap.parse_args()
    if args.only != "chapter":
        systems_lines(args.repeats)
    if args.only != "systems":
        for label, times in chapter_lines(args.repeats):
            print(f"{label:40s} median {statistics.median(times):6.1f} s   runs {', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    main()
