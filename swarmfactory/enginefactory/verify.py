"""End-to-end verification of an engine design, before any of its time is measured.

The reference is HF transformers' fp32 ``LlamaForCausalLM`` loaded from the same GGUF: its
greedy tokens for ``PROMPTS`` and its logits over the fixed text (engine/data/ppl_text.txt),
computed once per model file and cached (``reference``). A design passes when

- fp32: its greedy tokens equal the reference's, prompt by prompt;
- bf16 / q4_1: its logits over the fixed text stay within the bounds of docs/engine.md
  (``BOUNDS``: max and mean absolute logit error, perplexity change, top-1 agreement);
- every format: each prompt's tokens are the same alone, batched with the others, under
  continuous batching (requests joining mid-flight, another aborted) and under load (``_under_load``:
  among enough other requests to cross every size at which the design changes path or kernel),
  so serving load never changes an answer;
- and no kernel-factory kernel of the design was caught by the engine's audit meanwhile
  (engine/audit.py): the engine would have replaced its outputs, so the checks above would
  have judged the engine's own kernels, not the design.

A failure names the check, the prompt and the first token where the tokens diverged.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "List three colours: red,",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
)
NEW_TOKENS = 24
# (max abs logit error, mean abs logit error, relative perplexity change, top-1 agreement); the max
# is taken over the logits that can be sampled: at each position the reference's TOP_K best tokens
# and the design's own best. A tail logit no sampler reaches does not fail a design: the max over
# every logit grows with the vocabulary (Gemma 3's 262144 tokens x 412 positions: 2.98 for a
# design whose top-20 max was under 2 and whose mean, perplexity and agreement matched SmolLM2's);
# the mean is still over every logit, so a shift of the whole tail fails it.
BOUNDS = {"bf16": (1.5, 0.15, 0.02, 0.9), "q4_1": (2.0, 0.25, 0.03, 0.9)}
TOP_K = 20
REFERENCE_VERSION = 1


@dataclass
class Check:
    ok: bool
    detail: str
    evidence: dict = field(default_factory=dict)


def model_digest(path: Path) -> str:
    """sha256 of the model file: what profiles and references are keyed by (``engine/model_file.py``:
    cached on disk per file version, so ``engine serve`` does not hash 250 MB at every start)."""
    from swarmfactory.engine.model_file import sha256

    return sha256(path)


def ppl_ids(tokenizer) -> list[int]:
    from importlib.resources import files

    return tokenizer.encode(files("swarmfactory.engine").joinpath("data/ppl_text.txt").read_text())


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def reference_path(model_path: Path, cache: Path) -> Path:
    return cache / f"reference-v{REFERENCE_VERSION}-{model_digest(model_path)[:20]}.pt"


def reference(model_path: Path, cache: Path, threads: int = 0) -> dict:
    """The HF fp32 reference for ``model_path``: ``{"tokens": [[...]...], "logits": Tensor}``,
    computed on first use (about 20 s) and cached under ``cache``."""
    import torch

    path = reference_path(model_path, cache)
    if path.exists():
        return torch.load(path, weights_only=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion bars
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.tokenizer import Tokenizer

    if threads:
        torch.set_num_threads(threads)
    tok = Tokenizer(load_gguf(model_path).metadata)
    hf = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                              dtype=torch.float32)
    hf.eval()
    ref = compute_reference(hf, tok)
    ref["model_sha256"] = model_digest(model_path)
    save_reference(ref, path)
    return ref


def compute_reference(hf, tokenizer) -> dict:
    """Greedy tokens (plain argmax, no ``generate`` heuristics) and logits over the fixed text
    from an fp32 HF model."""
    import torch

    tokens = []
    with torch.no_grad():
        for ids in prompt_ids(tokenizer):
            seq = list(ids)
            for _ in range(NEW_TOKENS):
                seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
            tokens.append(seq[len(ids):])
        logits = hf(torch.tensor([ppl_ids(tokenizer)])).logits[0].float().contiguous()
    return {"tokens": tokens, "logits": logits}


def save_reference(ref: dict, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(ref, tmp)
    os.replace(tmp, path)


def _diverge(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _compare(name: str, got: list[list[int]], want: list[list[int]], tokenizer, what: str) -> Check | None:
    for p, (g, w) in enumerate(zip(got, want)):
        i = _diverge(g, w)
        if i is not None:
            gi = g[i] if i < len(g) else None
            wi = w[i] if i < len(w) else None
            show = lambda t: "end" if t is None else f"{t} {tokenizer.decode([t])!r}"
            return Check(False, f"{name}: prompt {p} ({PROMPTS[p][:40]!r}) diverged at token {i}: {what} "
                                f"{show(wi)}, got {show(gi)}",
                         {"check": name, "prompt": p, "token": i, "expected": wi, "got": gi})
    return None


def _greedy(engine, ids: list[list[int]]) -> list[list[int]]:
    return [c.token_ids for c in engine.generate(ids, max_tokens=NEW_TOKENS, ignore_eos=True)]


def _continuous(engine, ids: list[list[int]]) -> list[list[int]]:
    """Two requests start; after three steps the others join with a victim that is aborted one
    step later; everything runs to the end."""
    from swarmfactory.engine.sequence import SamplingParams, Status

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    seqs = [engine.add_request(i, params) for i in ids[:2]]
    for _ in range(3):
        engine.step()
    seqs += [engine.add_request(i, params) for i in ids[2:]]
    victim = engine.add_request(ids[0][::-1], params)
    engine.step()
    engine.abort(victim)
    while any(s.status is not Status.FINISHED for s in seqs):
        engine.step()
    return [list(s.output_ids) for s in seqs]


def load_plan(engine, n_prompts: int) -> tuple[int, int]:
    """(other requests, the long one's prompt tokens) for ``_under_load``: enough requests that a
    decode step has more rows than the native decoder takes, than any op's dense threshold and
    than 8 + the prompts (within the engine's batch), and one prompt longer than a chunk and than
    the native decoder's prompt tokens."""
    paths = engine.paths
    limit = max([paths.native_decode, *paths.dense_above.values(), 8 + n_prompts - 1])
    others = max(0, min(engine.scheduler.max_batch - n_prompts, limit + 2 - n_prompts))
    long = max(engine.config.prefill_chunk, paths.native_prefill) + 17
    return others, max(1, min(long, engine.max_seq_len - NEW_TOKENS - 9))


def _under_load(engine, ids: list[list[int]]) -> list[list[int]]:
    """The prompts served among other requests (``load_plan``): half of them decoding when the
    prompts arrive, a long prompt queued just before them (so their prompts are cut at other
    chunk boundaries than alone and a step carries more prompt tokens than the native decoder
    takes), the other half queued after them. A design whose path, kernel or numbers change with
    the size of a step shows it here, where four prompts alone never reach those sizes."""
    from swarmfactory.engine.sequence import SamplingParams, Status

    others, long = load_plan(engine, len(ids))
    text = ppl_ids(engine.tokenizer)
    text = (text * (long // max(1, len(text)) + 2)) if text else [0]
    fill = [text[(7 * i) % 97:(7 * i) % 97 + 3 + (11 * i) % 29] for i in range(others)]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    longer = SamplingParams(max_tokens=NEW_TOKENS + 8, temperature=0.0, ignore_eos=True)  # outlast the prompts
    load = [engine.add_request(f, longer) for f in fill[: others // 2]]
    for _ in range(2):
        engine.step()
    if others:
        load.append(engine.add_request(text[:long], longer))
    seqs = [engine.add_request(i, params) for i in ids]
    load += [engine.add_request(f, longer) for f in fill[others // 2 + 1:]]
    try:
        while any(s.status is not Status.FINISHED for s in seqs):
            engine.step()
    finally:
        for s in load:
            engine.abort(s)
    return [list(s.output_ids) for s in seqs]


def verify(engine, ref: dict) -> Check:
    """Run every check of the module docstring on a loaded engine; the first failure wins, except
    that a kernel the engine's audit caught is the verdict whatever else failed (the outputs
    compared came partly from its replacement)."""
    from swarmfactory.engine.audit import caught as audit_caught

    check = _checks(engine, ref)
    caught = audit_caught(engine.kernel_audit())
    if caught:
        return Check(False, f"a kernel of the design failed the engine's audit: {caught}",
                     {**check.evidence, "check": "kernel audit", "other_checks": check.detail})
    return check


def logit_bounds(logits, want, ids: list[int], weights: str, evidence: dict) -> Check | None:
    """The bounds of ``BOUNDS[weights]`` on a design's logits over the fixed text (``ids``)
    against the reference's: a failing Check, or None (``evidence`` gets the figures)."""
    import torch
    import torch.nn.functional as F

    err_all = (logits - want).abs()
    # the logits that can be sampled (see BOUNDS): the reference's TOP_K and the design's best
    keep = torch.zeros_like(err_all, dtype=torch.bool)
    keep.scatter_(-1, want.topk(min(TOP_K, want.shape[-1]), dim=-1).indices, True)
    keep.scatter_(-1, logits.argmax(-1, keepdim=True), True)
    err = torch.where(keep | torch.isnan(err_all), err_all, torch.zeros((), dtype=err_all.dtype))  # NaN fails
    nll = lambda lg: F.cross_entropy(lg[:-1], torch.tensor(ids[1:])).item()  # noqa: E731
    ppl_ref, ppl = math.exp(nll(want)), math.exp(nll(logits))
    agree = (logits.argmax(-1) == want.argmax(-1)).float().mean().item()
    evidence.update(max_logit_error=err.max().item(), max_logit_error_all=err_all.max().item(),
                    mean_logit_error=err_all.mean().item(), perplexity=ppl, perplexity_fp32=ppl_ref,
                    top1_agreement=agree)
    mx, mean, rel, min_agree = BOUNDS[weights]
    fails = []
    if not err.max().item() <= mx:
        fails.append(f"max |logit error| of the top {TOP_K} {err.max().item():.3f} > {mx}")
    if not err_all.mean().item() <= mean:
        fails.append(f"mean |logit error| {err_all.mean().item():.3f} > {mean}")
    if not abs(ppl / ppl_ref - 1) <= rel:
        fails.append(f"perplexity {ppl:.3f} vs fp32 {ppl_ref:.3f} (bound {rel:.0%})")
    if not agree >= min_agree:
        fails.append(f"top-1 agreement {agree:.1%} < {min_agree:.0%}")
    if not fails:
        return None
    worst = int(err.max(-1).values.argmax())
    return Check(False, f"{weights} logits vs fp32 over the fixed text: " + "; ".join(fails)
                 + f" (worst at position {worst})", {**evidence, "check": "bounds", "position": worst})


def _checks(engine, ref: dict) -> Check:
    tok = engine.tokenizer
    ids = prompt_ids(tok)
    evidence: dict = {}
    alone = [_greedy(engine, [i])[0] for i in ids]
    weights = engine.config.weights
    if weights == "fp32":
        bad = _compare("fp32 tokens vs HF transformers fp32", alone, ref["tokens"], tok, "HF gave")
        if bad:
            return bad
    else:
        bad = logit_bounds(engine.score(ppl_ids(tok)), ref["logits"], ppl_ids(tok), weights, evidence)
        if bad:
            return bad
        evidence["tokens_equal_fp32"] = sum(a == r for a, r in zip(alone, ref["tokens"]))
    for name, run in (("batched vs alone", _greedy), ("continuous batching vs alone", _continuous),
                      ("under load vs alone", _under_load)):
        bad = _compare(name, run(engine, ids), alone, tok, "alone gave")
        if bad:  # what passed before it stays in the evidence (the logit bounds)
            bad.evidence = {**evidence, **bad.evidence}
            return bad
    checks = ["fp32 tokens = HF" if weights == "fp32" else "logit bounds", "batched = alone",
              "continuous batching with join/abort = alone",
              "under load (%d other requests, one of %d prompt tokens) = alone" % load_plan(engine, len(ids))]
    return Check(True, f"{len(ids)} prompts x {NEW_TOKENS} tokens: " + ", ".join(checks), evidence)
