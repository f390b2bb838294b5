"""The roofline model on constants worked out by hand, and the latency fit on synthetic timings."""

import pytest

from mlbook.posttrain.roofline import (
    ACT_VALUES_PER_LAYER,
    ADAM_BYTES_PER_PARAM,
    Cost,
    Latency,
    Machine,
    Shape,
    fit_latency,
    generation_cost,
    pass_cost,
    predict_step,
    shares,
    update_cost,
)

pytestmark = pytest.mark.unit

H100 = Machine("H100 SXM", 989e12, 3.35e12)
LLAMA_7B = Shape(
    n_layers=32, d_model=4096, vocab=32_000, d_ff=11_008, bytes_per_value=2, mlp_matrices=3
)


def test_parameter_counts():
    assert LLAMA_7B.params == 6_738_149_376  # Llama-2-7B without norms: 32 (4 d^2 + 3 d ff) + 2 V d
    toy = Shape(n_layers=2, d_model=32, vocab=16)
    assert toy.matmul_params == 2 * (4 * 32 * 32 + 2 * 32 * 128) + 32 * 16
    assert H100.ridge == pytest.approx(295.2, abs=0.1)


def test_pass_cost_by_hand():
    s = Shape(n_layers=1, d_model=2, vocab=3, d_ff=4, bytes_per_value=1)
    # matmul params: 4*2*2 + 2*2*4 + 2*3 = 38; params = 38 + 6 = 44
    c = pass_cost(s, batch=5, new=1, ctx=7)
    assert c.flops == 2 * 38 * 5 * 1 + 4 * 1 * 2 * 5 * 1 * 7
    assert c.bytes == 44 + 2 * 1 * 2 * 5 * 7  # weights + keys and values of the context
    assert c.act_bytes == ACT_VALUES_PER_LAYER * 1 * 2 * 5 * 1
    with pytest.raises(ValueError, match="new <= ctx"):
        pass_cost(s, 1, 3, 2)


def test_roofline_seconds_takes_the_slower_matmul_bound_plus_streams():
    m = Machine("m", flop_rate=10.0, bandwidth=2.0)
    assert Cost(100.0, 4.0, 0.0).seconds(m) == 10.0  # compute-bound
    assert Cost(10.0, 40.0, 0.0).seconds(m) == 20.0  # memory-bound
    assert Cost(10.0, 4.0, 6.0).seconds(m) == max(1.0, 2.0) + 3.0
    assert (Cost(1.0, 2.0, 3.0) * 2 + Cost(1.0, 1.0, 1.0)) == Cost(3.0, 5.0, 7.0)


def test_7b_decode_step_on_h100_is_memory_bound_at_about_4_ms():
    step = pass_cost(LLAMA_7B, batch=1, new=1, ctx=1)
    assert step.flops / step.bytes < H100.ridge  # about 1 FLOP per byte
    assert step.seconds(H100) == pytest.approx(
        2 * 6.738e9 / 3.35e12, rel=0.01
    )  # 4.0 ms: stream the weights
    # at batch 64 and a 1,024-token context the KV cache (2 L d ctx B bf16 values) outweighs the weights
    big = pass_cost(LLAMA_7B, batch=64, new=1, ctx=1024)
    kv = 2 * 2 * 32 * 4096 * 1024 * 64
    assert big.bytes == pytest.approx(2 * LLAMA_7B.params + kv)
    assert kv > 2 * LLAMA_7B.params


def test_cached_generation_costs_linear_naive_quadratic():
    s = Shape(n_layers=2, d_model=8, vocab=10)
    cached = [generation_cost(s, 4, 2, n, cached=True).flops for n in (16, 32, 64)]
    naive = [generation_cost(s, 4, 2, n, cached=False).flops for n in (16, 32, 64)]
    assert (
        cached[2] / cached[1] < 2.5
    )  # about linear (attention over the growing cache adds a little)
    assert naive[2] / naive[1] > 3.5  # about quadratic
    assert generation_cost(s, 4, 2, 1, cached=True) == generation_cost(
        s, 4, 2, 1, cached=False
    )  # prefill only


def test_update_cost_counts_forward_backward_and_adam():
    s = Shape(n_layers=1, d_model=4, vocab=5)
    fwd = pass_cost(s, 2, 6, 6)
    upd = update_cost(s, 2, 6, epochs=3, n_trained=2)
    assert upd.flops == 3 * 2 * 3 * fwd.flops
    assert upd.act_bytes == 3 * 2 * (3 * fwd.act_bytes + ADAM_BYTES_PER_PARAM * s.params)


def test_predict_step_and_fit_latency_recover_synthetic_latencies():
    s, m = Shape(n_layers=1, d_model=4, vocab=5), Machine("m", 1e9, 1e9)
    true = Latency(
        decode_step=0.002,
        generation=0.001,
        forward=0.004,
        reward=1e-4,
        update=0.05,
        update_per_position=3e-4,
    )

    def fake_split(n):  # what time_ppo_step would measure if the model were exact
        seconds = predict_step(s, m, 1, 2, n, 4, cached=True, latency=true)
        return dict(seconds=seconds, batch=1, prompt_len=2, new_tokens=n)

    fit = fit_latency(s, m, fake_split(4), fake_split(16), epochs=4, cached=True)
    for field in (
        "decode_step",
        "generation",
        "forward",
        "reward",
        "update",
        "update_per_position",
    ):
        assert getattr(fit, field) == pytest.approx(getattr(true, field), rel=1e-6, abs=1e-12)
    sec = predict_step(s, m, 1, 2, 8, 4, cached=True, latency=true)
    assert sum(shares(sec).values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="more new tokens"):
        fit_latency(s, m, fake_split(16), fake_split(4), 4, True)


# ---------------------------------------------------------------- §4.2's words follow its numbers


def test_times_phrase_never_calls_a_ratio_below_one_faster():
    from mlbook.posttrain.systems import times_phrase

    assert times_phrase(2.34) == "2.3x faster"
    assert times_phrase(1.0) == "1.0x faster"
    assert times_phrase(0.8) == "1.2x slower"  # 1 / 0.8 = 1.25
    assert times_phrase(0.5, "faster", "slower") == "2.0x slower"
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            times_phrase(bad)


def test_share_verdict_follows_the_printed_ratios():
    from mlbook.posttrain.systems import share_verdict

    # the two runs the referee read: 0.45-0.50 on one machine, 0.50 / 1.74 / 1.12 on another
    assert share_verdict([0.45, 0.50]).startswith("under-predicts")
    assert share_verdict([0.50, 1.74, 1.12]).startswith("is off in both directions")
    assert share_verdict([1.3, 1.74]).startswith("over-predicts")
    assert share_verdict([0.9, 1.1, 1.2]).startswith("matches")
    assert "over" not in share_verdict([0.45, 0.50])
    with pytest.raises(ValueError):
        share_verdict([])


def test_section_4_2_prose_states_no_direction_the_cells_do_not_print():
    """The §4.2 prose may not fix which way the roofline misses, nor call a speed-up faster:
    those words come from `share_verdict` and `times_phrase`, which read the printed ratios."""
    import pathlib
    import re

    src = pathlib.Path(__file__).parents[1] / "solutions/chapter/rlhf_ppo/40_systems.py"
    text = src.read_text()
    section = text[text.index("### 4.2 Time") : text.index("### 4.3 Failure modes")]
    prose = "\n".join(
        line[2:] for line in section.splitlines() if line.startswith("# ") and "%%" not in line
    ).lower()
    prose = re.sub(r"\s+", " ", prose)
    for claim in (
        "over-predict",
        "under-predict",
        "overestimat",
        "underestimat",
        "too high",
        "too low",
        "furthest off",
        "comes out high",
        "comes out low",
    ):
        assert claim not in prose, (
            f"§4.2 prose fixes a direction the measurement may not show: {claim!r}"
        )
    code = "\n".join(line for line in section.splitlines() if not line.startswith("#"))
    assert not re.search(r"x faster|x slower", code), "print speed ratios with times_phrase"
    assert "times_phrase(" in code and "share_verdict(" in code
    # the calibration is a warm-up and a median of at least three
    calib = code[code.index("calibrate_latency(") :]
    calib = calib[: calib.index(")")]
    assert re.search(r"repeats=([3-9]|\d\d)", calib) and re.search(r"warmup=[1-9]", calib)
