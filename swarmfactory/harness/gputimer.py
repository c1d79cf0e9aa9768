"""GPU timing (docs/gpu.md, "Timing protocol"): CUDA events around many launches, L2 flushed
before every sample, warm-up, the candidate interleaved with the best public baseline, per-round
ratios and a bootstrap CI, CUDA graphs for both contenders when the kernels are short.

Two halves. ``time_calls`` and ``time_in_worker`` run where the kernel runs (the candidate's
worker process loads this file by path, so it must import nothing of swarmfactory at module
level); ``measure_candidate`` runs on the trusted side: it owns the inputs, times the baselines
itself, brackets every candidate sample with its own wall clock (an event time longer than the
bracket is tampering), re-verifies the outputs of timed calls, records clocks and decides.

Needs an NVIDIA GPU; nothing here runs on a CPU machine (tests/gpu/test_gpu_device.py skips).
"""

from __future__ import annotations

import os
import time

GRAPH_BELOW_US = 10.0   # kernels shorter than this are launched from a CUDA graph (both contenders)
SAMPLE_MS = 1.0          # a sample lasts at least this long: launches per sample sized to it
WARMUP = 3


def l2_flush_buffer(device: str = "cuda"):
    """A buffer twice the size of the L2 cache; writing it evicts the previous sample's data."""
    import torch

    l2 = torch.cuda.get_device_properties(torch.device(device)).L2_cache_size or (64 << 20)
    return torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)


def time_calls(fn, arg_sets: list[tuple], samples: int, launches: int, flush, graphs: bool = False) -> dict:
    """``samples`` samples of ``launches`` calls each (rotating over ``arg_sets``), L2 flushed and
    the device synchronised before each; CUDA events on the current stream, then a synchronisation
    of the whole device (side streams finish inside the sample). Returns ms per call per sample and
    the wall time of each sample as this process saw it."""
    import torch

    stream = torch.cuda.current_stream()
    runners = []
    for args in arg_sets:
        if graphs:
            for _ in range(WARMUP):
                fn(*args)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(launches):
                    fn(*args)
            runners.append(g.replay)
        else:
            runners.append(lambda args=args: [fn(*args) for _ in range(launches)])
    for r in runners:  # warm-up: compilation, autotuning, lazy allocation stay outside the samples
        r()
    torch.cuda.synchronize()
    per_call, wall = [], []
    for i in range(samples):
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record(stream)
        runners[i % len(runners)]()
        end.record(stream)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        per_call.append(start.elapsed_time(end) / launches)
    return {"ms": per_call, "wall_ms": wall}


def launches_for(fn, args: tuple, target_ms: float = SAMPLE_MS) -> tuple[int, float]:
    """(launches per sample, ms per call) so one sample lasts about ``target_ms``."""
    import torch

    for _ in range(WARMUP):
        fn(*args)
    torch.cuda.synchronize()
    n = 1
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        if ms >= target_ms or n >= 1 << 16:
            return n, ms / n
        n *= 2


def time_in_worker(fn, head: dict, blobs: list[bytes], device: str) -> tuple[dict, list[bytes]]:
    """The candidate's side of one request: inputs from the trusted side's bytes (several sets,
    each with its own args), outputs allocated per set, then ``time_calls``. With ``outputs``, the
    outputs of the last call on each set come back (as raw bytes) for re-verification."""
    import numpy as np
    import torch

    sets, outs, it = [], [], iter(blobs)
    for arg_list in head["arg_sets"]:
        args, mine = [], []
        for a in arg_list:
            if a["kind"] == "in":
                arr = np.frombuffer(next(it), dtype=a["dtype"]).reshape(a["shape"]).copy()
                args.append(torch.from_numpy(arr).to(device))
            elif a["kind"] == "out":
                t = torch.full(a["shape"], float("nan"), dtype=getattr(torch, a["dtype"]), device=device)
                args.append(t)
                mine.append(t)
            else:
                args.append(a["value"])
        sets.append(tuple(args))
        outs.append(mine)
    launches = head.get("launches") or launches_for(fn, sets[0])[0]
    res = time_calls(fn, sets, head["samples"], launches, l2_flush_buffer(device), head.get("graphs", False))
    torch.cuda.synchronize()
    res["launches"] = launches
    back = [t.cpu().contiguous().numpy().tobytes() for mine in outs for t in mine] if head.get("outputs") else []
    return res, back


# -- the trusted side -------------------------------------------------------------------------------
def gpu_state() -> dict:
    """Clocks, temperature, power and throttle reasons as they are (recorded, never changed)."""
    import subprocess

    fields = "name,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"nvidia-smi": "unavailable"}
    return {"gpu0": dict(zip(fields.split(","), (v.strip() for v in out[0].split(","))))} if out else {}


def measure_candidate(harness, prep, rounds: int | None = None, samples: int = 10, sets: int = 3):
    """Interleave the candidate (its worker) with the fastest available baseline (timed here) on
    every workload shape; a verdict as for C: `faster` only if the CI's low end clears
    1 + min_effect."""
    import numpy as np
    import torch

    from swarmfactory.harness.gpu import GpuWorker, call_message, load_message
    from swarmfactory.outcome import Outcome, Rejected, ShapeTiming, Verdict
    from swarmfactory.harness.timing import median_ci
    from swarmfactory.harness.verify import compare, expected_for
    from swarmfactory.problems.spec import NP_DTYPES, to_torch

    problem, cfg = prep.problem, harness.config
    rounds = rounds or cfg.rounds
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    state_before, shapes, ratios, evidence = gpu_state(), [], [], {"baselines": {}}
    flush = l2_flush_buffer()
    with GpuWorker(interpret=False) as worker:
        worker.request(load_message(problem, prep.artifact), [], 300, "measure (load)")
        for shape in problem.workload:
            label = problem.shape_label(shape)
            inputs = [problem.make_inputs(dict(shape), np.random.default_rng(int(rng.integers(1 << 62))),
                                          problem.dists[0]) for _ in range(sets)]
            # the best baseline here, by a short measurement of each one available
            best, chosen = None, None
            for name, setup in problem.baselines.items():
                try:
                    fns = [setup({k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in to_torch(i).items()})
                           for i in inputs]
                    n, per_call = launches_for(lambda f: f(), (fns[0],))
                except Exception as exc:  # not installed, no kernel for this shape, ...
                    evidence["baselines"].setdefault(name, f"unavailable here: {type(exc).__name__}: {exc}"[:300])
                    continue
                evidence["baselines"][name] = f"{per_call * 1e3:.2f} us at {label}"
                if best is None or per_call < best[1]:
                    best, chosen = (name, per_call, n), fns
            if best is None:
                raise Rejected(Outcome.VERIFIED, f"no public baseline is available here for {label}: "
                               f"{evidence['baselines']}", "measure", **evidence)
            arg_sets, blobs = [], []
            for inp in inputs:
                head, b = call_message(problem, shape, inp, float("nan"))
                arg_sets.append(head["args"])
                blobs += b
            probe = {"op": "time", "timer": __file__, "arg_sets": arg_sets, "samples": 1, "launches": None}
            reply, _ = worker.request(probe, blobs, 600, f"measure ({label})")
            launches, cand_us = reply["launches"], float(np.median(reply["ms"])) * 1e3
            graphs = max(cand_us, best[1] * 1e3) < GRAPH_BELOW_US
            c_ms, b_ms = [], []
            for r in range(rounds):
                order = ("c", "b") if r % 2 == 0 else ("b", "c")  # ABBA
                for who in order:
                    if who == "c":
                        t0 = time.perf_counter()
                        reply, back = worker.request({**probe, "samples": samples, "launches": launches,
                                                      "graphs": graphs, "outputs": r == rounds - 1},
                                                     blobs, 600, f"measure ({label})")
                        wall_ms = (time.perf_counter() - t0) * 1e3
                        if sum(reply["ms"]) * launches > wall_ms * 1.01:
                            raise Rejected(Outcome.CHEATED, f"event times ({sum(reply['ms']) * launches:.3f} ms) "
                                           f"exceed the wall clock around them ({wall_ms:.3f} ms)", "measure")
                        c_ms.append(float(np.median(reply["ms"])))
                        if back:  # re-verify what the timed calls produced
                            per_set = len(problem.outputs)
                            for j, inp in enumerate(inputs):
                                got = {a.name: np.frombuffer(back[j * per_set + o], dtype=NP_DTYPES[a.dtype])
                                       .reshape(problem.output_shapes(shape)[a.name])
                                       for o, a in enumerate(problem.outputs)}
                                data = expected_for(problem, inp)
                                bad = compare(problem, data.expected, got, f"timed calls at {label}", data.atol)
                                if bad:
                                    raise Rejected(Outcome.WRONG, bad, "measure")
                    else:
                        res = time_calls(lambda f: f(), [(f,) for f in chosen], samples, best[2], flush, graphs)
                        b_ms.append(float(np.median(res["ms"])))
            c, b = np.array(c_ms), np.array(b_ms)
            med, lo, hi = median_ci(b / c, cfg.bootstrap_resamples)
            ratios.append(b / c)
            shapes.append(ShapeTiming(shape=dict(shape), candidate_us=float(np.median(c)) * 1e3,
                                      baseline_us=float(np.median(b)) * 1e3, reference_us=None,
                                      speedup=med, ci_low=lo, ci_high=hi, vs_reference=None))
            evidence.setdefault("timing", {})[label] = {"baseline": best[0], "launches": launches,
                                                        "graphs": graphs, "samples": samples, "rounds": rounds}
            del chosen
            torch.cuda.empty_cache()
    per_round = np.exp(np.mean(np.log(np.vstack(ratios)), axis=0))
    med, lo, hi = median_ci(per_round, cfg.bootstrap_resamples)
    evidence["gpu before"], evidence["gpu after"] = state_before, gpu_state()
    faster = lo > 1.0 + cfg.min_effect
    detail = (f"{med:.3f}x the best public baseline [{lo:.3f}, {hi:.3f}] (geomean over {len(shapes)} shapes, "
              f"{rounds} interleaved rounds of {samples} samples, L2 flushed per sample)")
    if not faster:
        detail += f"; needs CI low > {1 + cfg.min_effect:.2f}"
    baseline = ", ".join(sorted({v["baseline"] for v in evidence["timing"].values()}))
    return Verdict(Outcome.FASTER if faster else Outcome.NOT_FASTER, detail, "measure", speedup=med,
                   ci_low=lo, ci_high=hi, vs_reference=None, baseline=baseline, shapes=shapes,
                   evidence=evidence)
