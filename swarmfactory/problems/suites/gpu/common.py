"""What the GPU problems share: the public baselines (imported where installed, recorded as
unavailable where not: never faked) and torch.compile of the eager composition."""

from __future__ import annotations

import importlib


class BaselineUnavailable(RuntimeError):
    """The library a baseline needs is not importable here (or needs a GPU); the message says which."""


def need(module: str, package: str, gpu: bool = True):
    """Import ``module`` for a baseline, or raise BaselineUnavailable naming the PyPI package and
    why (not installed, broken at import, or no GPU to run it on)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a CUDA/Triton mismatch at import
        raise BaselineUnavailable(f"{package}: unavailable here ({type(exc).__name__}: {exc})") from None
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise BaselineUnavailable(f"{package}: installed, unavailable here (needs an NVIDIA GPU)")
    return mod


def compiled(eager):
    """torch.compile of a problem's eager composition (setup -> fn), as a user would write it."""
    def setup(t):
        import torch

        fn = eager(t)
        # the default mode: max-autotune's minutes of tuning per shape do not fit a suite run
        return torch.compile(fn, dynamic=False)
    return setup
