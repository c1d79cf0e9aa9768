"""The block step's own element ops as the kernel factory's yardstick.

The engine's block step (``qstep.c``) computes RMSNorm, the residual add with the norm after it,
the gated activations, RoPE and decode attention itself. A kernel-factory candidate for one of
those ops is worth plugging into the engine only if it beats *that* code, not only torch, so each
of these problems (and every problem derived from a model in their families) has this baseline
beside torch's: ``qstep.c``'s ``sf_op_*`` functions, the very functions the step calls, on the
problem's layout, in the library the engine runs (``qlinear.loaded``: the ISA path that passed
its probe on this machine).

A baseline here is a ``NativeCall``: calling it runs the op once and returns its outputs (what
the harness checks); ``loop(n)`` runs it n times inside C, so the harness times it as it times a
candidate in its driver (no Python between calls; ``harness/worker.py``), and it has no
``torch.compile`` form. It uses torch's intra-op thread count when it is set up (the harness
tries each count). RoPE reads the model's tables (``models/rope.py``), computed once outside the
timed calls, as the engine computes them at load. Where no build of the library passes its probe
here, setting one up raises RuntimeError with the reason (the harness skips the baseline loudly).
"""

from __future__ import annotations

import ctypes

import torch

ACT = {"silu": 0, "gelu_tanh": 1}
_P, _I, _F, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
_SIGNATURES = {
    "sf_op_rmsnorm": [_P, _P, _P, _L, _L, _F, _I, _L],
    "sf_op_add_rmsnorm": [_P, _P, _P, _P, _P, _L, _L, _F, _I, _L],
    "sf_op_gated": [_I, _P, _P, _P, _L, _I, _L],
    "sf_op_rope": [_P, _P, _P, _L, _L, _L, _P, _P, _I, _L],
    "sf_op_attention": [_P, _P, _P, _P, _L, _L, _L, _L, _L, _F, _P, _I, _L],
}


class NativeCall:
    """One op of the engine's library bound to its tensors."""

    native = True  # no torch.compile form; timed through ``loop``

    def __init__(self, fn, args: list, outputs: tuple, keep: list):
        self._fn, self._args, self._outputs, self._keep = fn, args, outputs, keep

    def __call__(self):
        self._fn(*self._args, 1)
        return self._outputs if len(self._outputs) > 1 else self._outputs[0]

    def loop(self, iters: int) -> None:
        self._fn(*self._args, int(iters))


def _function(name: str):
    from .qlinear import loaded

    lib = loaded()
    if lib.lib is None:
        raise RuntimeError(f"the engine's native library is unavailable here: {lib.reason}")
    fn = getattr(lib.lib, name, None)
    if fn is None:  # a library built before these functions existed cannot be, the build is keyed by source
        raise RuntimeError(f"the engine's native library has no {name}")
    fn.argtypes, fn.restype = _SIGNATURES[name], None
    return fn


def _f32(t, name: str) -> torch.Tensor:
    x = t[name]
    return x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()


def _threads() -> int:
    return max(1, torch.get_num_threads())


def rmsnorm(t) -> NativeCall:
    x, w = _f32(t, "x"), _f32(t, "w")
    y = torch.empty_like(x)
    return NativeCall(_function("sf_op_rmsnorm"),
                      [x.data_ptr(), w.data_ptr(), y.data_ptr(), t["rows"], t["cols"], float(t["eps"]), _threads()],
                      (y,), [x, w])


def add_rmsnorm(t) -> NativeCall:
    x, r, w = _f32(t, "x"), _f32(t, "r"), _f32(t, "w")
    h, y = torch.empty_like(x), torch.empty_like(x)
    return NativeCall(_function("sf_op_add_rmsnorm"),
                      [x.data_ptr(), r.data_ptr(), w.data_ptr(), h.data_ptr(), y.data_ptr(), t["rows"], t["cols"],
                       float(t["eps"]), _threads()], (h, y), [x, r, w])


def gated(act: str):
    def setup(t) -> NativeCall:
        g, u = _f32(t, "gate"), _f32(t, "up")
        y = torch.empty_like(g)
        return NativeCall(_function("sf_op_gated"), [ACT[act], g.data_ptr(), u.data_ptr(), y.data_ptr(), t["n"],
                                                     _threads()], (y,), [g, u])
    return setup


def rope(t) -> NativeCall:
    from swarmfactory.engine.models.rope import Rope

    x, pos = _f32(t, "x"), t["pos"].to(torch.int64).contiguous()
    d = t["head_dim"]
    n_pos = int(pos.max()) + 1 if pos.numel() else 1
    cos, sin = Rope(float(t["theta"])).tables(d, n_pos, torch.float32)
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    return NativeCall(_function("sf_op_rope"),
                      [x.data_ptr(), pos.data_ptr(), y.data_ptr(), t["tokens"], t["heads"], d, cos.data_ptr(),
                       sin.data_ptr(), _threads()], (y,), [x, pos, cos, sin])


def attention(t) -> NativeCall:
    q, k, v = _f32(t, "q"), _f32(t, "k"), _f32(t, "v")
    b, h, d = t["batch"], t["heads"], t["head_dim"]
    if t["kv_heads"] < 1 or h % t["kv_heads"]:  # qstep.c would index kv heads that do not exist
        raise RuntimeError(f"the engine attends {h} query heads over {t['kv_heads']} kv heads only when "
                           "the first is a multiple of the second")
    out = torch.empty(b, h, d, dtype=torch.float32)
    threads = _threads()
    scratch = torch.empty(threads * max(1, t["seq"]) * (t["heads"] // t["kv_heads"]), dtype=torch.float32)
    return NativeCall(_function("sf_op_attention"),
                      [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), b, h, t["kv_heads"], t["seq"], d,
                       float(t["scale"]), scratch.data_ptr(), threads], (out,), [q, k, v, scratch])
