"""The package's layers hold: no import of ours runs back up (see tests/layering.py)."""

from layering import LAYERS, modules, unit, upward


def test_no_import_runs_back_up():
    bad = upward()
    assert not bad, "imports against the layers of tests/layering.py:\n  " + "\n  ".join(bad)


def test_every_unit_has_a_layer():
    units = {unit(m) for m in modules()}
    listed = {u for layer in LAYERS for u in layer}
    assert units <= listed, f"units in no layer of tests/layering.py: {sorted(units - listed)}"


def test_the_engine_never_reaches_the_store_or_the_harness():
    from layering import imports

    reached = {b for a, b, _, _ in imports() if unit(a) == "engine"}
    assert not {b for b in reached if unit(b) in ("evidence", "harness", "problems", "swarm", "champions")}
