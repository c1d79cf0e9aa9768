"""Versions of the tools that can change a result; recorded with every evaluation."""

from __future__ import annotations

import platform
from functools import cache


@cache
def tool_versions() -> dict[str, str]:
    import numpy
    import torch

    from swarmfactory import __version__
    from swarmfactory.backends import get_backend

    return {"swarmfactory": __version__, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": numpy.__version__, **get_backend("c").versions()}
