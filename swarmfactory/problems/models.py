"""The dimensions of common open models, and how a problem turns them into validation shapes.

A kernel that is right on the benchmark's shapes and on the edge shapes can still be wrong at a
size real models use and the cases never reach: hidden 5120, a vocabulary that is not a multiple
of 65536, head_dim 80/96/112, 48 query heads per KV head, k = 11008, batch 33-64. ``MODELS`` is a
table of real configurations, with the values of their ``config.json`` (the text model's, for
multimodal ones: Gemma 3 4B-27B); every bundled CPU problem maps it to its own shapes twice:

* a **fixed sample** (``Problem.model_shapes``), part of ``seed_cases()`` and so of ``eval`` and
  every run: every catalogue value of every dimension the problem has at least once, in cheap
  combinations (the other dimensions small), plus every batch 1..64 where the problem has a batch
  (every residue modulo 2, 4, 8, 16 and 32, both sides of 32);
* **full-size real combinations** (``Problem.model_draws``, labelled by model), one per
  evaluation (``Problem.model_cases(draw)``), cycling so a run's successive evaluations cover all
  of them. One case stays within ``CASE_ELEMENTS`` elements per array (2 MB of fp32; with its
  float64 reference, its tolerance and any dequantised weights well under 100 MB): a dimension
  too large for that (a 14336 x 4096 matrix) keeps its real value and the others are cut to fit.

The helpers below build both from a problem's choice of dimensions; docs/problems.md lists the
catalogue and each problem's mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """One model's text-decoder dimensions, as its config.json states them."""

    name: str
    hidden: int        # hidden_size (d_model, n_embd)
    intermediate: int  # intermediate_size (ffn_hidden_size, n_inner; MPT: expansion_ratio * d_model)
    vocab: int         # vocab_size (padded_vocab_size)
    heads: int         # num_attention_heads
    kv_heads: int      # num_key_value_heads (1: multi-query attention)
    head_dim: int      # head_dim where stated, else hidden / heads

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA ratio; ``heads`` for MQA, 1 for multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


M = ModelConfig
MODELS: tuple[ModelConfig, ...] = (
    # name                       hidden  inter   vocab  heads kv  head_dim
    M("SmolLM2-135M",              576,  1536,  49152,   9,   3,  64),
    M("SmolLM2-360M",              960,  2560,  49152,  15,   5,  64),
    M("SmolLM2-1.7B",             2048,  8192,  49152,  32,  32,  64),
    M("SmolLM3-3B",               2048, 11008, 128256,  16,   4, 128),
    M("Llama-2-7B",               4096, 11008,  32000,  32,  32, 128),
    M("Llama-2-13B",              5120, 13824,  32000,  40,  40, 128),
    M("Llama-2-70B",              8192, 28672,  32000,  64,   8, 128),
    M("Llama-3.2-1B",             2048,  8192, 128256,  32,   8,  64),
    M("Llama-3.2-3B",             3072,  8192, 128256,  24,   8, 128),
    M("Llama-3.1-8B",             4096, 14336, 128256,  32,   8, 128),
    M("Llama-3.1-70B",            8192, 28672, 128256,  64,   8, 128),
    M("Llama-3.1-405B",          16384, 53248, 128256, 128,   8, 128),
    M("Mistral-7B-v0.3",          4096, 14336,  32768,  32,   8, 128),
    M("Mistral-Nemo-12B",         5120, 14336, 131072,  32,   8, 128),
    M("Qwen2.5-0.5B",              896,  4864, 151936,  14,   2,  64),
    M("Qwen2.5-1.5B",             1536,  8960, 151936,  12,   2, 128),
    M("Qwen2.5-3B",               2048, 11008, 151936,  16,   2, 128),
    M("Qwen2.5-7B",               3584, 18944, 152064,  28,   4, 128),
    M("Qwen2.5-14B",              5120, 13824, 152064,  40,   8, 128),
    M("Qwen2.5-32B",              5120, 27648, 152064,  40,   8, 128),
    M("Qwen2.5-72B",              8192, 29568, 152064,  64,   8, 128),
    M("Qwen3-0.6B",               1024,  3072, 151936,  16,   8, 128),
    M("Qwen3-1.7B",               2048,  6144, 151936,  16,   8, 128),
    M("Qwen3-4B",                 2560,  9728, 151936,  32,   8, 128),
    M("Qwen3-8B",                 4096, 12288, 151936,  32,   8, 128),
    M("Qwen3-14B",                5120, 17408, 151936,  40,   8, 128),
    M("Qwen3-32B",                5120, 25600, 151936,  64,   8, 128),
    M("Gemma-2-2B",               2304,  9216, 256000,   8,   4, 256),
    M("Gemma-2-9B",               3584, 14336, 256000,  16,   8, 256),
    M("Gemma-2-27B",              4608, 36864, 256000,  32,  16, 128),
    M("Gemma-3-270M",              640,  2048, 262144,   4,   1, 256),
    M("Gemma-3-1B",               1152,  6912, 262144,   4,   1, 256),
    M("Gemma-3-4B",               2560, 10240, 262208,   8,   4, 256),
    M("Gemma-3-12B",              3840, 15360, 262208,  16,   8, 256),
    M("Gemma-3-27B",              5376, 21504, 262208,  32,  16, 128),
    M("Phi-2",                    2560, 10240,  51200,  32,  32,  80),
    M("Phi-3-mini",               3072,  8192,  32064,  32,  32,  96),
    M("Phi-3-medium",             5120, 17920,  32064,  40,  10, 128),
    M("Phi-4-mini",               3072,  8192, 200064,  24,   8, 128),
    M("GLM-4-9B",                 4096, 13696, 151552,  32,   2, 128),
    M("gpt-oss-20b",              2880,  2880, 201088,  64,   8,  64),
    M("Falcon-7B",                4544, 18176,  65024,  71,   1,  64),
    M("Falcon-40B",               8192, 32768,  65024, 128,   8,  64),
    M("StarCoder-15B",            6144, 24576,  49152,  48,   1, 128),
    M("GPT-NeoX-20B",             6144, 24576,  50432,  64,  64,  96),
    M("MPT-30B",                  7168, 28672,  50432,  64,  64, 112),
)
del M

# elements one array of a drawn case may hold (2 MB of fp32): with the float64 reference, the
# case's tolerance and the trusted side's copies a case stays under ~50 MB and verifies in a few
# tenths of a second at most (drawn cases are new to every evaluation: nothing is cached)
CASE_ELEMENTS = 1 << 19
# ... and of a fixed-sample case, where two dimensions meet (one real value alone may exceed it:
# a row of 262144 logits, 53248 columns): the fixed sample is verified by every evaluation
SAMPLE_ELEMENTS = 1 << 14
BATCHES = tuple(range(1, 65))  # decode batches / tokens per step: every residue mod 2..32, past 32
# token counts of the drawn cases: decode batches and prefill chunks
TOKENS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 33, 48, 63, 64, 100, 128, 255, 512)
# attention context lengths (KV cache entries, attention-score widths)
CONTEXTS = (1, 17, 128, 129, 500, 1024, 2047, 4096, 8192, 32768)


def values(attr: str | Callable[[ModelConfig], int], models: Iterable[ModelConfig] = MODELS) -> tuple[int, ...]:
    """The distinct values of one dimension over the catalogue, ascending."""
    get = attr if callable(attr) else (lambda m: getattr(m, attr))
    return tuple(sorted({int(get(m)) for m in models}))


HIDDEN = values("hidden")
INTERMEDIATE = values("intermediate")
VOCAB = values("vocab")
HEAD_DIM = values("head_dim")
HEADS = values("heads")
KV_HEADS = values("kv_heads")
GROUPS = values("group")  # query heads per KV head
# (heads, kv_heads) as the models have them: every GQA ratio, MQA and multi-head attention
ATTENTION_HEADS = tuple(sorted({(m.heads, m.kv_heads) for m in MODELS}))
# the widths of the attention projections' outputs: q, k or v, and q|k|v fused
Q_WIDTH = values("q_width")
KV_WIDTH = values("kv_width")
QKV_WIDTH = values(lambda m: m.q_width + 2 * m.kv_width)


def cover(a: Sequence, b: Sequence, size: Callable[[object, object], int], cap: int,
          spare: Sequence = ()) -> list[tuple]:
    """Pairs (x, y) with every x of ``a`` and every y of ``b`` at least once, about max(len(a),
    len(b)) of them, each with ``size(x, y) <= cap`` where a partner allows it (else the smallest
    partner): the largest x meet the smallest y first; the y left over meet the x (or the cheaper
    ``spare`` values, where given) in turn, smallest first."""
    a, b = list(dict.fromkeys(a)), list(dict.fromkeys(b))
    if not a or not b:
        return []
    a_up = sorted(a, key=lambda x: size(x, b[0]))
    b_up = sorted(b, key=lambda y: size(a[0], y))
    pairs, used = [], set()
    for x in reversed(a_up):
        y = next((y for y in b_up if y not in used and size(x, y) <= cap),
                 next((y for y in b_up if size(x, y) <= cap), b_up[0]))
        used.add(y)
        pairs.append((x, y))
    partners = sorted(spare, key=lambda x: size(x, b[0])) if spare else a_up
    i = 0
    for y in b_up:
        if y in used:
            continue
        for j in range(len(partners)):
            if size(partners[(i + j) % len(partners)], y) <= cap:
                x, i = partners[(i + j) % len(partners)], (i + j + 1) % len(partners)
                break
        else:
            x = partners[0]
        pairs.append((x, y))
    return pairs


def dedupe(labelled: Iterable[tuple[str, Mapping[str, int]]]) -> tuple[tuple[str, dict], ...]:
    """One entry per distinct shape (the labels of the models that share it joined), in first-seen
    order."""
    seen: dict[str, tuple[list[str], dict]] = {}
    for label, shape in labelled:
        shape = {k: int(v) for k, v in shape.items()}
        key = repr(sorted(shape.items()))
        if key in seen:
            if label not in seen[key][0]:
                seen[key][0].append(label)
        else:
            seen[key] = ([label], shape)
    return tuple((", ".join(labels[:3]) + (f" +{len(labels) - 3}" if len(labels) > 3 else ""), shape)
                 for labels, shape in seen.values())


def interleave(entries: Sequence, stride: int = 7) -> tuple:
    """A fixed reordering (every ``stride``-th entry, wrapping) so successive draws visit different
    models and dimensions, not one model's shapes in a row."""
    n = len(entries)
    if n == 0:
        return ()
    while math.gcd(stride, n) != 1:
        stride += 1
    return tuple(entries[(i * stride) % n] for i in range(n))


def fit(real: int, others: int, cap: int = CASE_ELEMENTS, floor: int = 1) -> int:
    """``real`` cut to fit ``real * others <= cap`` (at least ``floor``)."""
    return max(floor, min(real, cap // max(1, others)))


def tokens_for(i: int) -> int:
    """The i-th model's token count for its drawn cases (the list cycled)."""
    return TOKENS[i % len(TOKENS)]


# -- per family: the fixed sample and the drawn combinations --------------------------------------

def unique(*parts: Iterable[Mapping[str, int]]) -> tuple[dict, ...]:
    """The shapes of ``parts`` in order, each once."""
    seen = dict.fromkeys(tuple(dict(s).items()) for part in parts for s in part)
    return tuple(dict(s) for s in seen)


SMALL = (17, 64, 96, 128)  # narrow widths, beside the row counts no real width has room for


def rows_cols(cols: Sequence[int], rows: Sequence[int] = BATCHES, cap: int = SAMPLE_ELEMENTS) -> tuple[dict, ...]:
    """Row-wise ops (norms, softmax): every ``cols`` value and every row count (1..64); the row
    counts the real widths leave over run on narrow rows."""
    return tuple({"rows": r, "cols": c} for c, r in cover(cols, rows, lambda c, r: c * r, cap, spare=SMALL))


def rows_cols_draws(per_model: Callable[[int, ModelConfig], Iterable[tuple[int, int]]],
                    cap: int = CASE_ELEMENTS) -> tuple[tuple[str, dict], ...]:
    """Each model's widths ``(cols, rows per token)`` at two token counts (cut to fit ``cap``)."""
    out = []
    for i, m in enumerate(MODELS):
        for j, (cols, per_token) in enumerate(per_model(i, m)):
            for t in (tokens_for(i + j), tokens_for(i + j + 7)):
                out.append((m.name, {"rows": fit(t * per_token, cols, cap), "cols": cols}))
    return interleave(dedupe(out))


def flat_draws(per_model: Callable[[ModelConfig], int], cap: int = CASE_ELEMENTS) -> tuple[tuple[str, dict], ...]:
    """Elementwise ops over a flat vector: a model's width times two token counts (cut to fit)."""
    out = []
    for i, m in enumerate(MODELS):
        width = per_model(m)
        for t in (tokens_for(i), tokens_for(i + 7)):
            out.append((m.name, {"n": width * fit(t, width, cap)}))
    return interleave(dedupe(out))


def rope_sample(cap: int = SAMPLE_ELEMENTS) -> tuple[dict, ...]:
    """RoPE over tokens x heads x head_dim: every head_dim, every head count (query and KV), every
    token count 1..64 (the counts the real head sets leave over on one to three heads)."""
    pairs = cover(sorted(set(HEADS) | set(KV_HEADS)), HEAD_DIM, lambda h, d: h * d, 1 << 62)
    spare = [(h, d) for h in (1, 2, 3) for d in HEAD_DIM]
    return tuple({"tokens": t, "heads": h, "head_dim": d}
                 for (h, d), t in cover(pairs, BATCHES, lambda p, t: p[0] * p[1] * t, cap, spare))


def rope_draws(cap: int = CASE_ELEMENTS) -> tuple[tuple[str, dict], ...]:
    """Each model's query and KV heads at its head_dim, two token counts each (cut to fit)."""
    out = []
    for i, m in enumerate(MODELS):
        for j, h in enumerate((m.heads, m.kv_heads)):
            for t in (tokens_for(i + j), tokens_for(i + j + 7)):
                out.append((f"{m.name} {'q' if j == 0 else 'kv'}",
                            {"tokens": fit(t, h * m.head_dim, cap), "heads": h, "head_dim": m.head_dim}))
    return interleave(dedupe(out))


SAMPLE_SEQS = (1, 7, 17, 33, 64, 100, 129, 255)  # context lengths of the fixed attention sample


def attention_sample(cap: int = 8 * SAMPLE_ELEMENTS) -> tuple[dict, ...]:
    """Decode attention: every (heads, kv_heads) of a model (each GQA ratio, MQA and multi-head),
    every head_dim, every batch 1..64 (the batches the real head sets leave over on SmolLM2's and
    Gemma 3's small ones); short contexts, the K and V caches within ``cap`` elements each."""
    pairs = cover(ATTENTION_HEADS, HEAD_DIM, lambda hk, d: (hk[0] + 2 * hk[1]) * d, 1 << 62)
    spare = [((9, 3), 64), ((4, 1), 256), ((15, 5), 64), ((14, 2), 64)]
    size = lambda p, b: b * (p[0][0] + 2 * p[0][1]) * p[1]  # noqa: E731 (q and one key, value each)
    out = []
    for i, (((h, kv), d), b) in enumerate(cover(pairs, BATCHES, size, cap, spare)):
        seq = fit(SAMPLE_SEQS[i % len(SAMPLE_SEQS)], b * kv * d, cap)
        out.append({"batch": b, "heads": h, "kv_heads": kv, "seq": seq, "head_dim": d})
    return tuple(out)


def attention_draws(cap: int = CASE_ELEMENTS) -> tuple[tuple[str, dict], ...]:
    """Each model's heads, KV heads and head_dim at a decode batch and a context length, the
    context cut so the K and V caches stay within ``cap`` elements each."""
    out = []
    for i, m in enumerate(MODELS):
        for j in range(2):
            b = fit(TOKENS[(i + 5 * j) % 14], m.q_width, cap)  # decode batches 1..64
            ctx = CONTEXTS[(i + 3 * j) % len(CONTEXTS)]
            out.append((m.name, {"batch": b, "heads": m.heads, "kv_heads": m.kv_heads,
                                 "seq": fit(ctx, b * m.kv_width, cap), "head_dim": m.head_dim}))
    return interleave(dedupe(out))


def matmul_sample(cap: int = 16 * SAMPLE_ELEMENTS, work: int = 64 * SAMPLE_ELEMENTS) -> tuple[dict, ...]:
    """Matmuls y = x W^T (W n x k, x batch x k): every k a model multiplies by (hidden,
    intermediate, the attention output's q width) with a small n; every n a projection produces
    (hidden, intermediate, q, kv and fused qkv widths) with one block of 32 (or a few) for k;
    every batch 1..64 across the two (x and y within ``cap`` elements, n k batch within ``work``
    multiply-adds)."""
    ks = sorted(set(HIDDEN) | set(INTERMEDIATE) | set(Q_WIDTH))
    ns = sorted(set(HIDDEN) | set(INTERMEDIATE) | set(Q_WIDTH) | set(KV_WIDTH) | set(QKV_WIDTH))
    small_n, small_k = (1, 3, 5, 8, 9, 16, 17, 31, 33), (32, 64, 96, 160)
    out = [{"n": fit(small_n[i % len(small_n)], k * b, work), "k": k, "batch": b}
           for i, (k, b) in enumerate(cover(ks, BATCHES[:len(ks)], lambda k, b: k * b, cap))]
    # the widest n take batches 1-4 (y is batch x n), the rest the batches the k part left over
    for i, (n, b) in enumerate(cover(ns, (1, 2, 3, 4) + BATCHES[len(ks):], lambda n, b: n * b * 32, work)):
        k = small_k[i % len(small_k)]
        out.append({"n": n, "k": k if n * k * b <= work else 32, "batch": b})
    return tuple(out)


def matmul_draws(cap: int = 2 * CASE_ELEMENTS) -> tuple[tuple[str, dict], ...]:
    """Every projection of every model (q|k|v, o, gate|up, down, lm_head) at its real k and a
    decode batch, its real n cut so the weights stay within ``cap`` elements (their float64
    dequantisation within 8 MB)."""
    out = []
    for i, m in enumerate(MODELS):
        projections = (("qkv", m.q_width + 2 * m.kv_width, m.hidden), ("o", m.hidden, m.q_width),
                       ("gate_up", 2 * m.intermediate, m.hidden), ("down", m.hidden, m.intermediate),
                       ("lm_head", m.vocab, m.hidden))
        for j, (what, n, k) in enumerate(projections):
            b = TOKENS[(i + 3 * j) % 14]  # decode batches 1..64 (a prefill chunk would not fit)
            out.append((f"{m.name} {what}", {"n": fit(n, k, cap), "k": k, "batch": fit(b, k)}))
    return interleave(dedupe(out))
