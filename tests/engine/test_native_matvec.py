"""The kernel factory's q4_1_packed_matvec inside the native decoder (EngineConfig.native_matvec).

Real gcc, the real SmolLM2 weights, a real SQLite store holding the candidates. The template's
defaults are decode.c's loop, so the decoder running them is bitwise the built-in one; other
knobs that keep each output's fp32 operations in the same order (batch tile, unroll, AVX2's
maddubs for the integer dots, OpenMP) are bitwise equal too, and one that changes the order
(the offset term fused into the main loop) gives the same greedy tokens up to near ties and
logits within the q4_1 bounds.
"""

from __future__ import annotations

import re

import pytest
import torch

from engine_support import PROMPTS, THREADS, get_engine

from swarmfactory.engine.config import ConfigError, EngineConfig
from swarmfactory.engine.native import NativeUnavailable, runnable_paths
from swarmfactory.engine.native.matvec import External

PROBLEM = "q4_1_packed_matvec"
SAME_ORDER = {"bmax": 4, "unroll": 2, "dot": "maddubs", "threads": "omp"}
OPTS = {"weights": "q4_1", "max_batch": 4, "max_seq_len": 128, "threads": THREADS, "native_decode": 4,
        "native_prefill": 0, "dense_above": {}}
MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(runnable_paths()[0].name == "portable",
                                reason="the broken candidates below are broken in their SIMD code")


@pytest.fixture(scope="module")
def problem():
    from swarmfactory.problems import load_problem

    return load_problem(PROBLEM)


def _record(store, problem, source: str, outcome: str | None = None) -> str:
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.outcome import Outcome, Verdict

    cand = candidate_record(problem, source, agent="test", operator="template")
    store.record_candidate(cand)
    if outcome:
        store.record_evaluation(cand["id"], problem, Verdict(Outcome(outcome), "test", "verify"), None, "test", {},
                                purpose="eval")
    return cand["id"]


@pytest.fixture(scope="module")
def store(problem, tmp_path_factory):
    """A store whose champion is the template with SAME_ORDER knobs, plus pinnable candidates:
    the defaults and the fused offset (verified here), one never evaluated, one wrong (its
    activation scale 5% too large) and one batch-variant (scales 1e-6 larger for a lone row),
    both recorded as verified as if a harness had missed them."""
    from swarmfactory.evidence.store import Store

    path = tmp_path_factory.mktemp("native_matvec") / "evidence.db"
    st = Store(str(path))
    st.record_problem(problem)
    default = problem.render()
    assert default.count("_mm256_set1_ps(xd[b * nb + j])") == 1
    ids = {
        "champion": _record(st, problem, problem.render(SAME_ORDER), "faster"),
        "default": _record(st, problem, default, "verified"),
        "fused": _record(st, problem, problem.render({"offset": "fused"}), "not_faster"),
        "unevaluated": _record(st, problem, problem.render({"unroll": 4})),
        "wrong": _record(st, problem, default.replace("_mm256_set1_ps(xd[b * nb + j])",
                                                      "_mm256_set1_ps(1.05f * xd[b * nb + j])"), "verified"),
        "variant": _record(st, problem, default.replace("_mm256_set1_ps(xd[b * nb + j])",
                                                        "_mm256_set1_ps((batch == 1 ? 1.000001f : 1.0f) * xd[b * nb + j])"),
                           "verified"),
    }
    for name in ("default", "fused", "wrong", "variant"):  # a pin runs only what held the title here once
        st.set_champion(problem, ids[name], None, 1.1, None, "test: held the title once")
    st.set_champion(problem, ids["champion"], None, 1.2, None, "test champion")
    st.close()
    return str(path), ids


@pytest.fixture
def use_store(store, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_STORE", store[0])
    return store[1]


def _engine(**kw):
    from swarmfactory.engine import Engine

    from swarmfactory.champions import Corridor

    return Engine(EngineConfig(**{**OPTS, **kw}), supply=Corridor(None))  # the store $SWARMFACTORY_STORE names


@pytest.fixture(scope="module")
def builtin():
    return get_engine("q4_1", **{k: tuple(v.items()) if isinstance(v, dict) else v for k, v in OPTS.items()
                                 if k not in ("weights", "threads")})


def _tokens(eng) -> list[list[int]]:
    return [c.token_ids for c in eng.generate(PROMPTS[:2], max_tokens=MAX_TOKENS, ignore_eos=True)]


def _forced(eng, ids: list[int]) -> torch.Tensor:
    """Tokens teacher-forced through the engine's native decoder, one decode step each."""
    return torch.stack([eng.native(torch.tensor([t]), torch.tensor([3]), torch.tensor([i]))[0]
                        for i, t in enumerate(ids)])


def _logits(eng, text: str) -> torch.Tensor:
    return _forced(eng, eng.tokenizer.encode(text)[:10])


TIE = 0.25  # top-two logits this close are a coin toss for another rounding order (as in test_native_seam)


def _same_tokens_up_to_ties(eng, ref) -> None:
    """Greedy tokens equal the reference engine's, except where its own top two logits (native,
    teacher-forced) were within TIE and ``eng`` took the other one."""
    for text, mine, theirs in zip(PROMPTS[:2], _tokens(eng), _tokens(ref)):
        div = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if div is None:
            continue
        ids = ref.tokenizer.encode(text)
        top2 = _forced(ref, ids + theirs[:div])[-1].topk(2)
        gap = (top2.values[0] - top2.values[1]).item()
        assert gap <= TIE and mine[div] in top2.indices.tolist(), (text, div, mine, theirs, gap)


def test_champion_runs_inside_the_decoder_with_the_builtin_tokens_and_logits(use_store, builtin):
    eng = _engine(native_matvec=f"champion:{PROBLEM}")
    assert eng.native is not None and isinstance(eng.native.lib, External) and builtin.native._ext is None
    mv = eng.paths.native_matvec
    assert mv["candidate"] == use_store["champion"] and mv["speedup"] == 1.2
    assert f"(q4_1 matvec: candidate {use_store['champion']} of " in eng.paths.summary()
    assert eng.paths.as_dict()["native_matvec"]["spec"] == f"champion:{PROBLEM}"
    assert _tokens(eng) == _tokens(builtin)
    for text in PROMPTS[:2]:  # same fp32 operations in the same order: the same bits
        assert torch.equal(_logits(eng, text), _logits(builtin, text))
    ext = eng.native.lib.ext  # it ran, every call audited, none failed
    assert 0 < ext.audited < ext.calls and not ext.bad and eng.native.lib.dropped() is None


def test_pinned_candidates_load_exactly_that_candidate(use_store, builtin):
    eng = _engine(native_matvec=f"champion:{PROBLEM}@{use_store['default']}")
    assert eng.paths.native_matvec["candidate"] == use_store["default"]
    assert torch.equal(_logits(eng, PROMPTS[0]), _logits(builtin, PROMPTS[0]))  # decode.c's own loop
    fused = _engine(native_matvec=f"champion:{PROBLEM}@{use_store['fused']}")
    assert fused.paths.native_matvec["candidate"] == use_store["fused"]
    _same_tokens_up_to_ties(fused, builtin)
    # Another rounding order: 1e-5 per product, but the decoder re-quantises activations to int8
    # at every layer, where such a difference flips a rounding now and then; the logits stay
    # within the q4_1 bounds of docs/engine.md (as test_native_seam asks of a plugged kernel).
    err = (_logits(fused, PROMPTS[1]) - _logits(builtin, PROMPTS[1])).abs()
    assert 0 < err.max().item() <= 2.0 and err.mean().item() <= 0.25


def test_a_wrong_or_batch_variant_candidate_is_refused_at_load(use_store):
    for name, why in (("wrong", r"Q4_1 batch \d+: error .* against the reference"),
                      ("variant", r"Q4_1 \[10 x 96\]: row \d+ alone differs from the same row in a batch of 19")):
        cand = use_store[name]
        with pytest.raises(NativeUnavailable, match=rf"champion:{PROBLEM}@{cand}: the native decoder with "
                                                    rf"{PROBLEM} candidate {cand} \(\w+ path\) failed its check "
                                                    rf"\({why}\); it is not used"):
            _engine(native_matvec=f"champion:{PROBLEM}@{cand}")


def test_a_pinned_candidate_needs_a_correct_evaluation_here(use_store, tmp_path, monkeypatch, problem):
    for cand in (use_store["unevaluated"], "0123456789abcdef0123"):
        with pytest.raises(NativeUnavailable, match=rf"candidate {cand} has no correct evaluation \(not_faster, "
                                                    rf"faster, verified, inconclusive\) of this version of "
                                                    rf"{PROBLEM} on "
                                                    r"this hardware"):
            _engine(native_matvec=f"champion:{PROBLEM}@{cand}")
    from swarmfactory.evidence.store import Store

    st = Store(str(tmp_path / "later.db"))  # it passed once; a case found later broke it
    cand = _record(st, problem, problem.render(), "faster")
    st.set_champion(problem, cand, None, 1.1, None, "test champion")
    _record(st, problem, problem.render(), "wrong")
    st.close()
    monkeypatch.setenv("SWARMFACTORY_STORE", str(tmp_path / "later.db"))
    with pytest.raises(NativeUnavailable, match=rf"candidate {cand} no longer passes the harness on this hardware "
                                                r"\(latest: wrong\)"):
        _engine(native_matvec=f"champion:{PROBLEM}@{cand}")


def test_missing_store_champion_or_source_fail_clearly(tmp_path, monkeypatch, problem):
    from swarmfactory.evidence.store import Store

    monkeypatch.setenv("SWARMFACTORY_STORE", str(tmp_path / "none.db"))
    with pytest.raises(NativeUnavailable, match=rf"champion:{PROBLEM}: no evidence store at"):
        _engine(native_matvec=f"champion:{PROBLEM}")
    st = Store(str(tmp_path / "bad.db"))
    st.record_problem(problem)
    junk = _record(st, problem, "void q4_1_packed_matvec(int k) { (void)k; }\n", "verified")
    st.set_champion(problem, junk, None, 1.1, None, "test: held the title once")
    st.set_champion(problem, None, None, None, None, "test: dethroned")
    st.close()
    monkeypatch.setenv("SWARMFACTORY_STORE", str(tmp_path / "bad.db"))
    with pytest.raises(NativeUnavailable, match=rf"champion:{PROBLEM}: no champion of {PROBLEM} for this hardware"):
        _engine(native_matvec=f"champion:{PROBLEM}")
    with pytest.raises(NativeUnavailable, match=rf"candidate {junk} did not build: compile error"):
        _engine(native_matvec=f"champion:{PROBLEM}@{junk}")


def test_config_rules():
    with pytest.raises(ConfigError, match=re.escape(f"expected 'champion:{PROBLEM}' or 'champion:{PROBLEM}@")):
        EngineConfig.from_dict({"native_matvec": "champion:q4_1_matmul"})
    with pytest.raises(ConfigError, match="native_matvec needs the native decoder"):
        EngineConfig.from_dict({"native_matvec": f"champion:{PROBLEM}", "native_decode": 0})
    with pytest.raises(ConfigError, match="native_matvec needs the native decoder"):
        EngineConfig.from_dict({"native_matvec": f"champion:{PROBLEM}", "kernels": {"down": "int4pack"}})
    assert EngineConfig.from_dict({"native_matvec": f"champion:{PROBLEM}@abc"}).native_matvec.endswith("@abc")


# Wrong by 5% only when a call has exactly 3 rows: the harness's cases and the load checks
# (batches 1, 17, 19) never call it so; an engine decoding three sequences does at once.
ONLY_AT_3 = ("_mm256_set1_ps(xd[b * nb + j])", "_mm256_set1_ps((batch == 3 ? 1.05f : 1.0f) * xd[b * nb + j])")


def test_a_kernel_wrong_only_at_an_unchecked_batch_is_caught_while_serving(tmp_path, monkeypatch, problem, builtin,
                                                                          caplog):
    """It loads (passes every load check), then the audit catches its first wrong call: the step
    is run again without it, so every token equals the built-in decoder's; the shape becomes a
    validation case, the candidate gets a wrong evaluation here and loses its crown, and a
    design pinned to it is refused from then on."""
    from swarmfactory.evidence.store import Store

    db = tmp_path / "evidence.db"
    st = Store(str(db))
    st.record_problem(problem)
    cand = _record(st, problem, problem.render().replace(*ONLY_AT_3), "faster")
    st.set_champion(problem, cand, None, 1.3, None, "test champion")
    st.close()
    monkeypatch.setenv("SWARMFACTORY_STORE", str(db))
    eng = _engine(native_matvec=f"champion:{PROBLEM}@{cand}")
    lib = eng.native.lib
    assert isinstance(lib, External) and not lib.ext.bad
    assert _tokens(eng) == _tokens(builtin)  # two sequences: the kernel is right there
    assert not lib.ext.bad
    three = [c.token_ids for c in eng.generate(PROMPTS[:3], max_tokens=MAX_TOKENS, ignore_eos=True)]
    assert three == [c.token_ids for c in builtin.generate(PROMPTS[:3], max_tokens=MAX_TOKENS, ignore_eos=True)]
    assert lib.ext.bad and lib.ext.batch == 3
    msg = lib.dropped()
    assert f"{PROBLEM} kernel {cand} gave a wrong output while serving (n=" in msg and "batch=3" in msg
    assert "dethroned" in msg and any("wrong output while serving" in r.message for r in caplog.records)
    calls = lib.ext.calls
    eng.generate(PROMPTS[:3], max_tokens=4, ignore_eos=True)
    assert lib.ext.calls == calls  # dropped for good

    st = Store(str(db), create=False)
    try:
        cases = st.found_cases(PROBLEM)
        assert [(c.shape["batch"], c.found_by, c.broke_candidate) for c in cases] == \
            [(3, "engine-audit", cand)]
        last = st.evaluations(problem=PROBLEM, candidate_id=cand, this_hardware=True)[-1]
        assert last.outcome == "wrong" and last.purpose == "engine-audit" and "batch=3" in last.detail
        assert st.champion(problem) is None
    finally:
        st.close()
    with pytest.raises(NativeUnavailable, match=rf"candidate {cand} no longer passes the harness on this hardware "
                                                r"\(latest: wrong\)"):
        _engine(native_matvec=f"champion:{PROBLEM}@{cand}")


def _wrapped(problem, after: str) -> str:
    """The template's kernel, then ``after`` (C, with the call's arguments in scope)."""
    src = problem.render().replace("void q4_1_packed_matvec(", "static void right_matvec(")
    return src + ("void q4_1_packed_matvec(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,\n"
                  "                        float *y, int64_t n, int64_t k, int64_t batch) {\n"
                  f"    right_matvec(w, xq, xd, xs, y, n, k, batch);\n    {after}\n}}\n")


@pytest.mark.parametrize("after,why", [
    ("if (batch == 3) ((int8_t *)xq)[5] ^= 3;", "the call changed its inputs"),
    ("if (batch == 3) y[n * batch + 2] = 0.f;", "the call wrote past its outputs"),
], ids=["changes-its-inputs", "writes-past-its-outputs"])
def test_the_audit_checks_every_call_leaves_its_inputs_and_the_memory_past_its_outputs(problem, after, why):
    """Right outputs, but at 3 rows the kernel changes the activations every thread's calls share,
    or writes past its outputs: caught at that call; the result is computed again from scratch."""
    from gguf import GGMLQuantizationType as QT

    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.kernels import Weight
    from swarmfactory.engine.native import linear, load_library, random_tensor
    from swarmfactory.engine.supply import BuiltKernel, NoSupply

    src = _wrapped(problem, after)
    art = CBackend().build(src, PROBLEM, prototype=problem.c_prototype, checks=True)
    mv = BuiltKernel("test", PROBLEM, "", art.path, src, "test", problem.tolerance.rtol, problem.tolerance.atol)
    lib = load_library(runnable_paths()[0])
    weight = Weight([random_tensor(QT.Q4_1, 67, 288, seed=2)])
    for rows in (2, 3):
        x = torch.randn(rows, 288, generator=torch.Generator().manual_seed(rows))
        ext = External(lib, mv, __import__("ctypes").CDLL(art.path), NoSupply().on_wrong)
        # one thread: on two, the other thread's call may read the changed input first and its
        # wrong output be the finding recorded (caught all the same, but another message)
        assert torch.equal(linear(lib, weight, x, threads=1, ext=ext.ext), linear(lib, weight, x, threads=1))
        assert bool(ext.ext.bad) == (rows == 3)
    assert f"batch=3: {why}" in ext.ext.mismatch()


def test_the_audit_catches_a_wrong_call_and_recomputes_it(problem):
    """sf_linear with the kernel: the rows of a call at the bad batch come back right (computed
    again by the built-in loop) and the first mismatch is named; the raw kernel (audit off) is
    wrong there, as the load checks would have seen had they run that batch."""
    from gguf import GGMLQuantizationType as QT

    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.kernels import Weight
    from swarmfactory.engine.native import linear, load_library, random_tensor
    from swarmfactory.engine.supply import BuiltKernel, NoSupply

    src = problem.render().replace(*ONLY_AT_3)
    art = CBackend().build(src, PROBLEM, prototype=problem.c_prototype, checks=True)
    kernel = __import__("ctypes").CDLL(art.path)
    mv = BuiltKernel("test", PROBLEM, "only-at-3", art.path, src, "test", problem.tolerance.rtol,
                     problem.tolerance.atol)
    lib = load_library(runnable_paths()[0])
    weight = Weight([random_tensor(QT.Q4_1, 67, 288, seed=1)])
    for rows, wrong in ((2, False), (3, True), (5, False)):
        x = torch.randn(rows, 288, generator=torch.Generator().manual_seed(rows))
        ref = linear(lib, weight, x, threads=2)
        ext = External(lib, mv, kernel, NoSupply().on_wrong)
        raw = ext.new_ext(audit=False)
        assert torch.equal(linear(lib, weight, x, threads=2, ext=ext.ext), ref)
        assert bool(ext.ext.bad) == wrong and ext.ext.calls >= 1
        assert (not torch.equal(linear(lib, weight, x, threads=2, ext=raw), ref)) == wrong and not raw.bad
        if wrong:
            assert ext.ext.mismatch().startswith("n=") and "batch=3: output [" in ext.ext.mismatch()
