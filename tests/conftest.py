import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SWARMFACTORY_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set SWARMFACTORY_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def harness():
    """A harness tuned for tests: fewer rounds, eager baselines only (speed is not asserted)."""
    from swarmfactory.harness.evaluate import Harness, HarnessConfig

    h = Harness(HarnessConfig(rounds=8, compile_baselines=False, case_timeout_s=5.0))
    yield h
    h.close()


@pytest.fixture
def store(tmp_path):
    from swarmfactory.evidence.store import Store

    return Store(str(tmp_path / "evidence.db"))
