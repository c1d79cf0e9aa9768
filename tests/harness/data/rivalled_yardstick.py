"""rmsnorm with two baselines: one that waits 300 us in every call (as a contender chosen from a
few warm samples may run once the inputs rotate) and torch's F.rms_norm as it is. For the test that
the chosen baseline's rivals are timed beside it, so a slow choice cannot inflate a verdict."""

import dataclasses
import time

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

WAIT_S = 300e-6


def slow_baseline(t):
    import torch.nn.functional as F

    x, w, eps, cols = t["x"], t["w"], t["eps"], t["cols"]

    def call():
        end = time.perf_counter() + WAIT_S
        while time.perf_counter() < end:
            pass
        return F.rms_norm(x, (cols,), w, eps)
    return call


def plain_baseline(t):
    import torch.nn.functional as F

    x, w, eps, cols = t["x"], t["w"], t["eps"], t["cols"]
    return lambda: F.rms_norm(x, (cols,), w, eps)


PROBLEM = dataclasses.replace(RMSNORM, name="rivalled_yardstick", symbol=RMSNORM.entry,
                              baselines={"slow when it counts": slow_baseline, "F.rms_norm": plain_baseline})
