"""A tiny causal transformer over a readable vocabulary: the "language model" of the PPO chapter.

Small enough that a full PPO run takes a few seconds on a laptop CPU, big enough to have the
parts that matter for RLHF: an autoregressive sampler that stops at ``<|end|>``, pads after it
(naive, re-running the prefix, or with a per-layer KV cache), and a per-token log-prob function
whose alignment every PPO tensor follows:

    tokens            (B, T)    prompt + response + padding
    token_log_probs   (B, T-1)  index t scores tokens[:, t+1] given tokens[:, :t+1]
    response_mask     (B, T)    1 on generated tokens up to and including <|end|>; [:, 1:] aligns it

Sampling is plain ancestral sampling at temperature 1 (no top-k / top-p / suppressed tokens), so
the log-probs recorded while sampling are exactly the log-probs of the distribution that was
sampled. Padding uses its own id, never the end id (a shared pad/end id masks out the real end).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|end|>",
    "good",
    "bad",
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "mat",
    "very",
    "is",
    "not",
)
PAD_ID, BOS_ID, END_ID = 0, 1, 2
GOOD_ID = VOCAB.index("good")


def encode(text: str) -> list[int]:
    """Space-separated words -> ids. Unknown words raise a ValueError naming the word."""
    ids = []
    for word in text.split():
        if word not in VOCAB:
            raise ValueError(f"word {word!r} is not in the toy vocabulary {VOCAB}")
        ids.append(VOCAB.index(word))
    return ids


def decode(ids, skip_pad: bool = True) -> str:
    """Ids (list or 1-D tensor) -> space-separated words.

    With ``skip_pad`` only the padding the sampler adds after ``<|end|>`` is dropped (and leading
    left-padding of a prompt). A ``<|pad|>`` or ``<|bos|>`` the policy *sampled* inside a response
    is a real token, scored like any other, so it is shown.
    """
    words = [VOCAB[int(i)] for i in ids]
    if skip_pad:
        start = next((k for k, w in enumerate(words) if w != VOCAB[PAD_ID]), len(words))
        end = (
            words.index(VOCAB[END_ID], start) + 1 if VOCAB[END_ID] in words[start:] else len(words)
        )
        words = words[start:end] + [w for w in words[end:] if w != VOCAB[PAD_ID]]
    return " ".join(words)


@dataclass
class ToyLMConfig:
    vocab_size: int = len(VOCAB)
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 2
    max_len: int = 32
    init_std: float = 0.02  # small init => near-uniform next-token distribution at step 0
    use_cache: bool = (
        False  # what sample() does when its use_cache is None (like Hugging Face's config)
    )


class KVCache:
    """Keys and values of every position seen so far, in one buffer per layer allocated once.

    Per layer a (2, B, H, max_len, D/H) buffer, keys in ``[0]`` and values in ``[1]``, allocated by
    the layer's first call (the prompt, the *prefill*) and then written in place: each later call
    stores its new position in the next free column and attention reads a view of the filled
    columns. Adding a token therefore copies that token's keys and values only, in one copy.
    Appending with ``torch.cat`` instead reallocates and copies the whole cache at every token:
    O(n^2) bytes for n tokens.
    """

    def __init__(self, n_layers: int, max_len: int) -> None:
        if n_layers < 1 or max_len < 1:
            raise ValueError(f"n_layers and max_len must be >= 1, got {n_layers} and {max_len}")
        self.max_len = max_len
        self.kv: list[torch.Tensor | None] = [None] * n_layers  # (2, B, H, max_len, D/H) each
        self.filled = [0] * n_layers  # positions written so far, per layer

    def __len__(self) -> int:
        """Positions cached so far (0 before the first forward)."""
        return self.filled[0]

    def extend(self, layer: int, kv: torch.Tensor) -> torch.Tensor:
        """Write this call's keys and values, ``kv`` of shape (2, B, H, t, D/H), after ``layer``'s
        cached ones; return a view of every cached position, (2, B, H, T_cached, D/H), no copy."""
        if kv.dim() != 5 or kv.shape[0] != 2:
            raise ValueError(
                f"layer {layer}: keys and values {tuple(kv.shape)} do not fit a cache of "
                "(2, B, H, max_len, D/H)"
            )
        if self.kv[layer] is None:  # the prefill: allocate once, for every position to come
            self.kv[layer] = kv.new_empty(*kv.shape[:3], self.max_len, kv.shape[4])
        buf = self.kv[layer]
        if kv.shape[:3] + kv.shape[4:] != buf.shape[:3] + buf.shape[4:]:
            raise ValueError(
                f"layer {layer}: keys and values {tuple(kv.shape)} do not fit a cache of "
                f"(2, B, H, max_len, D/H) = {tuple(buf.shape)}"
            )
        if kv.dtype != buf.dtype:
            raise ValueError(f"layer {layer}: the cache holds {buf.dtype}, got {kv.dtype}")
        start, stop = self.filled[layer], self.filled[layer] + kv.shape[3]
        if stop > self.max_len:
            raise ValueError(
                f"the KV cache holds max_len={self.max_len} positions, asked for {stop}"
            )
        buf[:, :, :, start:stop] = kv  # in place: only the new positions are copied
        self.filled[layer] = stop
        return buf[:, :, :, :stop]  # (2, B, H, T_cached, D/H) view


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, both residual."""

    def __init__(self, cfg: ToyLMConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, D = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.n_heads, D // self.n_heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, D/H): q, k, v as views, no copy
        q, kv = qkv[0], qkv[1:]  # (B, H, T, D/H), (2, B, H, T, D/H)
        if cache is not None:
            kv = cache.extend(layer, kv)  # (2, B, H, T_cached, D/H): earlier positions and these
        k, v = kv  # (B, H, T_cached, D/H) each
        # T queries over T keys: causal. One new query over the cached keys: it may see all of them.
        att = F.scaled_dot_product_attention(q, k, v, is_causal=k.shape[2] == T)  # (B, H, T, D/H)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, D))  # (B, T, D)
        return x + self.mlp(self.ln2(x))  # (B, T, D)


class TinyTransformer(nn.Module):
    """Token + position embeddings, ``n_layers`` blocks, final LayerNorm: tokens (B, T) -> (B, T,
    d)."""

    def __init__(self, cfg: ToyLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=cfg.init_std)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        T, start = (
            tokens.shape[1],
            0 if cache is None else len(cache),
        )  # positions start after the cached ones
        if start + T > self.cfg.max_len:
            raise ValueError(f"sequence length {start + T} exceeds max_len={self.cfg.max_len}")
        if start and T != 1:
            raise ValueError(f"after the prompt a KV cache takes one token per call, got {T}")
        x = self.tok(tokens) + self.pos.weight[start : start + T]  # (B, T, d): rows = positions
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        return self.ln_f(x)  # (B, T, d)


class TinyCausalLM(nn.Module):
    """The policy / reference model: ``forward(tokens) -> logits`` of shape (B, T, V)."""

    def __init__(self, cfg: ToyLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.trunk = TinyTransformer(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=cfg.init_std)

    def hidden_states(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) -> (B, T, d): the representation of each prefix, before the LM head."""
        return self.trunk(tokens, cache)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) -> logits (B, T, V). With a cache, ``tokens`` are the positions after the cached
        ones."""
        return self.lm_head(self.hidden_states(tokens, cache))  # (B, T, V)


class TinyCritic(nn.Module):
    """Value model: its own transformer trunk plus a scalar head. tokens (B, T) -> V(s_t) (B, T)."""

    def __init__(self, cfg: ToyLMConfig) -> None:
        super().__init__()
        self.trunk = TinyTransformer(cfg)
        self.head = nn.Linear(cfg.d_model, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(tokens)).squeeze(-1)  # (B, T) value of the prefix ending at t


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: (B, T, V), (B, T) -> (B, T-1); index t scores tokens[:, t+1]."""
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(
            "expected logits (B, T, V) and tokens (B, T); "
            f"got {tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    logp = torch.log_softmax(
        logits[:, :-1].float() if logits.dtype == torch.float16 else logits[:, :-1], dim=-1
    )
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)


class Samples(NamedTuple):
    """What :func:`sample` returns."""

    tokens: torch.Tensor  # (B, T) long: prompt, response, then PAD after <|end|>
    response_mask: torch.Tensor  # (B, T) float: 1 on generated tokens up to and including <|end|>
    logprobs: (
        torch.Tensor
    )  # (B, T-1) log-prob of tokens[:, t+1] recorded while sampling; 0 off the response


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` (B, V): (B, 1) ids, the very draws of
    ``torch.multinomial(probs, 1, generator=generator)``.

    For a single draw torch.multinomial runs a race: every probability is divided by its own
    Exp(1) variable and the largest quotient wins, which picks token i with probability p_i (the
    Gumbel-max trick with the exponential taken). This is that race without multinomial's input
    checks, which cost a decode step more than the race itself. ``probs`` must be >= 0, not all 0.
    """
    return torch.argmax(probs / torch.empty_like(probs).exponential_(generator=generator), -1, True)


@torch.no_grad()
def sample(
    model: nn.Module,
    prompts: torch.Tensor,
    max_new_tokens: int,
    eos_id: int | None = END_ID,
    pad_id: int = PAD_ID,
    generator: torch.Generator | None = None,
    use_cache: bool | None = None,
) -> Samples:
    """Sample up to ``max_new_tokens`` after each prompt; a row stops after it emits ``eos_id``.

    ``prompts`` is (B, P) long (every row the same length; left-pad with ``pad_id`` if needed).
    Returns tokens (B, P + n) with n <= max_new_tokens (generation ends when every row has
    stopped), the response mask (B, P + n) and the sampling log-probs (B, P + n - 1).
    ``eos_id=None`` never stops: every response is ``max_new_tokens`` long.

    Without a cache every step runs the model over the whole prefix (B, t) and keeps the last
    position. ``use_cache=True`` runs the prompt once, then feeds one token per step and reuses
    every earlier position's keys and values (a :class:`KVCache` sized for P + max_new_tokens
    positions, allocated once; the model must accept ``cache=``); same tokens for the same
    generator, log-probs equal to float rounding. No buffer grows by concatenation: tokens, mask
    and log-probs are written in place too.
    ``use_cache=None`` takes ``model.cfg.use_cache`` (False unless set).
    """
    if prompts.dim() != 2 or prompts.dtype != torch.long:
        raise ValueError(
            f"prompts must be a (B, P) long tensor, got {tuple(prompts.shape)} {prompts.dtype}"
        )
    if max_new_tokens < 1 or prompts.shape[1] < 1:
        raise ValueError(
            f"need max_new_tokens >= 1 and a prompt of >= 1 token, got {max_new_tokens} and "
            f"{prompts.shape[1]}"
        )
    if use_cache is None:
        use_cache = getattr(getattr(model, "cfg", None), "use_cache", False)
    B, P = prompts.shape
    T = P + max_new_tokens  # the longest the batch can get; every buffer is allocated once
    tokens = prompts.new_full((B, T), pad_id)  # (B, T) long, raw samples until the loop ends
    tokens[:, :P] = prompts
    logps = torch.zeros(B, T - 1, device=prompts.device)  # (B, T-1) prompt log-probs not recorded
    ended = torch.zeros(B, dtype=torch.bool, device=prompts.device)  # (B,) emitted eos_id already
    cache = KVCache(len(model.trunk.blocks), T) if use_cache else None
    t = P  # columns filled so far
    # inference_mode, not just no_grad: no op records anything for autograd (cheaper per op, which
    # is what a one-token step is made of). The buffers above stay ordinary tensors, so what is
    # returned can enter a training forward later.
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            if use_cache:  # the prompt once (prefill), then only the newest token
                logits = model(tokens[:, :t] if t == P else tokens[:, t - 1 : t], cache=cache)
            else:  # naive: the whole prefix at every step
                logits = model(tokens[:, :t])  # (B, t, V)
            logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B, V) next-token dist.
            nxt = draw(logp.exp(), generator)  # (B, 1)
            tokens[:, t] = nxt.squeeze(1)
            logps[:, t - 1] = logp.gather(1, nxt).squeeze(1)
            t += 1
            if eos_id is not None:
                ended |= nxt.squeeze(1) == eos_id
                if ended.all():
                    break
    if not torch.isfinite(logps[:, P - 1 : t - 1]).all():  # one check for all steps (draw has none)
        raise ValueError("sample: the model's next-token log-probs hold NaN or inf (its logits)")
    # A row's response runs up to and including its first eos_id. What a finished row sampled after
    # it (rows never interact, so it changed nothing else) becomes padding, with log-prob 0.
    new = tokens[:, P:t]  # (B, n) view
    is_end = new == eos_id if eos_id is not None else torch.zeros_like(new, dtype=torch.bool)
    response = (is_end.cumsum(1) - is_end.long()) == 0  # (B, n) no eos_id strictly before
    new.masked_fill_(~response, pad_id)
    mask = torch.zeros(B, t, dtype=torch.float, device=prompts.device)  # (B, t)
    mask[:, P:] = response
    logps[:, P - 1 : t - 1] *= response
    return Samples(tokens[:, :t].contiguous(), mask, logps[:, : t - 1].contiguous())


def make_prompts(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` two-token prompts ``<|bos|> w`` with w drawn from the content words: (n, 2) long."""
    words = torch.tensor([VOCAB.index(w) for w in ("the", "a", "cat", "dog", "mat")])
    pick = torch.randint(len(words), (n,), generator=generator)
    return torch.stack([torch.full((n,), BOS_ID), words[pick]], dim=1)


class ToySetup(NamedTuple):
    """What :func:`build_models` returns: the chapter's starting point."""

    policy: TinyCausalLM  # trained; starts as an exact copy of ref
    ref: TinyCausalLM  # frozen KL anchor (requires_grad off)
    critic: TinyCritic  # trained value model
    prompts: torch.Tensor  # (batch, 2) long
    generator: torch.Generator  # CPU generator, seeded, already used to draw the prompts


def build_models(
    seed: int = 0, batch: int = 64, cfg: ToyLMConfig | None = None, device="cpu"
) -> ToySetup:
    """The models and prompts of one run, all from ``seed`` (identical on every DDP rank).

    The reference is the untrained, near-uniform toy LM; the policy is a copy of it; the critic
    has its own trunk. The generator that drew the prompts is returned for sampling.
    """
    torch.manual_seed(seed)
    cfg = cfg or ToyLMConfig()
    ref = TinyCausalLM(cfg).to(device)
    policy, critic = copy.deepcopy(ref), TinyCritic(cfg).to(device)
    ref.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    return ToySetup(policy, ref, critic, make_prompts(batch, gen).to(device), gen)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Temporarily set torch's default dtype (models built inside get parameters of that dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def good_count_reward(tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The chapter's programmatic reward model: ``good`` tokens in each response -> (B,)."""
    return ((tokens == GOOD_ID).float() * response_mask).sum(dim=1)


# ---------------------------------------------------------------- supervised fine-tuning helpers

DEMONSTRATIONS = (
    "the cat sat on the mat <|end|>",
    "a dog ran on the mat <|end|>",
    "the dog is very good <|end|>",
    "a cat is not bad <|end|>",
)


class DemoBatch(NamedTuple):
    input_ids: torch.Tensor  # (N, T) long, <|bos|> + demonstration, right-padded with PAD
    labels: torch.Tensor  # (N, T) long, -100 where no loss is taken (the <|bos|> and padding)


def demonstration_batch(texts=DEMONSTRATIONS) -> DemoBatch:
    """A fixed batch of demonstrations for SFT and for the PPO-ptx term."""
    rows = [[BOS_ID, *encode(t)] for t in texts]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD_ID)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    labels = ids.masked_fill(ids == PAD_ID, -100)
    labels[:, 0] = -100
    return DemoBatch(ids, labels)


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over positions whose label is not -100. (B, T, V), (B, T) ->
    scalar."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )
