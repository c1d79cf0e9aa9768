import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'swarmfactory[gpu]')")


@pytest.fixture(scope="module")
def gpu_harness():
    """A harness whose interpreter deadlines are short (a hang costs seconds, not minutes)."""
    from swarmfactory.harness.evaluate import Harness, HarnessConfig

    h = Harness(HarnessConfig(case_timeout_s=2.0, compile_baselines=False))
    yield h
    h.close()
