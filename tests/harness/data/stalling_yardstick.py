"""rmsnorm whose only yardstick stalls whenever it runs on a team of threads: each call on more than
one thread first waits 2 ms (what the engine's RMSNorm at 2 threads did in some rounds on a 2-vCPU
VM: 3 us per call in one round, 2-8 ms in the next, every CPU idle meanwhile), on one thread it is
torch's F.rms_norm as it is. For the test that such a yardstick cannot inflate a verdict."""

import dataclasses
import time

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

STALL_S = 2e-3


def stalling_baseline(t):
    import torch
    import torch.nn.functional as F

    x, w, eps, cols = t["x"], t["w"], t["eps"], t["cols"]

    def call():
        if torch.get_num_threads() > 1:
            end = time.perf_counter() + STALL_S
            while time.perf_counter() < end:
                pass
        return F.rms_norm(x, (cols,), w, eps)
    return call


PROBLEM = dataclasses.replace(RMSNORM, name="stalling_yardstick", symbol=RMSNORM.entry,
                              baselines={"F.rms_norm (stalls on a team)": stalling_baseline})
