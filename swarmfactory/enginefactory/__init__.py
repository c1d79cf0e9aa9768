"""The engine factory: engine designs as candidates, verified end to end, measured over HTTP,
the best kept as a per-machine profile (see tune.py)."""
