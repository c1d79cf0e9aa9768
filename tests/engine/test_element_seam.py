"""The engine's non-linear ops cross the seam too: a kernel of ``rmsnorm``, ``add_rmsnorm``,
``swiglu`` or ``geglu`` (a file, or a champion of a problem derived from the model, through the
corridor) runs the norms, the residual add + norm and the gated activation inside the engine,
checked at load on the model's sizes and audited while serving; a broken one is refused or
dropped, and a champion's fault is reported against its problem."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tiny_models as tm
from engine_support import THREADS

from swarmfactory.engine.config import ConfigError, EngineConfig
from swarmfactory.engine.kernels import KernelError, Weight

PROMPT = "The quick brown fox jumps over the lazy dog"
PROMPTS = ["The quick brown fox", "Once upon a time there", "1 2 3 4 5", "Paris is the capital"]


def _so(source: str, symbol: str, prototype: str, dest) -> str:
    from swarmfactory.backends.c import CBackend

    art = CBackend().build(source, symbol, prototype=prototype)
    shutil.copyfile(art.path, dest)
    return str(dest)


def _problem(name):
    from swarmfactory.problems import load_problem

    return load_problem(name)


def _good(name: str, dest) -> str:
    p = _problem(name)
    return _so(p.render(), p.entry, p.c_prototype, dest)


def _wrapped(name: str, body: str) -> str:
    """The problem's own kernel, renamed, called by a function of the ABI that then runs ``body``
    (C with the ABI's argument names in scope)."""
    p = _problem(name)
    args = ", ".join(a.name for a in p.args)
    return (p.render().replace(f"void {p.entry}(", f"static void right_{p.entry}(")
            + f"{p.c_signature} {{\n    right_{p.entry}({args});\n    {body}\n}}\n")


def _bad(name: str, body: str, dest) -> str:
    p = _problem(name)
    return _so(_wrapped(name, body), p.entry, p.c_prototype, dest)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("element_seam")
    return {arch: tm.write_gguf(tm.hf_model(arch), arch, root / f"tiny-{arch}.gguf", QT.Q8_0)
            for arch in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("element_libs")
    return {n: _good(n, root / f"{n}.so") for n in ("rmsnorm", "add_rmsnorm", "swiglu", "geglu", "rope",
                                                     "attention_decode")}


def _engine(path, kernels: dict, weights="fp32", supply=None, **kw):
    from swarmfactory.engine import Engine

    cfg = EngineConfig(model=str(path), weights=weights, threads=THREADS, max_batch=4, max_seq_len=128,
                       native_decode=0, native_prefill=0, kernels=kernels, **kw)
    return Engine(cfg, supply=supply)


@pytest.mark.parametrize("arch, act", [("llama", "swiglu"), ("gemma3", "geglu")])
def test_every_non_linear_op_runs_a_factory_kernel(models, libs, arch, act):
    """fp32 engine: the kernels' outputs match the engine's own to fp32 rounding, every op is
    called (Gemma: q/k head norms and sandwich norms through ``norm``) and audited."""
    base = _engine(models[arch], {})
    eng = _engine(models[arch], {"norm": f"so:{libs['rmsnorm']}", "add_norm": f"so:{libs['add_rmsnorm']}",
                                 "act": f"so:{libs[act]}"})
    assert {op: k.family for op, k in eng.model.ops.kernels.items()} == {"norm": "rmsnorm",
                                                                       "add_norm": "add_rmsnorm", "act": act}
    nk = eng.paths.native_kernels
    assert nk["act"]["types"] == [act] and nk["norm"]["checked"] and eng.paths.kernels["add_norm"].startswith("so:")
    ids = base.tokenizer.encode(PROMPT)
    a, b = base.score(ids), eng.score(ids)
    assert (a - b).abs().max().item() <= 1e-3 * (1 + a.abs().max().item())
    for op, k in eng.model.ops.kernels.items():
        st = type(k).audit_state
        assert st["calls"] > 0 and st["audited"] > 0 and st["dropped"] is None, (op, st)
    if arch == "gemma3":  # q/k head norms: rows of head size through the same kernel
        assert any(cols == eng.model.hd for _, cols in eng.model.ops.kernels["norm"]._seen)
    # a batch of sequences, generated token by token: the same tokens as the engine's own code
    want = [c.token_ids for c in base.generate(PROMPTS, max_tokens=5, ignore_eos=True)]
    assert [c.token_ids for c in eng.generate(PROMPTS, max_tokens=5, ignore_eos=True)] == want


def test_a_bf16_engine_converts_activations_for_the_kernels(models, libs):
    base = _engine(models["gemma3"], {}, weights="bf16")
    eng = _engine(models["gemma3"], {"norm": f"so:{libs['rmsnorm']}", "act": f"so:{libs['geglu']}"}, weights="bf16")
    ids = base.tokenizer.encode(PROMPT)
    err = (eng.score(ids) - base.score(ids)).abs().max().item()
    assert err <= 0.3, err  # bf16 roundings in other places, within the quantised engine's bound
    assert all(type(k).audit_state["dropped"] is None for k in eng.model.ops.kernels.values())


@pytest.mark.parametrize("problem, op, body, match", [
    ("rmsnorm", "norm", "y[rows * cols] = 0.0f;", "wrote outside its outputs"),
    ("rmsnorm", "norm", "((float *)w)[0] += 1.0f;", "changed its inputs"),
    ("add_rmsnorm", "add_norm", "for (int64_t i = 0; i < rows * cols; i++) h[i] = x[i];", r"output 0 \[0, 0\]"),
    ("add_rmsnorm", "add_norm", "if (rows > 1) y[(rows - 1) * cols + 3] = 0.0f;", r"output 1 \[4, 3\]"),
    ("geglu", "act", "if (n > 200) y[n - 1] *= 1.01f;", r"output \[4, 127\]"),
])
def test_a_broken_kernel_is_refused_at_load(models, tmp_path, problem, op, body, match):
    so = _bad(problem, body, tmp_path / "bad.so")
    with pytest.raises(KernelError, match=rf"kernels?\W.*{op}.*{match}"):
        _engine(models["gemma3"], {op: f"so:{so}"})


def test_a_kernel_wrong_only_at_a_size_the_load_check_skips_is_dropped_while_serving(models, tmp_path):
    """Wrong only in calls of four rows (the load check runs one and five): the audit catches the
    first such call, the call is computed again by the engine's own code, and from then on the
    engine's numbers are the default engine's, bit for bit."""
    so = _bad("rmsnorm", "if (rows == 4) for (int64_t i = 0; i < cols; i++) y[i] *= 1.05f;", tmp_path / "at4.so")
    base = _engine(models["llama"], {})
    eng = _engine(models["llama"], {"norm": f"so:{so}"})
    ids = base.tokenizer.encode(PROMPT)[:4]
    assert len(ids) == 4
    got = eng.score(ids)  # a step of four prompt tokens: norm calls of four rows
    st = type(eng.model.ops.kernels["norm"]).audit_state
    assert st["dropped"] and "rows=4" in st["dropped"] and "not from the store" in st["dropped"]
    assert torch.equal(got, base.score(ids))
    audit = eng.kernel_audit()["native_kernels"]  # what /health carries, and engine tune reads
    assert audit["norm"]["dropped"] == st["dropped"] and audit["norm"]["audited"] >= 1
    assert torch.equal(eng.score(base.tokenizer.encode(PROMPT)), base.score(base.tokenizer.encode(PROMPT)))


def test_the_wrong_activation_and_bad_names_are_refused_with_the_reason(models, libs):
    with pytest.raises(KernelError, match=r"kernels\.act: .*runs geglu, but this model's act op is swiglu"):
        _engine(models["llama"], {"act": f"so:{libs['geglu']}"})
    with pytest.raises(KernelError, match=r"kernels\.norm: so:.*does not export `rmsnorm`"):
        _engine(models["llama"], {"norm": f"so:{libs['geglu']}"})
    bad = [({"act": "int4pack"}, "runs the engine's own code or a kernel-factory kernel"),
           ({"norm": "champion:q4_k_matmul"}, "only champions of rmsnorm"),
           ({"add_norm": "champion:add_rmsnorm+champion:rmsnorm"}, "one kernel runs the add_norm op"),
           ({"rope": "champion:attention_decode"}, "only champions of rope"),
           ({"mlp": "champion:swiglu"}, "unknown op 'mlp'")]
    for kernels, match in bad:
        with pytest.raises(ConfigError, match=match):
            EngineConfig.from_dict({"kernels": kernels})


@pytest.fixture
def derived(models, tmp_path, monkeypatch):
    """The tiny Gemma's problems, derived and registered in a cache of this test's own."""
    from swarmfactory import problems
    from swarmfactory.problems.derive import derive, register

    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    problems._CACHE.clear()
    register(derive(models["gemma3"]))
    yield {f: problems.load_problem(f"{f}.tiny-gemma3") for f in ("rmsnorm", "add_rmsnorm", "geglu", "rope",
                                                                  "attention_decode")}
    problems._CACHE.clear()


def _champion(store, problem, source: str) -> str:
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.outcome import Outcome, Verdict

    cand = candidate_record(problem, source, agent="test", operator="template")
    eid = store.record_verdict(problem, cand, Verdict(Outcome.FASTER, "test", "measure", speedup=1.2), None, "test")
    store.set_champion(problem, cand["id"], eid, 1.2, None, "test champion")
    return cand["id"]


def test_derived_champions_run_through_the_corridor_and_a_wrong_one_is_reported(models, derived, tmp_path):
    from swarmfactory.champions import Corridor
    from swarmfactory.enginefactory import design as D
    from swarmfactory.evidence.store import Store

    db = str(tmp_path / "evidence.db")
    store = Store(db)
    ids = {f: _champion(store, p, p.render()) for f, p in derived.items()}
    store.close()
    # what a kernels=champion design of this model pins: the derived problems' champions
    champions = {p.name: ids[f] for f, p in derived.items()}
    kernels = D.champion_kernels(str(models["gemma3"]), champions)
    ops = {"norm": "rmsnorm", "add_norm": "add_rmsnorm", "act": "geglu", "rope": "rope", "attention": "attention_decode"}
    assert kernels == {op: f"champion:{f}.tiny-gemma3@{ids[f]}" for op, f in ops.items()}
    assert {"rmsnorm.tiny-gemma3", "geglu", "add_rmsnorm", "attention_decode"} <= set(D.kernel_problems(str(models["gemma3"])))
    # a design with a bf16 KV cache pins every champion but attention's (it reads an fp32 cache)
    q4 = EngineConfig(model=str(models["gemma3"]), weights="q4_1")
    design = D.build({"kernels": "champion", "kv_dtype": "bf16"}, q4, champions)
    assert set(design.config.kernels) == set(ops) - {"attention"}
    assert set(D.build({"kernels": "champion"}, q4, champions).config.kernels) == set(ops)
    base = _engine(models["gemma3"], {})
    eng = _engine(models["gemma3"], kernels, supply=Corridor(db))
    assert eng.paths.native_kernels["act"]["candidate"] == ids["geglu"]
    tokens = base.tokenizer.encode(PROMPT)
    assert (eng.score(tokens) - base.score(tokens)).abs().max().item() < 1e-2

    # a geglu champion of the derived problem that is wrong in calls of four rows only
    store = Store(db)
    geglu = derived["geglu"]
    bad = _champion(store, geglu, _wrapped("geglu", "if (n == 4 * 128) y[5] += 1.0f;"))
    store.close()
    eng = _engine(models["gemma3"], {"act": f"champion:{geglu.name}"}, supply=Corridor(db))
    eng.score(tokens[:4])
    st = type(eng.model.ops.kernels["act"]).audit_state
    assert st["dropped"] and f"{geglu.name} kernel {bad} gave a wrong output while serving" in st["dropped"]
    store = Store(db, create=False)
    try:
        found = store.found_cases(geglu.name)
        assert any(c.found_by == "engine-audit" and c.shape == {"n": 512} for c in found)
        champ = store.champion(geglu)
        assert champ is None or champ.candidate_id != bad
    finally:
        store.close()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rope_and_decode_attention_run_factory_kernels(models, libs, arch):
    """RoPE of the q and k heads and decode attention in place over the KV cache. Gemma's sliding
    layers keep a ring of window - 1 + prefill_chunk = 23 positions here, so 40 generated tokens
    wrap it: the window is then gathered from its two stretches. Greedy tokens equal the engine's
    own, logits to fp32 rounding; both global and local RoPE sets run the kernel."""
    kw = dict(prefill_chunk=16)
    base = _engine(models[arch], {}, **kw)
    eng = _engine(models[arch], {"rope": f"so:{libs['rope']}", "attention": f"so:{libs['attention_decode']}"}, **kw)
    if arch == "gemma3":
        assert eng.model.ops.kernels["rope"].thetas == [r.theta for r in eng.model.ropes] and len(eng.model.ropes) == 2
        assert any(eng.kv.is_ring(li) for li in range(len(eng.model.layers)))
    want = [c.token_ids for c in base.generate(PROMPTS, max_tokens=40, ignore_eos=True)]
    assert [c.token_ids for c in eng.generate(PROMPTS, max_tokens=40, ignore_eos=True)] == want
    ids = base.tokenizer.encode(PROMPTS[0]) + want[0]
    a, b = base.score(ids), eng.score(ids)
    assert (a - b).abs().max().item() <= 1e-4 * (1 + a.abs().max().item())
    for op, k in eng.model.ops.kernels.items():
        st = type(k).audit_state
        assert st["calls"] > st["audited"] > 0 and st["dropped"] is None, (op, st)


def test_a_rope_kernel_wrong_at_three_tokens_and_an_attention_kernel_wrong_past_eight_keys_are_dropped(
        models, tmp_path):
    rope = _bad("rope", "if (tokens == 3) y[7] = -y[7];", tmp_path / "rope3.so")
    att = _bad("attention_decode", "if (seq > 8 && seq < 40) out[0] += 0.5f;", tmp_path / "att8.so")  # load: 1, 7, 300
    base = _engine(models["llama"], {})
    eng = _engine(models["llama"], {"rope": f"so:{rope}", "attention": f"so:{att}"})
    ids = base.tokenizer.encode(PROMPT)
    eng.score(ids[:3])  # a step of three prompt tokens: the rope call is audited (a new size) and caught
    r = type(eng.model.ops.kernels["rope"]).audit_state
    assert r["dropped"] and "tokens=3" in r["dropped"] and "not from the store" in r["dropped"]
    # decode attention: the first call with 16 keys opens a new size bucket, so it is audited at the latest
    eng.generate([PROMPTS[2]], max_tokens=20, ignore_eos=True)
    a = type(eng.model.ops.kernels["attention"]).audit_state
    assert a["dropped"] and "seq=" in a["dropped"]
    assert torch.equal(eng.score(ids), base.score(ids))  # both dropped: the engine's own code throughout
    audit = eng.kernel_audit()["native_kernels"]
    assert audit["rope"]["dropped"] and audit["attention"]["dropped"]


def test_rope_and_attention_kernels_refused_where_they_cannot_run(models, libs, tmp_path):
    from swarmfactory.engine.native_ops import ROPE_MAX_POS

    scaled = tm.write_gguf(tm.hf_model("llama", rope="linear"), "llama", tmp_path / "scaled.gguf", QT.Q8_0)
    with pytest.raises(KernelError, match=r"kernels\.rope: .*scales its frequencies .*no layer could run it"):
        _engine(scaled, {"rope": f"so:{libs['rope']}"})
    with pytest.raises(ConfigError, match=r"kernels\.attention reads the KV cache in place as fp32.*kv_dtype is bf16"):
        EngineConfig.from_dict({"kv_dtype": "bf16", "kernels": {"attention": f"so:{libs['attention_decode']}"}})
    # refused at load: wrong at the largest angle, a write past the output, a changed KV cache
    for lib, op, body, match in [
            ("rope", "rope", "if (pos[0] > 4000) y[0] += 1.0f;", r"position 4095"),
            ("attention_decode", "attention", "out[heads * head_dim] = 0.0f;", "wrote outside its output"),
            ("attention_decode", "attention", "((float *)k)[0] = 0.0f;", "changed its inputs")]:
        with pytest.raises(KernelError, match=rf"for the {op} op failed its check.*{match}"):
            _engine(models["gemma3"], {op: f"so:{_bad(lib, body, tmp_path / (op + '.so'))}"})
    # positions past the rope problem's range run the engine's own code: not a fault of the kernel
    eng = _engine(models["llama"], {"rope": f"so:{libs['rope']}"})
    k = eng.model.ops.kernels["rope"]
    x = torch.randn(2, 6, eng.model.hd)
    assert k.apply(x, torch.tensor([5, ROPE_MAX_POS]), 0) is None and not k.dropped
    assert k.apply(x, torch.tensor([5, 9]), 0) is not None


@pytest.mark.parametrize("tell", [
    "y[rows * cols] == 1234.5f",                        # a fixed sentinel past the output
    "y[rows * cols] == y[rows * cols + 1] && y[rows * cols + 1] == y[rows * cols + 2]",  # any constant fill
])
def test_a_kernel_that_behaves_only_when_it_sees_a_guard_zone_gains_nothing(models, tmp_path, tell):
    """A hostile kernel reads past its output to learn whether the call is checked, and is right
    only then. Every call's output lies between guard zones of random values, audited or not, so
    what it reads never tells: it is wrong on the load check's calls too and is refused."""
    so = _bad("rmsnorm", f"if (!({tell})) for (int64_t i = 0; i < cols; i++) y[i] += 0.25f;", tmp_path / "peek.so")
    with pytest.raises(KernelError, match=r"for the norm op failed its check.*output \[0, "):
        _engine(models["llama"], {"norm": f"so:{so}"})


def test_a_linear_kernel_that_peeks_past_its_output_is_refused_too(tmp_path):
    from swarmfactory.engine.native.qlinear import random_part
    from swarmfactory.engine.native_seam import guarded, kernel_class

    q8 = _problem("q8_0_matmul")
    src = _wrapped("q8_0_matmul", "if (y[n * batch] != 1234.5f) y[0] += 1.0f;")
    so = _so(src, q8.entry, q8.c_prototype, tmp_path / "peek_q8.so")
    w = Weight([random_part(QT.Q8_0, 64, 64, seed=7)])
    with pytest.raises(KernelError, match=r"first at output \[0, 0\]"):
        kernel_class(so)(w, torch.float32)
    # the zones differ from call to call: no fixed pattern to learn either
    import random

    rng = random.Random(0)
    a, b = guarded(8, rng)[1], guarded(8, rng)[1]
    assert not torch.equal(a[0][:64], b[0][:64]) and not torch.equal(a[0][:64], a[0][-64:])
