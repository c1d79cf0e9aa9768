"""The roofline: measured as a median under a recorded load, and never shown beaten."""

import os

import pytest

from swarmfactory.harness import roofline

ROOFS = {"bandwidth": [[1 << 20, 100e9], [1 << 30, 20e9]], "peak_flops": 1e12, "loadavg": [3.1, 3.0]}


def test_a_fraction_beyond_the_roof_is_unknown_not_a_figure():
    # 1 GB at 20 GB/s: the roof says 50 ms
    assert roofline.fraction(ROOFS, 1e9, 0, 0.1) == pytest.approx(0.5)
    assert roofline.fraction(ROOFS, 1e9, 0, 0.0495) == pytest.approx(0.05 / 0.0495)  # timing noise at the roof
    assert roofline.fraction(ROOFS, 1e9, 0, 0.04) is None  # 125%: the roof is wrong
    assert roofline.beaten(ROOFS, 1e9, 0, 0.04) and not roofline.beaten(ROOFS, 1e9, 0, 0.1)


def test_describe_never_prints_more_than_100_percent():
    assert roofline.describe(0.874) == "87%"
    assert roofline.describe(1.01) == "100%"
    for frac in (1.1, 2.24, None):
        text = roofline.describe(frac, ROOFS)
        assert "%" not in text and "roof too low" in text and "load 3.1" in text


def test_remeasure_keeps_the_higher_roof(monkeypatch, tmp_path):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    new = {"bandwidth": [[1 << 20, 80e9], [1 << 30, 30e9]], "peak_flops": 2e12, "loadavg": [0.2, 0.3],
           "quiet": True}
    monkeypatch.setattr(roofline, "measure_roofs", lambda cpus, wait_s=0.0: dict(new))
    merged = roofline.remeasure([0], ROOFS)
    assert merged["bandwidth"] == [[1 << 20, 100e9], [1 << 30, 30e9]]
    assert merged["peak_flops"] == 2e12 and merged["remeasured"] == 1 and merged["loadavg"] == [0.2, 0.3]


def test_wait_for_quiet_waits_for_the_load_to_drop(monkeypatch):
    loads = iter([9.0, 9.0, 0.0])
    monkeypatch.setattr(roofline, "_load", lambda: next(loads))
    monkeypatch.setattr(roofline.time, "sleep", lambda s: None)
    assert roofline.wait_for_quiet(1, limit_s=60)
    monkeypatch.setattr(roofline, "_load", lambda: 9.0)
    assert not roofline.wait_for_quiet(1, limit_s=0)


def test_measured_roofs_are_medians_with_their_load():
    roofs = roofline.measure_roofs([sorted(os.sched_getaffinity(0))[0]], repeats=3)
    assert roofs["repeats"] == 3 and roofs["threads"] == 1 and roofs["spread"] >= 1.0
    assert len(roofs["loadavg"]) == 2 and isinstance(roofs["quiet"], bool)
    assert [s for s, _ in roofs["bandwidth"]] == list(roofline.SIZES)
    assert all(r > 0 for _, r in roofs["bandwidth"]) and roofs["peak_flops"] > 0


@pytest.mark.parametrize("mask", [None, "avx2"])
def test_the_peak_is_measured_in_the_machines_own_register_width(monkeypatch, request, mask):
    """16-lane vectors on an AVX2 machine spill: the peak came out 14x low (13.6 GFLOP/s on two
    Zen 3 cores) and every good kernel then "beat the roof", each costing a re-measurement."""
    from swarmfactory import hardware
    from swarmfactory.knowledge.costmodel import fp32_lanes
    from swarmfactory.hardware import machine_profile

    if mask:
        monkeypatch.setenv("SWARMFACTORY_CPU_MASK", mask)
        # the fingerprint is read once a process (a mask is set before it starts); this one
        # re-reads it under the mask and again without it afterwards
        hardware.cpu_fingerprint.cache_clear()
        request.addfinalizer(hardware.cpu_fingerprint.cache_clear)
    roofs = roofline.measure_roofs([sorted(os.sched_getaffinity(0))[0]], repeats=1)
    assert roofs["lanes"] == fp32_lanes(machine_profile()) and roofs["kernel"] == roofline.KERNEL
    if mask:
        assert roofs["lanes"] == 8
    # one full-width FMA per nanosecond is far below any core with FMA units (two a cycle at GHz clocks)
    assert roofs["peak_flops"] >= 2 * roofs["lanes"] * 1e9


def test_an_undisturbed_recent_measurement_is_reused_by_the_next_harness(monkeypatch, tmp_path):
    from swarmfactory.evidence.store import Store

    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    calls = []
    spread = {"value": 1.05}

    def fake(cpus, wait_s=0.0):
        calls.append(cpus)
        return {**ROOFS, "spread": spread["value"], "quiet": True, "kernel": roofline.KERNEL}

    monkeypatch.setattr(roofline, "measure_roofs", fake)
    first = roofline.known_or_measured([0, 1])
    assert len(calls) == 1 and "reused" not in first
    again = roofline.known_or_measured([0, 1])  # this machine's cache
    assert len(calls) == 1 and again["reused"] == "cache" and again["bandwidth"] == ROOFS["bandwidth"]
    roofline.known_or_measured([0])  # another thread count is another roof
    assert len(calls) == 2

    store = Store(str(tmp_path / "e.db"))
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "empty"))
    roofline.known_or_measured([0, 1], store)  # measured, and recorded in the store
    assert len(calls) == 3
    assert roofline.known_or_measured([0, 1], store)["reused"] == "store"
    assert len(calls) == 3

    # repeats that disagree (another process was running): measured again every time
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "noisy"))
    spread["value"] = 2.0
    roofline.known_or_measured([0, 1])
    roofline.known_or_measured([0, 1])
    assert len(calls) == 5
    # and an old one is not reused either
    spread["value"] = 1.05
    roofline.known_or_measured([0, 1])
    path = roofline._cache_path(__import__("swarmfactory.hardware", fromlist=["x"]).cpu_fingerprint()["id"], 2)
    old = __import__("json").loads(path.read_text())
    old["measured_at"] -= (roofline.REUSE_DAYS + 1) * 86400
    path.write_text(__import__("json").dumps(old))
    roofline.known_or_measured([0, 1])
    assert len(calls) == 7
    # nor one of an earlier microbenchmark (kernel 1 measured AVX2 machines far below their peak)
    old = __import__("json").loads(path.read_text())
    old.pop("kernel")
    path.write_text(__import__("json").dumps(old))
    roofline.known_or_measured([0, 1])
    assert len(calls) == 8
