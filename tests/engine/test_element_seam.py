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
from swarmfactory.engine.kernels import KernelError

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
    return {n: _good(n, root / f"{n}.so") for n in ("rmsnorm", "add_rmsnorm", "swiglu", "geglu")}


def _engine(path, kernels: dict, weights="fp32", supply=None):
    from swarmfactory.engine import Engine

    cfg = EngineConfig(model=str(path), weights=weights, threads=THREADS, max_batch=4, max_seq_len=128,
                       native_decode=0, native_prefill=0, kernels=kernels)
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
           ({"rope": "champion:rope"}, "unknown op 'rope'")]
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
    yield {f: problems.load_problem(f"{f}.tiny-gemma3") for f in ("rmsnorm", "add_rmsnorm", "geglu")}
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
    assert kernels == {"norm": f"champion:rmsnorm.tiny-gemma3@{ids['rmsnorm']}",
                       "add_norm": f"champion:add_rmsnorm.tiny-gemma3@{ids['add_rmsnorm']}",
                       "act": f"champion:geglu.tiny-gemma3@{ids['geglu']}"}
    assert {"rmsnorm.tiny-gemma3", "geglu", "add_rmsnorm"} <= set(D.kernel_problems(str(models["gemma3"])))
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
