"""rmsnorm timed against torch's F.rms_norm only (not the engine's own C): a problem whose default
kernel beats its yardstick by a wide margin on any machine, for tests of the run loop itself."""

import dataclasses

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

PROBLEM = dataclasses.replace(RMSNORM, name="rmsnorm_torch_yardstick", symbol=RMSNORM.entry,
                              baselines={"F.rms_norm": RMSNORM.baselines["F.rms_norm"]})
