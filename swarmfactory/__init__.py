"""swarmfactory: agent swarms that build, verify and measure AI-inference kernels and engines.

``swarmfactory.evaluate(problem, source)`` and ``swarmfactory.run(problems, budget=...)`` mirror
the CLI's ``eval`` and ``run``; ``swarmfactory.Engine`` / ``EngineConfig`` are the engine's.
Imports are lazy: ``import swarmfactory`` stays cheap.
"""

__version__ = "0.1.0"
__all__ = ["evaluate", "run", "Engine", "EngineConfig"]


def __getattr__(name):
    if name in ("evaluate", "run"):
        from swarmfactory import api

        return getattr(api, name)
    if name in ("Engine", "EngineConfig"):
        from swarmfactory import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'swarmfactory' has no attribute {name!r}")
