"""The engine's own code for an element op as a baseline of its problem: the functions its block
step calls (``engine/native/element_ops.py``), timed in a C loop as a candidate is, so a candidate
must beat what the engine runs, not only torch. Imported when a baseline is set up (in the
harness's baseline worker), never when a problem loads."""

NAME = "engine_block_step_approx"  # a lower-precision competitor (problems/spec.py LOWER_PRECISION)


def engine_baseline(op: str, *args) -> dict:
    """``{NAME: setup}`` for ``element_ops.<op>`` (called with ``args`` first where it takes them,
    e.g. the gated activation's name)."""

    def setup(t):
        from swarmfactory.engine.native import element_ops

        fn = getattr(element_ops, op)
        return (fn(*args) if args else fn)(t)

    setup.__doc__ = f"What the engine runs for this op today: element_ops.{op} (its block step's own C)."
    return {NAME: setup}
