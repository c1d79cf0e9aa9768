"""The kernel factory's ``<type>_engine_matmul`` kernels inside the engine's block kernels
(``EngineConfig.native_matmul``, engine/native/qext.py).

Real gcc, real qlinear.c builds. The first tests plug hand-written kernels of the ABI straight
into qlinear.c's parts (``QExt``): the check at load, the audit while serving (a kernel wrong only
at one batch size, one that writes to its inputs, one that writes past its outputs) and the
re-run on the engine's own kernel. The last ones serve a tiny Gemma 3 through a real SQLite store
holding the problem's candidates: the template's defaults (the engine's own code) give the
default engine's logits bit for bit in the block step, a wrong candidate is refused at load, and
one wrong only at an unchecked batch is caught while serving, recomputed and reported; the same
for a tiny Qwen3 in Q4_K (a K-quant's kernel, activations per 256 with their sums per 16).
"""

from __future__ import annotations

import re

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tiny_models as tm
from engine_support import THREADS

from swarmfactory.engine.kernels import Weight
from swarmfactory.engine.native import NativeUnavailable
from swarmfactory.engine.native import qext, qlinear
from swarmfactory.engine.supply import BuiltKernel

FAMILY = "q8_0_engine_matmul"
# a plain-C kernel of the ABI for Q8_0: per output, exact int32 block dots scaled in fp32 in
# block order (batch invariant); MUTATE is spliced into each block's term, PRE before the loops
KERNEL = r"""
#include <stdint.h>
#include <string.h>
static float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return (float)(*(_Float16 *)&h); }
void q8_0_engine_matmul(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y,
                        int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 32;
    PRE
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < n; r++) {
            float acc = 0.f;
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *blk = w + (r * nb + j) * 34;
                const int8_t *q = (const int8_t *)(blk + 2);
                int32_t s = 0;
                for (int i = 0; i < 32; i++) s += q[i] * xq[b * k + 32 * j + i];
                acc += (float)s * (h2f(blk) * xd[b * nb + j]) MUTATE;
            }
            y[b * n + r] = acc;
        }
    POST
}
"""


PACKED = "q8_0_engine_packed_matmul"
# the same on the engine's packed copies (qengine_packed.py): row r in lane r % 8 of its group's
# blocks of 272 bytes, fp16 d at 2 (r % 8), quants 4c..4c+3 at 16 + 32c + 4 (r % 8), each q + 128
PACKED_KERNEL = r"""
#include <stdint.h>
#include <string.h>
static float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return (float)(*(_Float16 *)&h); }
void q8_0_engine_packed_matmul(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y,
                               int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < n; r++) {
            float acc = 0.f;
            const int l = (int)(r % 8);
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *blk = w + ((r / 8) * nb + j) * 272;
                int32_t s = 0;
                for (int c = 0; c < 8; c++)
                    for (int e = 0; e < 4; e++) s += ((int32_t)blk[16 + 32 * c + 4 * l + e] - 128) * xq[b * k + 32 * j + 4 * c + e];
                acc += (float)s * (h2f(blk + 2 * l) * xd[b * nb + j]) MUTATE;
            }
            y[b * n + r] = acc;
        }
}
"""


def _kernel(mutate: str = "", pre: str = "", post: str = "", audit: bool = True, family: str = FAMILY) -> qext.Kernel:
    from swarmfactory.backends.c import CBackend

    src = (PACKED_KERNEL if family == PACKED else KERNEL).replace("MUTATE", mutate).replace("PRE", pre)
    src = src.replace("POST", post)
    art = CBackend().build(src, family, ("-O2",))
    built = BuiltKernel(f"champion:{family}@0", family, "0" * 12, art.path, src, "a test", 1e-4, 1e-4)
    return qext.Kernel(built, QT.Q8_0, family, audit=audit)


@pytest.fixture(scope="module")
def lib():
    got = qlinear.loaded()
    if got.lib is None:
        pytest.skip(f"no checked qlinear build here: {got.reason}")
    return got.lib


def test_a_correct_kernel_passes_the_check_and_wrong_or_batch_variant_ones_do_not(lib):
    assert qext.check(lib, _kernel()) is None
    assert "error" in qext.check(lib, _kernel("* 1.05f"))
    assert "alone differs" in qext.check(lib, _kernel("* (batch == 1 ? 1.000001f : 1.f)"))
    # right on every shape the check runs, so only the audit can catch it (below)
    assert qext.check(lib, _kernel("* (batch == 3 ? 1.05f : 1.f)")) is None


def _pair(lib, kernel: qext.Kernel, rows: int = 600, cols: int = 768):
    part = qlinear.random_part(QT.Q8_0, rows, cols, seed=3)
    mixed = [part, qlinear.random_part(QT.Q4_K, 40, cols, seed=4)]  # a K-quant part keeps the engine's kernel
    reports: list = []
    exts = qext.Exts([kernel], lambda *a: reports.append(a) or "reported")
    plugged, own = qlinear.Packed(Weight(mixed)), qlinear.Packed(Weight(mixed))
    assert exts.attach(plugged) == 1
    return plugged, own, exts, reports


@pytest.mark.parametrize("threads", [1, 2])
def test_a_kernel_wrong_only_at_one_batch_is_caught_recomputed_and_reported_once(lib, threads):
    k = _kernel("* (batch == 3 ? 1.05f : 1.f)")
    plugged, own, exts, reports = _pair(lib, k)
    gen = torch.Generator().manual_seed(0)
    for M in (1, 2):
        x = torch.randn(M, 768, generator=gen)
        calls = k.ext.calls
        y, want = plugged(lib, x, threads), own(lib, x, threads)
        assert k.ext.calls > calls  # it ran (on SIMD paths in its own fp32 order; the portable one is the same)
        assert (y - want).abs().max().item() < 1e-4 * (1 + want.abs().max().item())
        assert not k.ext.bad
    x = torch.randn(3, 768, generator=gen)  # the first call at batch 3 is audited: caught
    assert torch.equal(plugged(lib, x, threads), own(lib, x, threads))  # the call ran again on the engine's kernel
    assert k.ext.bad and k.ext.why == 1 and k.ext.batch == 3
    assert len(reports) == 1 and reports[0][:2] == (FAMILY, "0" * 12)
    assert "the engine's own kernel gives" in reports[0][3]
    calls = k.ext.calls
    x = torch.randn(2, 768, generator=gen)
    assert torch.equal(plugged(lib, x, threads), own(lib, x, threads))  # dropped for good
    assert k.ext.calls == calls and exts.poll() == [] and len(reports) == 1
    state = exts.audit_state()["Q8_0"]
    assert state["dropped"] == "reported" and state["audited"] >= 3


@pytest.mark.parametrize("pre,post,why", [
    ("", "((int8_t *)xq)[0] ^= 1;", 2),          # writes to its activations (other threads read them)
    ("", "((float *)xd)[0] *= 2.f;", 2),
    ("", "y[n * batch] = 0.f;", 3),              # writes past its outputs
])
def test_every_call_must_leave_its_inputs_and_the_memory_past_its_outputs(lib, pre, post, why):
    k = _kernel(pre=pre, post=post)
    plugged, own, exts, reports = _pair(lib, k)
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plugged(lib, x, 2), own(lib, x, 2))
    assert k.ext.bad and k.ext.why == why and len(reports) == 1


def test_a_packed_layout_kernel_runs_on_the_packed_copies_and_is_audited_there(lib):
    """A <type>_engine_packed_matmul kernel is called on each part's packed copy, in pieces from a
    group's first row (the check's fused weight has parts starting inside a group); where this
    build keeps the type as stored it is refused (it would run nowhere)."""
    k = _kernel(family=PACKED)
    if not qlinear.packs(QT.Q8_0):
        assert "would run nowhere" in qext.check(lib, k)
        return
    assert qext.check(lib, k) is None
    assert "error" in qext.check(lib, _kernel("* 1.05f", family=PACKED))
    # the stored-layout kernel named as a packed one reads the packed bytes as blocks: refused
    stored = _kernel()
    stored.packed = True
    assert re.search("error|non-finite", qext.check(lib, stored) or "")
    k = _kernel("* (batch == 3 ? 1.05f : 1.f)", family=PACKED)
    plugged, own, exts, reports = _pair(lib, k, rows=603)
    gen = torch.Generator().manual_seed(5)
    for M in (1, 2):
        x = torch.randn(M, 768, generator=gen)
        y, want = plugged(lib, x, 2), own(lib, x, 2)
        assert (y - want).abs().max().item() < 1e-4 * (1 + want.abs().max().item()) and not k.ext.bad
    assert k.ext.calls > 0
    x = torch.randn(3, 768, generator=gen)
    assert torch.equal(plugged(lib, x, 2), own(lib, x, 2))
    assert k.ext.bad and k.ext.why == 1 and len(reports) == 1 and reports[0][0] == PACKED
    # every lane of a piece's last group written, past its n rows: the last batch row's spill
    # lands past the outputs (the guard), caught at the first call
    k = _kernel(family=PACKED)
    spill = k.built.source.replace("for (int64_t r = 0; r < n; r++) {", "for (int64_t r = 0; r < (n + 7) / 8 * 8; r++) {")
    assert spill != k.built.source
    from swarmfactory.backends.c import CBackend

    art = CBackend().build(spill, PACKED, ("-O2",))
    k = qext.Kernel(BuiltKernel(f"champion:{PACKED}@1", PACKED, "1" * 12, art.path, spill, "a test", 1e-4, 1e-4),
                    QT.Q8_0, PACKED)
    plugged, own, exts, reports = _pair(lib, k, rows=603)
    x = torch.randn(2, 768, generator=gen)
    assert torch.equal(plugged(lib, x, 2), own(lib, x, 2))
    assert k.ext.bad and k.ext.why == 3 and len(reports) == 1


def test_an_unaudited_kernel_runs_as_it_is(lib):
    """(what the checks at load judge: the kernel's raw outputs)"""
    k = _kernel("* (batch == 3 ? 1.05f : 1.f)", audit=False)
    plugged, own, _, _ = _pair(lib, k)
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(2))
    err = (plugged(lib, x, 1) - own(lib, x, 1)).abs().max().item()
    assert err > 1e-2 and not k.ext.bad


# --- through the engine, the corridor and a real store --------------------------------------------

PROMPTS = ["The quick brown fox", "Once upon a time there", "1 2 3 4 5"]
ENGINE_OPTS = dict(weights="q4_1", threads=THREADS, max_batch=4, max_seq_len=128, native_decode=4,
                   native_prefill=16, prefill_chunk=16, dense_above={})


# (architecture, weight type, the problem whose kernel runs them): a tiny Gemma 3 in Q8_0 and a
# tiny Qwen3 in Q4_K (rows of 256, so its weights are super-blocks): the block step computes both
# (decode.c cannot), so qlinear.c's kernel of that type runs every matmul of their steps
MODELS = {"gemma3-q8_0": ("gemma3", QT.Q8_0, FAMILY, {}),
          # the same weights, the kernel on the engine's packed copies (where this build packs Q8_0)
          "gemma3-q8_0-packed": ("gemma3", QT.Q8_0, PACKED, {}),
          "qwen3-q4_k": ("qwen3", QT.Q4_K, "q4_k_engine_matmul", dict(hidden_size=256, intermediate_size=512))}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    arch, qtype, family, overrides = MODELS[request.param]
    if family == PACKED and not qlinear.packs(qtype):
        pytest.skip(f"this build keeps {qtype.name} as stored: no packed copies for {family}'s kernels")
    root = tmp_path_factory.mktemp("native_matmul")
    path = tm.write_gguf(tm.hf_model(arch, **overrides), arch, root / f"tiny-{request.param}.gguf", qtype)
    return path, qtype, family


def _wrapped(source: str, family: str, cond: str) -> str:
    """The template's kernel, with its outputs 5% too large in calls where ``cond`` holds."""
    decl = qext.signature(family)
    args = ", ".join(a.split()[-1].lstrip("*") for a in decl[decl.index("(") + 1:-1].split(","))
    return source.replace(f"void {family}(", f"static void right_{family}(") + (
        f"{decl} {{\n    right_{family}({args});\n"
        f"    if ({cond}) for (int64_t i = 0; i < n * batch; i++) y[i] *= 1.05f;\n}}\n")


def _champion(db, problem, source: str) -> str:
    """``source`` recorded as a candidate that passed the harness here and made champion."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict

    store = Store(str(db))
    try:
        store.record_problem(problem)
        cand = candidate_record(problem, source, agent="test", operator="template")
        eid = store.record_verdict(problem, cand, Verdict(Outcome.FASTER, "test", "measure", speedup=1.2), None,
                                   "test")
        store.set_champion(problem, cand["id"], eid, 1.2, None, "test champion")
        return cand["id"]
    finally:
        store.close()


def _engine(path, supply=None, **kw):
    from swarmfactory.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=str(path), **{**ENGINE_OPTS, **kw}), supply=supply)


def _tokens(eng) -> list[list[int]]:
    return [c.token_ids for c in eng.generate(PROMPTS, max_tokens=8, ignore_eos=True)]


def test_the_templates_defaults_run_in_the_block_step_with_the_default_engines_tokens(model, tmp_path, lib):
    from swarmfactory.champions import Corridor
    from swarmfactory.problems import load_problem

    path, qtype, family = model
    problem = load_problem(family)
    good = _champion(tmp_path / "evidence.db", problem, problem.render())
    base = _engine(path)
    assert base.paths.native.startswith("blocks-")
    want = _tokens(base)
    eng = _engine(path, Corridor(str(tmp_path / "evidence.db")), native_matmul=f"champion:{family}")
    assert eng.paths.native_matmul[qtype.name]["candidate"] == good
    assert f"{qtype.name}=candidate {good[:12]}" in eng.paths.summary()
    assert _tokens(eng) == want
    state = eng.kernel_audit()["native_matmul"][qtype.name]
    assert state["calls"] > 0 and state["audited"] > 0 and state["dropped"] is None
    # the defaults are the engine's own code for their layout: the block step's logits bit for bit,
    # or to fp32 rounding for the stored layout's where this build runs the type on its packed copy
    ids = torch.tensor([eng.tokenizer.encode(PROMPTS[0])[-1]] * 3)
    slots, pos = torch.arange(3), torch.tensor([0, 5, 9])
    got, ref = eng.native(ids, slots, pos), base.native(ids, slots, pos)
    if family != PACKED and qlinear.packs(qtype):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    else:
        assert torch.equal(got, ref)


def test_a_wrong_candidate_is_refused_at_load_and_one_wrong_at_an_unchecked_batch_is_caught_serving(
        model, tmp_path, lib):
    from swarmfactory.champions import Corridor
    from swarmfactory.evidence.store import Store
    from swarmfactory.problems import load_problem

    path, qtype, family = model
    problem = load_problem(family)
    db = tmp_path / "evidence.db"
    wrong = _champion(db, problem, _wrapped(problem.render(), family, "1"))
    with pytest.raises(NativeUnavailable, match=f"{family} candidate {wrong}.*failed their check"):
        _engine(path, Corridor(str(db)), native_matmul=f"champion:{family}")

    base = _engine(path)
    want = _tokens(base)
    bad = _champion(db, problem, _wrapped(problem.render(), family, "batch == 3"))  # 3 sequences decode together
    eng = _engine(path, Corridor(str(db)), native_matmul=f"champion:{family}")
    assert _tokens(eng) == want  # the step that caught it ran again on the engine's own kernel
    state = eng.kernel_audit()["native_matmul"][qtype.name]
    assert state["dropped"] and f"{family} kernel {bad} gave a wrong output while serving" in state["dropped"]
    assert "batch=3" in state["dropped"]
    store = Store(str(db), create=False)
    try:
        assert any(c.found_by == "engine-audit" for c in store.found_cases(family))
        champ = store.champion(problem)
        assert champ is None or champ.candidate_id != bad
    finally:
        store.close()


def test_a_kernel_for_a_type_the_model_lacks_is_a_load_error(model, tmp_path, lib):
    from swarmfactory.champions import Corridor
    from swarmfactory.problems import load_problem

    path, qtype, family = model
    q5 = load_problem("q5_1_engine_matmul")  # (the tiny models' norms and embeddings stay F32)
    _champion(tmp_path / "evidence.db", q5, q5.render())
    with pytest.raises(NativeUnavailable, match="no Q5_1 weight of this engine.*would run nowhere"):
        _engine(path, Corridor(str(tmp_path / "evidence.db")), native_matmul="champion:q5_1_engine_matmul")
