"""Marks the known holes (known_holes.py) xfail wherever their kernels are run."""

import pytest

from known_holes import KNOWN_HOLES


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "adversarial" not in item.path.parts:
            continue
        reason = KNOWN_HOLES.get(callspec.id)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"known hole: {reason}", strict=False))
