"""The native seam: shared objects built by the kernel factory run the engine's linear ops.

Real gcc (the C backend), the real SmolLM2 weights, a real SQLite store. The library is the
q4_1_matmul problem's default template; the broken one is the same with a 5% error in every
block scale. Engines are shared per module (every load checks each plugged weight once).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest
import torch

from engine_support import PROMPTS, THREADS, Server, free_port, get_engine

from swarmfactory.champions import Corridor
from swarmfactory.engine.config import ConfigError, EngineConfig
from swarmfactory.engine.kernels import KernelError, build_linear, register_kernel

Q4_1_OPS = ("qkv", "o", "gate_up", "down")  # the output head is stored as Q8_0
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def problem():
    from swarmfactory.problems import load_problem

    return load_problem("q4_1_matmul")


@pytest.fixture(scope="module")
def libs(problem, tmp_path_factory):
    """Paths of built libraries, as a user would hold them: good, broken, wrong symbol, junk."""
    from swarmfactory.backends.c import CBackend

    tmp = tmp_path_factory.mktemp("native_seam")
    good = problem.render()
    broken = re.sub(r"= h2f\((bp\d)\), ", r"= 1.05f * h2f(\1), ", good)  # d 5% too large
    # outputs 5% too large only in calls of 4 rows: the load check runs 1 and 5
    only4 = good.replace("void q4_1_matmul(", "static void right_q4_1_matmul(") + (
        "void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {\n"
        "    right_q4_1_matmul(wq, x, y, n, k, batch);\n"
        "    if (batch == 4) for (int64_t i = 0; i < n * batch; i++) y[i] *= 1.05f;\n}\n")
    # right outputs, but in calls of 4 rows it changes its input (the activations the next op reads)
    changes4 = good.replace("void q4_1_matmul(", "static void right_q4_1_matmul(") + (
        "void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {\n"
        "    right_q4_1_matmul(wq, x, y, n, k, batch);\n"
        "    if (batch == 4) ((float *)x)[3] += 1.0f;\n}\n")
    assert broken != good and good.count("void q4_1_matmul(") == 1
    cc = CBackend()
    out = {}
    for name, src, symbol, proto in (("good", good, problem.name, problem.c_prototype),
                                     ("broken", broken, problem.name, problem.c_prototype),
                                     ("only4", only4, problem.name, problem.c_prototype),
                                     ("changes4", changes4, problem.name, problem.c_prototype),
                                     ("other", "void other_name(void) {}\n", "other_name", None)):
        art = cc.build(src, symbol, prototype=proto)
        out[name] = tmp / f"{name}.so"
        shutil.copyfile(art.path, out[name])
    out["junk"] = tmp / "junk.so"
    out["junk"].write_text("not a shared object\n")
    out["source"] = good
    return out


def _engine(kernels: dict, **kw):
    from swarmfactory.engine import Engine

    opts = {"weights": "q4_1", "max_batch": 4, "max_seq_len": 128, "threads": THREADS, "native_decode": 0,
            "dense_above": {}, "kernels": kernels, **kw}
    return Engine(EngineConfig(**opts))


def _outputs(eng) -> tuple[list, list]:
    """Greedy tokens for PROMPTS (batched) and the prompt ids."""
    return ([c.token_ids for c in eng.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)],
            [eng.tokenizer.encode(p) for p in PROMPTS])


@pytest.fixture(scope="module")
def reference():
    """The default q4_1 engine (torch's int4 kernel for every matmul, native decoder off), its
    greedy tokens for PROMPTS and its logits over each prompt + those tokens."""
    eng = get_engine("q4_1", native_decode=0, dense_above=(), max_batch=4, max_seq_len=128)
    tokens, prompts = _outputs(eng)
    return eng, tokens, [eng.score(ids + out) for ids, out in zip(prompts, tokens)]


@pytest.fixture(scope="module")
def weight(model_path):
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.kernels import Weight

    return Weight([load_gguf(model_path).tensor("blk.3.ffn_down.weight")])


TIE = 0.25  # two bf16 steps of a logit around 16-32: the reference's top two are a coin toss


def _assert_close_to(eng, reference):
    """Greedy tokens equal the reference's up to a near tie of its own logits (top two within
    TIE), where the plugged engine takes the other one; teacher-forced over each prompt and the
    reference's tokens, the logits stay within the q4_1 bounds of docs/engine.md and pick the
    reference's token wherever it is no tie."""
    _, ref_tokens, ref_logits = reference
    tokens, prompts = _outputs(eng)
    for p, ids, mine, theirs, ref in zip(PROMPTS, prompts, tokens, ref_tokens, ref_logits):
        gen = ref[len(ids) - 1:-1]  # the logits that chose each reference token
        top2 = gen.topk(2, -1)
        gap = top2.values[:, 0] - top2.values[:, 1]
        div = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if div is not None:
            assert gap[div] <= TIE and mine[div] in top2.indices[div].tolist(), \
                (p, div, mine, theirs, gap[div].item())
        logits = eng.score(ids + theirs)
        err = (logits - ref).abs()
        assert err.max().item() <= 2.0 and err.mean().item() <= 0.25, (p, err.max().item(), err.mean().item())
        clear = gap > TIE
        assert (logits[len(ids) - 1:-1].argmax(-1)[clear] == torch.tensor(theirs)[clear]).all(), p


def test_built_library_runs_one_op_and_matches_the_default_engine(libs, reference):
    eng = _engine({"down": f"so:{libs['good']}"})
    nk = eng.paths.native_kernels
    assert set(nk) == {"down"} and nk["down"]["origin"] == str(libs["good"].resolve())
    assert f"native kernels: down={libs['good'].resolve()}" in eng.paths.summary()
    layer = eng.model.layers[0]
    assert type(layer.down.kernel).__name__.startswith("NativeLinear") and layer.down.dense is None
    _assert_close_to(eng, reference)


def test_built_library_runs_every_q4_1_op(libs, reference):
    eng = _engine({op: f"so:{libs['good']}" for op in Q4_1_OPS})
    assert set(eng.paths.native_kernels) == set(Q4_1_OPS)
    _assert_close_to(eng, reference)


def test_kernel_is_one_ctypes_call_on_raw_pointers_in_fp32_or_bf16(libs, weight):
    from swarmfactory.engine.native_seam import kernel_class

    cls = kernel_class(libs["good"])
    w = weight.dequantize()
    x = torch.randn(3, weight.cols, generator=torch.Generator().manual_seed(1))
    k32 = cls(weight, torch.float32)
    calls = []
    run = k32.runs[0]
    assert len(k32.runs) == 1 and k32.library_rows == weight.rows
    native = run.fn
    run.fn = lambda *a: (calls.append(a), native(*a))
    y32 = k32(x)
    assert len(calls) == 1 and all(isinstance(a, int) for a in calls[0])
    assert calls[0][0] == run.wq.data_ptr() and calls[0][1] == x.data_ptr()  # fp32 input passed as it is
    assert calls[0][3:] == (weight.rows, weight.cols, 3)
    assert y32.dtype == torch.float32 and torch.allclose(y32, x @ w.T, rtol=1e-4, atol=1e-4)
    xb = x.bfloat16()
    yb = cls(weight, torch.bfloat16)(xb)  # converted to fp32 for the call, the result back
    assert yb.dtype == torch.bfloat16
    assert torch.allclose(yb.float(), xb.float() @ w.T, rtol=1e-2, atol=1e-2)
    assert cls(weight, torch.float32)(x.t().contiguous().t()).equal(y32)  # non-contiguous input


def test_broken_library_is_refused_by_the_load_check(libs):
    with pytest.raises(KernelError, match=r"kernels\.down: kernel 'so:.*broken\.so' failed its check on "
                                          r"blk\.0\.ffn_down\.weight .*max abs error"):
        _engine({"down": f"so:{libs['broken']}"})


def test_a_library_wrong_only_at_an_unchecked_batch_is_caught_while_serving(libs, reference, weight):
    """It passes the load check; serving four prompts at once calls it with 4 rows, where the
    audit catches it: the op's own kernel computes that call again and every later one, so the
    engine's outputs stay those of the default engine (up to ties), and /health says why."""
    from swarmfactory.engine.native_seam import kernel_class

    raw = kernel_class(libs["only4"], name="test_only4_unchecked", check=False)(weight, torch.float32)
    x = torch.randn(5, weight.cols, generator=torch.Generator().manual_seed(4))
    ref = x @ weight.dequantize().T
    assert torch.allclose(raw(x[:3]), ref[:3], rtol=1e-4, atol=1e-4)  # it really is hostile
    assert (raw(x[:4]) - ref[:4]).abs().max().item() > 0.05
    eng = _engine({op: f"so:{libs['only4']}" for op in Q4_1_OPS})
    st = type(eng.model.layers[0].down.kernel).audit_state
    assert st["dropped"] is None and len(PROMPTS) == 4
    _assert_close_to(eng, reference)
    assert "batch=4: output [" in st["dropped"] and "(not from the store)" in st["dropped"]
    audit = eng.kernel_audit()["native_kernels"]
    assert set(audit) == set(Q4_1_OPS) and audit["down"]["dropped"] == st["dropped"]
    assert 0 < audit["down"]["audited"] <= audit["down"]["calls"]


def test_a_library_that_changes_its_inputs_at_an_unchecked_batch_is_caught(libs, weight):
    """The first call at 4 rows is audited: the change to its input is seen, the op's own kernel
    computes the call from the input as it was, and the library is dropped."""
    from swarmfactory.engine.native_seam import kernel_class

    cls = kernel_class(libs["changes4"], name="test_changes4")
    op = cls(weight, torch.float32)  # passes the load check (1 and 5 rows)
    x = torch.randn(4, weight.cols, generator=torch.Generator().manual_seed(5))
    x_in = x.clone()
    y = op(x)
    assert "batch=4: the call changed its inputs" in cls.audit_state["dropped"]
    assert torch.allclose(y, x_in @ weight.dequantize().T, rtol=1e-2, atol=1e-2)
    assert op.fallback() is not None and not torch.equal(x, x_in)  # it did change the caller's tensor


def test_broken_library_can_be_plugged_unchecked_for_verifier_tests(libs, weight):
    """The engine factory's verifier must reject a design with a broken kernel by itself: a test
    registers the library with check=False (no config can) and names it."""
    from swarmfactory.engine.native_seam import kernel_class

    with pytest.raises(KernelError, match="max abs error"):
        kernel_class(libs["broken"])(weight, torch.bfloat16)
    register_kernel(kernel_class(libs["broken"], name="test_broken_unchecked", check=False))
    lin = build_linear("q4_1", "down", weight, torch.bfloat16, "test_broken_unchecked", None)
    x = torch.randn(2, weight.cols, generator=torch.Generator().manual_seed(2)).bfloat16()
    err = (lin(x).float() - x.float() @ weight.dequantize().T).abs().max().item()
    assert err > 0.05  # it serves wrong numbers


def test_unchecked_environment_for_engines_in_child_processes(libs, weight, monkeypatch):
    """An engine in a child process (the engine factory's worker) skips the check only under
    SWARMFACTORY_TEST_UNCHECKED_KERNELS=1, and its paths say so."""
    from swarmfactory.engine.native_seam import describe, resolve, resolve_all

    monkeypatch.setenv("SWARMFACTORY_TEST_UNCHECKED_KERNELS", "1")
    desc = describe(resolve_all({"down": f"so:{libs['broken']}"}))["down"]
    assert desc["checked"] is False and desc["short"].endswith("UNCHECKED")
    build_linear("q4_1", "down", weight, torch.bfloat16, f"so:{libs['broken']}", None)  # no error
    monkeypatch.delenv("SWARMFACTORY_TEST_UNCHECKED_KERNELS")
    assert describe(resolve_all({"down": f"so:{libs['good']}"}))["down"]["checked"] is True
    with pytest.raises(KernelError, match="max abs error"):
        resolve(f"so:{libs['broken']}")(weight, torch.bfloat16)


def test_missing_file_symbol_or_library_fail_clearly(libs, model_path):
    with pytest.raises(KernelError, match=r"kernels\.down: so:/nonexistent/q\.so: no such shared object"):
        _engine({"down": "so:/nonexistent/q.so"})
    with pytest.raises(KernelError, match=r"kernels\.o: so:.*other\.so: .* exports none of `q4_1_matmul`, "
                                          r"`q4_0_matmul`.* \(the engine calls void <type>_matmul\(const uint8_t "
                                          r"\*wq, .*one function per GGUF block type"):
        _engine({"o": f"so:{libs['other']}"})
    with pytest.raises(KernelError, match=r"kernels\.qkv: so:.*junk\.so: cannot load"):
        _engine({"qkv": f"so:{libs['junk']}"})
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.kernels import Weight

    from swarmfactory.engine.native_seam import check_used

    head = Weight([load_gguf(model_path).tensor("token_embd.weight")])
    lin = build_linear("q4_1", "lm_head", head, torch.bfloat16, f"so:{libs['good']}", None)
    assert lin.kernel.library_rows == 0  # the Q8_0 rows run the engine's own kernel
    with pytest.raises(KernelError, match=r"kernels\.lm_head: kernel 'so:.*' takes Q4_1 blocks, but no lm_head "
                                          r"weight has a part stored so \(they are Q8_0\)"):
        check_used({"lm_head": [lin]}, {"lm_head": type(lin.kernel)})


def test_config_rejects_unknown_prefixes_and_problems():
    with pytest.raises(ConfigError, match=r"kernels: unknown kernel prefix 'lib:' in 'lib:x\.so' for op 'down'"):
        EngineConfig.from_dict({"kernels": {"down": "lib:x.so"}})
    with pytest.raises(ConfigError, match=r"'champion:rmsnorm' for op 'o': only champions of q4_1_matmul"):
        EngineConfig.from_dict({"kernels": {"o": "champion:rmsnorm"}})
    with pytest.raises(ConfigError, match="names nothing after 'so:'"):
        EngineConfig.from_dict({"kernels": {"o": "so:"}})
    assert EngineConfig.from_dict({"kernels": {"o": "so:k.so", "down": "champion:q4_1_matmul"}}).kernels


def _store_with_champion(path, problem, source) -> str:
    """A store at ``path`` whose q4_1_matmul champion (this hardware) has ``source``."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict

    store = Store(str(path))
    store.record_problem(problem)
    cand = candidate_record(problem, source, agent="test", operator="template")
    eid = store.record_verdict(problem, cand, Verdict(Outcome.FASTER, "test", "measure"), None, "test")
    store.set_champion(problem, cand["id"], eid, 1.5, None, "test champion")
    store.close()
    return cand["id"]


class BackgroundServer(Server):
    """``engine serve`` started without waiting for it, so that its load (another process, on
    another core where there is one) overlaps the tests that run before it is needed."""

    def __init__(self, env: dict, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "swarmfactory.engine_cli", "serve", "--port", str(self.port),
               "--threads", str(THREADS), *args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("server did not start in time")


@pytest.fixture(scope="module", autouse=True)
def served(problem, libs, tmp_path_factory):
    """`engine serve --kernel down=champion:q4_1_matmul --kernel o=so:PATH` on a store whose
    champion is the default template: (server, candidate id). Started first, used last."""
    path = tmp_path_factory.mktemp("served") / "evidence.db"
    cand = _store_with_champion(path, problem, libs["source"])
    env = {k: v for k, v in os.environ.items() if k != "SWARMFACTORY_API_KEY"}
    s = BackgroundServer(env, "--store", str(path), "--max-batch", "2", "--max-seq-len", "128",
                         "--kernel", "down=champion:q4_1_matmul", "--kernel", f"o=so:{libs['good']}")
    yield s, cand
    s.stop()


@pytest.fixture
def champion_store(tmp_path, monkeypatch, problem, libs):
    """A temporary store whose champion is the default template: (candidate id, the corridor to it)."""
    cand = _store_with_champion(tmp_path / "evidence.db", problem, libs["source"])
    return cand, Corridor(str(tmp_path / "evidence.db"))


def test_champion_resolves_builds_and_runs(champion_store, weight):
    from swarmfactory.engine.native_seam import resolve, resolve_all

    cand, supply = champion_store
    lib = resolve_all({"down": "champion:q4_1_matmul", "o": "int4pack"}, supply)["down"].library
    assert lib.candidate == cand and lib.speedup == 1.5 and lib.path.endswith(".so")
    x = torch.randn(2, weight.cols, generator=torch.Generator().manual_seed(3))
    y = resolve("champion:q4_1_matmul", supply)(weight, torch.float32)(x)  # checked on the real weight, then run
    assert torch.allclose(y, x @ weight.dequantize().T, rtol=1e-4, atol=1e-4)


def test_champion_errors_name_the_op(tmp_path, monkeypatch, problem):
    from swarmfactory.engine.native_seam import resolve_all
    from swarmfactory.evidence.store import Store

    with pytest.raises(KernelError, match=r"kernels\.down: champion:q4_1_matmul: no evidence store at"):
        resolve_all({"down": "champion:q4_1_matmul"}, Corridor(str(tmp_path / "none.db")))
    Store(str(tmp_path / "empty.db")).close()
    with pytest.raises(KernelError, match=r"kernels\.o: champion:q4_1_matmul: no champion of q4_1_matmul "
                                          r"for this hardware"):
        resolve_all({"o": "champion:q4_1_matmul", "down": "dense"}, Corridor(str(tmp_path / "empty.db")))
    cand = _store_with_champion(tmp_path / "bad.db", problem, "void q4_1_matmul(int k) { (void)k; }\n")
    with pytest.raises(KernelError, match=rf"kernels\.gate_up: champion:q4_1_matmul: champion {cand} did not "
                                          r"build: compile error"):
        resolve_all({"gate_up": "champion:q4_1_matmul"}, Corridor(str(tmp_path / "bad.db")))


def test_a_pinned_champion_runs_only_while_it_passes_here(tmp_path, monkeypatch, problem, libs, weight):
    """``champion:q4_1_matmul@ID``: exactly that candidate, even after the champion moved on, and
    never one that was not a champion here or that a later evaluation found wrong."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.engine.native_seam import resolve_all
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict

    store = Store(str(tmp_path / "e.db"))
    supply = Corridor(store)

    def record(source, outcome, champion):
        cand = candidate_record(problem, source, agent="test", operator="template")
        eid = store.record_verdict(problem, cand, Verdict(Outcome(outcome), "test", "measure"), None, "test")
        if champion:
            store.set_champion(problem, cand["id"], eid, 1.3, None, "test")
        return cand["id"]

    first = record(libs["source"], "faster", True)
    second = record(problem.render({"rows": 4}), "faster", True)  # the champion moves on
    lib = resolve_all({"down": f"champion:q4_1_matmul@{first[:10]}"}, supply)["down"].library
    assert lib.candidate == first and lib.speedup is None  # the pinned one, no longer the champion
    assert resolve_all({"down": "champion:q4_1_matmul"}, supply)["down"].library.candidate == second
    never = record(problem.render({"rows": 1}), "not_faster", False)
    with pytest.raises(KernelError, match=rf"kernels\.o: champion:q4_1_matmul@{never}: candidate {never} was never "
                                          r"a champion of q4_1_matmul"):
        resolve_all({"o": f"champion:q4_1_matmul@{never}"}, supply)
    with pytest.raises(KernelError, match=r"no candidate 0000 of q4_1_matmul"):
        resolve_all({"o": "champion:q4_1_matmul@0000"}, supply)
    record(libs["source"], "wrong", False)  # a new case breaks the first
    with pytest.raises(KernelError, match=rf"candidate {first} no longer passes the harness on this hardware "
                                          r"\(latest: wrong\)"):
        resolve_all({"o": f"champion:q4_1_matmul@{first}"}, supply)
    store.close()


def test_engine_serve_runs_a_file_and_the_champion(libs, served):
    """/health says which op runs which library (the champion with its candidate id), and it serves."""
    s, cand = served
    s.wait()
    nk = s.health()["paths"]["native_kernels"]
    assert nk["down"]["candidate"] == cand and nk["down"]["spec"] == "champion:q4_1_matmul"
    assert nk["down"]["checked"] and nk["o"]["checked"]
    assert nk["o"]["origin"] == str(libs["good"].resolve()) and nk["down"]["path"].endswith(".so")
    r = httpx.post(s.url + "/v1/completions", timeout=120,
                   json={"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
