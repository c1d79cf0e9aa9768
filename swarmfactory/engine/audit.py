"""What the engine does when a kernel-factory kernel gives a wrong output while serving.

Both seams that run factory code in the engine's process audit it on what it is actually
given, not only on the shapes checked at load: the native decoder recomputes one random row
group of every call of the external ``q4_1_packed_matvec`` kernel with its built-in loop
(decode.c, ``Ext``); a per-op ``q4_1_matmul`` library (``native_seam.NativeLinear``) has random
output rows of its calls recomputed from the dequantised weight, on every call at a batch size
it has not run before and on a random share of the others. Every call of the matvec, and every
audited call of a library, must also leave its inputs as they were and the memory just past
its outputs untouched. A kernel that a hostile or unlucky candidate made wrong only at some
batch size, row count or position is caught at its first audited wrong call.

At the first mismatch the kernel is dropped for the rest of the process: the call (or the
decode step) is computed again by the engine's own code, so no wrong output reaches a user,
and every later call runs the built-in path. Then the engine calls its supply's ``on_wrong``
once (``engine/supply.py``): the corridor (``swarmfactory/champions.py``) makes the shape a
permanent validation case, records a ``wrong`` evaluation and dethrones the candidate if it is
this hardware's champion. The engine itself never opens the evidence store.
"""

from __future__ import annotations


def caught(kernel_audit: dict) -> str | None:
    """The first finding in an engine's ``kernel_audit()`` (as ``/health`` carries it), or None."""
    seams = [*(kernel_audit.get("native_kernels") or {}).values(), kernel_audit.get("native_matvec") or {},
             *(kernel_audit.get("native_matmul") or {}).values()]
    return next((s["dropped"] for s in seams if s.get("dropped")), None)
