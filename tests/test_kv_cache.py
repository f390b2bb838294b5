"""The KV-cache sampler: same samples as the naive one, stops at <|end|>, handles left padding."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mlbook.posttrain.toy_lm import (
    END_ID,
    PAD_ID,
    KVCache,
    TinyCausalLM,
    ToyLMConfig,
    draw,
    encode,
    make_prompts,
    sample,
    token_log_probs,
)

pytestmark = pytest.mark.unit


def peaked_model(seed: int = 0, **cfg) -> TinyCausalLM:
    """A far-from-uniform toy LM, so that samples differ from row to row and <|end|> is likely somewhere."""
    torch.manual_seed(seed)
    return TinyCausalLM(ToyLMConfig(init_std=0.3, **cfg)).eval()


def both(model, prompts, n, seed=0, **kw):
    naive = sample(
        model, prompts, n, generator=torch.Generator().manual_seed(seed), use_cache=False, **kw
    )
    cached = sample(
        model, prompts, n, generator=torch.Generator().manual_seed(seed), use_cache=True, **kw
    )
    return naive, cached


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_sampler_draws_the_same_tokens_and_log_probs(seed):
    model = peaked_model(seed)
    prompts = make_prompts(16, torch.Generator().manual_seed(seed))
    naive, cached = both(model, prompts, 20, seed)
    assert torch.equal(naive.tokens, cached.tokens)
    assert torch.equal(naive.response_mask, cached.response_mask)
    assert (naive.logprobs - cached.logprobs).abs().max() < 1e-5
    # and both equal the teacher-forced log-probs the trainer recomputes
    recomputed = token_log_probs(model(cached.tokens), cached.tokens) * cached.response_mask[:, 1:]
    assert (recomputed - cached.logprobs).abs().max() < 1e-5


def test_cached_logits_equal_full_forward_position_by_position():
    model = peaked_model(3, max_len=40)
    tokens = torch.randint(0, 16, (4, 30), generator=torch.Generator().manual_seed(0))
    full = model(tokens)  # (B, T, V)
    cache = KVCache(len(model.trunk.blocks), max_len=30)
    steps = [model(tokens[:, :5], cache=cache)]  # prompt: 5 positions at once
    steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 30)]  # then one at a time
    assert len(cache) == 30
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_default_sampler_is_the_naive_one_and_cfg_switches_it():
    model = peaked_model(4)
    prompts = make_prompts(8, torch.Generator().manual_seed(4))
    default = sample(model, prompts, 10, generator=torch.Generator().manual_seed(5))
    naive = sample(model, prompts, 10, generator=torch.Generator().manual_seed(5), use_cache=False)
    assert all(torch.equal(a, b) for a, b in zip(default, naive, strict=True))  # bit-identical
    model.cfg.use_cache = True
    via_cfg = sample(model, prompts, 10, generator=torch.Generator().manual_seed(5))
    assert torch.equal(via_cfg.tokens, naive.tokens)


def test_cached_sampler_stops_at_end_and_pads_after_it():
    model = peaked_model(5)
    with torch.no_grad():
        model.lm_head.weight[END_ID] += 0.5  # make <|end|> common, so rows stop at different steps
    prompts = make_prompts(32, torch.Generator().manual_seed(5))
    naive, cached = both(model, prompts, 24, seed=5)
    assert torch.equal(naive.tokens, cached.tokens)
    tokens, mask = cached.tokens, cached.response_mask
    ended = (tokens == END_ID) & (mask == 1)
    assert ended.any(1).sum() >= 2, "the test needs rows that stop"
    for row in range(len(tokens)):
        hits = ended[row].nonzero()
        if len(hits):
            stop = int(hits[0])
            assert torch.all(tokens[row, stop + 1 :] == PAD_ID)  # nothing after <|end|>
            assert torch.all(mask[row, stop + 1 :] == 0) and mask[row, stop] == 1
    if ended.any(1).all():  # every row stopped: generation ended early, at the last row's <|end|>
        assert tokens.shape[1] < prompts.shape[1] + 24


def test_eos_none_never_stops():
    model = peaked_model(6)
    prompts = make_prompts(8, torch.Generator().manual_seed(6))
    _, cached = both(model, prompts, 12, seed=6, eos_id=None)
    assert cached.tokens.shape == (8, 2 + 12)
    assert torch.all(cached.response_mask[:, 2:] == 1)


def test_cached_sampler_with_left_padded_prompts():
    model = peaked_model(7)
    rows = [encode("the cat sat on"), encode("a dog"), encode("the")]
    P = max(len(r) for r in rows)
    prompts = torch.tensor([[PAD_ID] * (P - len(r)) + r for r in rows])  # left-padded (3, 4)
    naive, cached = both(model, prompts, 10, seed=7)
    assert torch.equal(naive.tokens, cached.tokens)
    assert torch.equal(cached.tokens[:, :P], prompts)
    assert torch.all(cached.response_mask[:, :P] == 0) and torch.all(
        cached.response_mask[:, P] == 1
    )
    assert (naive.logprobs - cached.logprobs).abs().max() < 1e-5


def test_cache_guards():
    model = peaked_model(8, max_len=8)
    prompts = make_prompts(2)
    with pytest.raises(ValueError, match="max_len"):
        sample(model, prompts, 8, eos_id=None, use_cache=True)  # 2 + 7 positions > 8
    cache = KVCache(len(model.trunk.blocks), max_len=8)
    model(prompts, cache=cache)
    with pytest.raises(ValueError, match="one token per call"):
        model(prompts, cache=cache)
    with pytest.raises(ValueError, match="holds max_len=1"):
        model(prompts, cache=KVCache(len(model.trunk.blocks), max_len=1))  # a 2-token prefill


class _CountOps(TorchDispatchMode):
    """Counts every aten op that runs inside the ``with`` block, by name."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("use_cache", [False, True])
def test_sampler_never_concatenates(use_cache):
    """Every buffer is allocated once: no torch.cat (which would copy the whole prefix) per token."""
    model = peaked_model(9)
    prompts = make_prompts(8, torch.Generator().manual_seed(9))
    with _CountOps() as ops:
        out = sample(model, prompts, 12, eos_id=None, use_cache=use_cache)
    assert out.tokens.shape == (8, 14)
    assert ops.counts.get("cat", 0) == 0 and ops.counts.get("stack", 0) == 0, ops.counts


class _Recorder(torch.nn.Module):
    """Wraps the toy LM and records, after each call, where each layer's cached keys live."""

    def __init__(self, model):
        super().__init__()
        self.model, self.trunk, self.seen = model, model.trunk, []

    def forward(self, tokens, cache=None):
        logits = self.model(tokens, cache=cache)
        self.seen.append((len(cache), [kv.untyped_storage().data_ptr() for kv in cache.kv]))
        return logits


def test_cache_storage_is_allocated_once_and_filled_in_place():
    model = peaked_model(10)
    prompts = make_prompts(4, torch.Generator().manual_seed(10))
    rec = _Recorder(model)
    sample(rec, prompts, 10, eos_id=None, use_cache=True)
    lengths = [n for n, _ in rec.seen]
    assert lengths == list(range(2, 12))  # the prompt, then one position per call
    first = rec.seen[0][1]
    assert all(ptrs == first for _, ptrs in rec.seen), "a cache buffer was reallocated"
    cache = KVCache(len(model.trunk.blocks), max_len=12)
    model(prompts, cache=cache)
    assert cache.kv[0].shape == (
        2,
        4,
        model.cfg.n_heads,
        12,
        model.cfg.d_model // model.cfg.n_heads,
    )


def test_cache_rejects_mismatched_keys():
    cache = KVCache(1, max_len=4)
    kv = torch.zeros(2, 2, 2, 1, 8)  # keys and values (2, B, H, t, D/H)
    cache.extend(0, kv)
    with pytest.raises(ValueError, match="do not fit"):
        cache.extend(0, torch.zeros(2, 3, 2, 1, 8))  # another batch size
    with pytest.raises(ValueError, match="do not fit"):
        cache.extend(0, torch.zeros(2, 2, 1, 8))  # keys only, no values
    with pytest.raises(ValueError, match="float64"):
        cache.extend(0, kv.double())
    with pytest.raises(ValueError, match="max_len=4"):
        cache.extend(0, torch.zeros(2, 2, 2, 4, 8))  # 1 + 4 positions
    with pytest.raises(ValueError, match=">= 1"):
        KVCache(0, 4)


def test_time_samplers_reports_three_medians_without_asserting_speed():
    """`make bench` and §4.2 time the samplers with it; speed itself is measured there, not here."""
    from mlbook.posttrain.systems import time_samplers

    model = peaked_model(11)
    prompts = make_prompts(4, torch.Generator().manual_seed(11))
    secs = time_samplers(model, prompts, 4, repeats=1, warmup=0)
    assert set(secs) == {"naive", "cached", "floor"} and all(s > 0 for s in secs.values())
    with pytest.raises(ValueError, match="max_len"):
        time_samplers(model, prompts, model.cfg.max_len, repeats=1)
    with pytest.raises(ValueError, match="repeats"):
        time_samplers(model, prompts, 4, repeats=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draw_is_torch_multinomial_without_its_checks(dtype):
    """The samplers' draw: the very tokens torch.multinomial(probs, 1) picks for the same generator,
    zero-probability tokens never, and the choice follows the probabilities."""
    gen = torch.Generator().manual_seed(0)
    for seed in range(40):
        B, V = 1 + seed % 7, 2 + 3 * seed % 17
        probs = torch.rand(B, V, generator=gen, dtype=dtype) ** 3
        probs[:, seed % V] = 0.0  # a token that must never come out
        ours = draw(probs, torch.Generator().manual_seed(seed))
        theirs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))
        assert ours.shape == (B, 1) and ours.dtype == torch.long
        assert torch.equal(ours, theirs), seed
        assert (ours != seed % V).all()
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=dtype).expand(20000, 3)
    counts = torch.bincount(draw(probs, torch.Generator().manual_seed(1)).squeeze(1), minlength=3)
    assert torch.allclose(counts / 20000, probs[0].float(), atol=0.015)


def test_sample_names_a_model_whose_logits_are_not_finite():
    model = peaked_model(12)
    with torch.no_grad():
        model.lm_head.weight[3] = float("nan")
    prompts = make_prompts(4, torch.Generator().manual_seed(12))
    for use_cache in (False, True):
        with pytest.raises(ValueError, match="NaN or inf"):
            sample(
                model, prompts, 3, generator=torch.Generator().manual_seed(0), use_cache=use_cache
            )


def test_samples_can_enter_a_training_forward():
    """The sampler runs under inference_mode; what it returns must still work with autograd."""
    model = peaked_model(13).train()
    s = sample(model, make_prompts(4, torch.Generator().manual_seed(13)), 5, use_cache=True)
    loss = (token_log_probs(model(s.tokens), s.tokens) * s.response_mask[:, 1:]).sum()
    loss.backward()
    assert model.trunk.tok.weight.grad is not None and torch.isfinite(loss)
    s.logprobs.add_(0.0)  # and can be changed in place, like any tensor
