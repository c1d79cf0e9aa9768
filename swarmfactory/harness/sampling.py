"""The candidate's timed samples: input sets, per-call mutation, trusted writes, checks.

Kernels up to ~300 us a call (64 calls in at most a 20 ms window) run in ``async`` mode: calls rotate over a few input sets,
the driver replacing one unit of every input before each call, until the trusted side stops the
process at a random moment. While it runs, the trusted side itself writes a fresh unit into a
random set every ``probe_us`` at a position the candidate cannot know in advance (*probes*): a
kernel that predicts the driver's mutations and patches its previous outputs misses them, and
only reading its whole input every call would see them. After the stop the driver's call
counter must agree with the inputs (the driver's mutations replayed, the probes placed among
them by the counter values read around each write), and the output of every set whose last call
saw a known input is checked. An *audit* (a share of the samples, not timed) stops at a random
call count, watched by the trusted side, so calls faked cheaply early in a run are where it stops.

Slower kernels run in ``sync`` mode: one call on each of up to ``max_slots`` sets, the trusted
exchange overhead subtracted, guards of all sets and inputs and outputs of a random two checked.
Between samples a secret share of every set's units is replaced while the process is stopped.
Outputs are checked in every sample while the reference costs less than the sample, else in a
random subset of at least a quarter of them (and always in the first and last round).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from swarmfactory.harness.arena import Arena, mutation_indices, rewritten, rotation
from swarmfactory.harness.candidate import CandidateProcess
from swarmfactory.outcome import Outcome, Rejected
from swarmfactory.harness.slots import SlotGroup
from swarmfactory.harness.verify import check_slot, expected_for
from swarmfactory.problems.spec import NP_DTYPES, Case, Problem

PROBE_US = 100.0
FRESH_USES = 8      # donor refreshes one fresh draw of the inputs serves (the units replaced, and
                    # where, are drawn anew at every refresh)
MIN_CALL_NS = 2.0   # a call, its mutation and the counter update take longer than this


@dataclass(frozen=True)
class Probe:
    """One trusted write while the candidate ran: the counter before and after it, and where."""
    before: int
    after: int
    slot: int
    arg: str
    unit: int
    value: bytes


class CandidateTimer:
    def __init__(self, harness, proc: CandidateProcess, arena: Arena, problem: Problem,
                 rng: np.random.Generator, timeout: float, audited: bool = False):
        """``audited``: every sample's outputs checked and half the samples audits (the
        re-measurement of an implausible figure)."""
        self.h, self.proc, self.arena, self.problem, self.rng = harness, proc, arena, problem, rng
        self.timeout, self.audited = timeout, audited
        self.last_ns = 0.0  # the timed nanoseconds of the last sample (audits included)
        self.audit_share = max(0.5, harness.config.audit) if audited else harness.config.audit
        self.groups: dict[int, SlotGroup] = {}
        self.next_slot = 0
        self.check_cost: dict[int, float] = {}

    # -- layout and calibration ---------------------------------------------------------------
    def _new_group(self, shape, n: int) -> SlotGroup:
        """``n`` input sets of ``shape``, alternating between the timed distributions (each set
        mutated from a donor of its own distribution, so no input mixes two)."""
        dists = self.timed_dists()
        donors = [self.problem.case_inputs(Case(dict(shape), seed=int(self.rng.integers(1 << 40)), dist=d))
                  for d in dists[:n]]
        group = SlotGroup(self.arena, self.problem, shape, self.next_slot, n, donors=donors)
        self.next_slot += n
        for j in range(n):
            case = Case(dict(shape), seed=int(self.rng.integers(1 << 40)), dist=dists[group.donor_kind(j)])
            group.load(j, self.problem.case_inputs(case))
        return group

    def timed_dists(self) -> tuple[str, ...]:
        """The value distributions timed sets alternate between: the workload's, and the one with
        special values (NaN, -inf masks, denormals) where the problem has it, else its second:
        a kernel cannot tell timing from verification by its inputs, and the same two every
        time (a figure must not depend on a lottery of distributions)."""
        dists = self.problem.dists
        other = "special" if "special" in dists else dists[min(1, len(dists) - 1)]
        return (dists[0], other)

    def add_group(self, shape, i: int, n: int) -> SlotGroup:
        self.groups[i] = self._new_group(shape, n)
        return self.groups[i]

    def calibrate(self, shape, i: int) -> float:
        """Nanoseconds per call (an upper bound: it includes the exchange's overhead)."""
        group = self.add_group(shape, i, self.h.config.rotate)
        iters, target = group.n, self.h.config.min_sample_ms * 1e6
        self.proc.batch(group.first, group.n, group.n, int(self.rng.integers(1 << 62)), self.timeout,
                        "measure (warm-up)")
        while True:
            seed = int(self.rng.integers(1 << 62))
            ns = self.proc.batch(group.first, group.n, iters, seed, self.timeout, "measure (calibration)")
            self._rewrite(group)
            if ns >= target or iters >= 1 << 24:
                # the least of three: one slow exchange on a busy machine must not pick the mode
                for k in range(2):
                    seed = int(self.rng.integers(1 << 62))
                    ns = min(ns, self.proc.batch(group.first, group.n, iters, seed, self.timeout,
                                                 "measure (calibration)"))
                    if k == 1:  # calibration outputs are checked too: no run is a free pass
                        idx = np.arange(iters)
                        for j in range(group.n):
                            group.replay(j, seed, idx[idx % group.n == j])
                            self._check(group, j, f"calibration of {self.problem.shape_label(shape)}", True)
                    self._rewrite(group)
                self._reload(group)
                return ns / iters
            iters = int(-(-max(iters * 2, iters * target / max(ns, 1.0) * 1.2) // group.n) * group.n)

    # -- secret changes between samples and during runs ------------------------------------------
    def _mutated_args(self, group: SlotGroup) -> list:
        return [a for a in self.problem.args if a.kind == "in" and a.name in group.donors]

    @staticmethod
    def _units(array: np.ndarray, arg) -> np.ndarray:
        item = np.dtype(NP_DTYPES[arg.dtype]).itemsize * arg.block
        return array.reshape(-1).view(np.uint8).reshape(-1, item)

    def _reload(self, group: SlotGroup) -> None:
        """Between samples: a secret share of every set's units replaced, in the trusted copy and
        the arena alike (a kernel that carries state from run to run misses these); outputs
        poisoned. The arena already equals the copies (the checks saw to it)."""
        for j in range(group.n):
            self._refresh(group, j)
            group.poison(j)

    def _rewrite(self, group: SlotGroup, only: int | None = None) -> None:
        """The trusted copies back into the arena (after a batch whose mutations were not replayed)."""
        for j in range(group.n) if only is None else (only,):
            for name, arr in group.copies[j].items():
                group.arena.write(group.bufs[j][name], arr)

    def _refresh(self, group: SlotGroup, j: int) -> None:
        """A secret share of set ``j``'s units replaced; for inputs rewritten whole before every
        call, a share of the donor they are rewritten from (fresh values from another draw)."""
        for a in self._mutated_args(group):
            if a.name in group.full:
                self._refresh_donor(group, a, group.donor_kind(j))
                continue
            units = self._units(group.copies[j][a.name], a)
            donor = self._units(group.donor(j, a.name)[1], a)
            k = int(min(len(units), max(2, self.h.config.refresh * len(units))))
            at = self.rng.integers(0, len(units), k)
            units[at] = donor[self.rng.integers(0, len(donor), k)]
            arena = self._units(group.arena.bytes[group.bufs[j][a.name].offset:
                                                   group.bufs[j][a.name].offset + group.bufs[j][a.name].nbytes], a)
            arena[at] = units[at]

    def _fresh_draw(self, group: SlotGroup, kind: int) -> dict:
        """Another draw of donor ``kind``'s distribution for its refreshes: a new one every
        ``FRESH_USES`` refreshes (any input, any set), not one per input per set. Drawing a
        K-quant matmul's inputs quantises its weights (~0.2 s): a draw per refresh was 305 of an
        evaluation's 351 s."""
        draw, uses = group.fresh_draws.get(kind, (None, FRESH_USES))
        if draw is None or uses >= FRESH_USES:
            draw, uses = self.problem.case_inputs(Case(dict(group.shape), seed=int(self.rng.integers(1 << 40)),
                                                       dist=self.timed_dists()[kind])), 0
        group.fresh_draws[kind] = (draw, uses + 1)
        return draw

    def _refresh_donor(self, group: SlotGroup, a, kind: int) -> None:
        buf, donor = group.donor_sets[kind][a.name]
        fresh = self._fresh_draw(group, kind)
        units = self._units(donor, a)
        new = self._units(np.ascontiguousarray(fresh[a.name], dtype=NP_DTYPES[a.dtype]), a)
        k = int(min(len(units), max(2, 4 * self.h.config.refresh * len(units))))
        at = self.rng.integers(0, len(units), k)
        units[at] = new[at]
        self.arena.write(buf, donor)

    def _prober(self, group: SlotGroup, log: list[Probe]):
        """Trusted writes while the candidate runs: a fresh unit into a random set's input, or,
        for an input rewritten whole before every call, into the donor it is rewritten from (a
        kernel that precomputed results for the donor's values misses it)."""
        args = self._mutated_args(group)
        counter = self.arena.counter_view()

        def probe() -> None:
            a = args[int(self.rng.integers(len(args)))]
            j = int(self.rng.integers(group.n))
            donor = self._units(group.donor(j, a.name)[1], a)
            value = donor[int(self.rng.integers(len(donor)))].copy()
            if a.name in group.full:  # into the donor set j is rewritten from: slot -1 - kind
                kind = group.donor_kind(j)
                j, buf = -1 - kind, group.donor_sets[kind][a.name][0]
                value = self._units(self._fresh_values(group, a, kind), a)[int(self.rng.integers(len(donor)))]
            else:
                buf = group.bufs[j][a.name]
            u = int(self.rng.integers(buf.nbytes // value.size))
            before = int(counter[0])
            self.arena.bytes[buf.offset + u * value.size: buf.offset + (u + 1) * value.size] = value
            log.append(Probe(before, int(counter[0]), j, a.name, u, value.tobytes()))

        return probe if args else None

    def _fresh_values(self, group: SlotGroup, a, kind: int) -> np.ndarray:
        """Valid values of input ``a`` that donor ``kind`` does not hold (another draw of its
        distribution), kept per group."""
        if (a.name, kind) not in group.fresh:
            draw = self.problem.case_inputs(Case(dict(group.shape), seed=int(self.rng.integers(1 << 40)),
                                                 dist=self.timed_dists()[kind]))
            group.fresh[(a.name, kind)] = np.ascontiguousarray(draw[a.name], dtype=NP_DTYPES[a.dtype])
        return group.fresh[(a.name, kind)]

    # -- samples --------------------------------------------------------------------------------
    def sample(self, s: dict, always_check: bool) -> float | None:
        """One sample's nanoseconds per call; None for an audit (checked, not timed)."""
        group: SlotGroup = s["group"]
        seed = int(self.rng.integers(1 << 62))
        always_check = always_check or self.audited
        where = f"timed {self.problem.shape_label(s['shape'])}"
        if s["mode"] == "async":
            return self._async(group, s, seed, where, always_check)
        return self._sync(group, seed, where, always_check)

    def _async(self, group: SlotGroup, s: dict, seed: int, where: str, always_check: bool) -> float | None:
        audit = bool(self.rng.random() < self.audit_share)
        seconds = s["window_s"] * float(self.rng.uniform(1.0, 1.5))
        if audit:
            # an audit stops at a moment drawn by the trusted clock, log-uniformly from 20 us to
            # the window: early calls are audited as often as late ones, wherever the candidate's
            # own calibration would have put them; its outputs are always checked
            seconds = float(np.exp(self.rng.uniform(np.log(20e-6), np.log(seconds))))
            always_check = True
        probes: list[Probe] = []
        calls, ns = self.proc.run_for(group.first, group.n, seed, seconds, self.timeout, "measure",
                                      min_calls=1 if audit else 4 * group.n,
                                      probe=self._prober(group, probes), probe_every=PROBE_US * 1e-6)
        self.last_ns = float(ns)
        if calls < 1:
            raise Rejected(Outcome.TIMED_OUT, f"no call completed in {self.timeout:.0f} s of timing "
                           f"on {where} (calibration measured far less)", "measure")
        if calls > ns / MIN_CALL_NS:
            self.proc.kill()
            raise Rejected(Outcome.CHEATED, f"the driver's call counter claims {calls} calls in "
                           f"{ns / 1e6:.2f} ms on {where}, more than one per {MIN_CALL_NS:g} ns: "
                           "the counter was forged", "measure")
        for j in range(group.n):
            self._check_async_set(group, j, seed, calls, [p for p in probes if p.slot in (j, -1 - group.donor_kind(j))],
                                  f"{where} (set {j}, {calls} calls)", always_check)
        self._settle_donors(group, probes, where)
        self.proc.halt(self.timeout, "measure")
        # halting lets the call in flight finish, mutation included: its set goes back as checked
        self._rewrite(group, only=calls % group.n)
        self._reload(group)
        return None if audit else ns / calls

    def _check_async_set(self, group: SlotGroup, j: int, seed: int, calls: int, probes: list[Probe],
                         where: str, always_check: bool) -> None:
        """Set ``j`` after a run of ``calls`` completed calls; ``probes`` are those on set ``j``
        and those on the donors it is rewritten from (``slot`` -1 - its donor kind), in order.

        Its final inputs must be the driver's mutations and the probes applied in counter order
        (the call in flight at the stop, if it is this set's, may or may not have mutated yet);
        an input rewritten whole holds the rewrite of the last call on the set, from the donor as
        that call read it. Its output is checked when its last completed call saw a known input:
        no probe on it (or on a donor it was rewritten from) was under way during that call, and
        none collided with a mutation within its counter window."""
        n = group.n
        mine = np.arange(j, calls + 1, n)
        done = mine[mine < calls]
        in_flight = calls % n == j
        on_set = [p for p in probes if p.slot == j]
        on_donors = [p for p in probes if p.slot < 0]
        ambiguous = any(self._collides(group, seed, p, mine) for p in on_set)
        last = int(done[-1]) if len(done) else None
        base = {k: v.copy() for k, v in group.copies[j].items()}
        args = {a.name: a for a in self.problem.args}
        ranks = {a.name: r for r, a in enumerate(self._mutated_args(group))}

        def state(upto: int, visible) -> dict[str, np.ndarray | None]:
            arrays: dict[str, np.ndarray | None] = {k: v.copy() for k, v in base.items()}
            idx = mine[mine <= upto]
            applied = 0
            for p in sorted((p for p in on_set if visible(p)), key=lambda p: p.before):
                seg = idx[applied:][idx[applied:] < p.before]
                self._replay_into(group, j, arrays, seed, seg)
                applied += len(seg)
                self._units(arrays[p.arg], args[p.arg])[p.unit] = np.frombuffer(p.value, dtype=np.uint8)
            self._replay_into(group, j, arrays, seed, idx[applied:])
            if len(idx):  # whole rewrites: the last call's, from the donor that call read
                for name in group.full:
                    donor = self._donor_at(group, j, args[name], int(idx[-1]), on_donors)
                    if donor is None:
                        arrays[name] = None  # a probe on the donor raced that call
                        continue
                    units = self._units(arrays[name], args[name])
                    rot = rotation(seed, int(idx[-1]), ranks[name], len(donor))
                    units[:] = rewritten(units, donor, rot)
            return arrays

        final = [state(calls - 1, lambda p: True)]
        if in_flight:
            final.append(state(calls, lambda p: True))
        for name in final[0]:
            options = [f[name] for f in final]
            match = next((o for o in options if o is not None and group.equals(j, name, o)), None)
            if match is None:
                arg = args[name]
                now = group.arena.read(group.bufs[j][name]).view(NP_DTYPES[arg.dtype]).reshape(base[name].shape)
                unknown = any(o is None for o in options)
                if ambiguous or unknown or (in_flight and self._torn(group, seed, calls, arg, options[0], now,
                                                                     options[-1])):
                    match = now.copy()  # a race the counter cannot order: take what is there
                    ambiguous = True
                else:
                    group.copies[j] = {**group.copies[j], name: options[0]}
                    self._check_inputs(group, j, where)
            group.copies[j][name] = match
        damage = group.damage(j)
        if damage:
            raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", "measure")
        if in_flight or last is None or ambiguous:
            return
        if any(p.before <= last <= p.after for p in on_set):
            return  # a probe landed during the call that wrote this output
        seen = state(last, lambda p: p.after < last)
        if any(v is None for v in seen.values()):
            return
        inputs = {**group.inputs(j, copy=False), **seen}
        self._check_outputs(group, j, inputs, where, always_check)

    def _donor_at(self, group: SlotGroup, j: int, arg, call: int, probes: list[Probe]) -> np.ndarray | None:
        """The donor units set ``j``'s ``arg`` is rewritten from, as call ``call`` read them: the
        run's starting donor with the probes that ended before that call began; None if one was
        under way around it."""
        units = self._units(group.donor(j, arg.name)[1].copy(), arg)
        for p in sorted((p for p in probes if p.arg == arg.name), key=lambda p: p.before):
            if p.after < call:
                units[p.unit] = np.frombuffer(p.value, dtype=np.uint8)
            elif p.before <= call:
                return None
        return units

    def _settle_donors(self, group: SlotGroup, probes: list[Probe], where: str) -> None:
        """After a run: the donors of whole rewrites hold exactly the starting values and the
        probes written into them (anything else is the candidate writing to its future inputs);
        the trusted copies take the probes."""
        for kind, donors in enumerate(group.donor_sets):
            for name in group.full:
                arg = next(a for a in self.problem.args if a.name == name)
                buf, donor = donors[name]
                units = self._units(donor, arg)
                for p in sorted((p for p in probes if p.slot == -1 - kind and p.arg == name),
                                key=lambda p: p.before):
                    units[p.unit] = np.frombuffer(p.value, dtype=np.uint8)
                if not np.array_equal(self.arena.read(buf), donor.reshape(-1).view(np.uint8)):
                    raise Rejected(Outcome.CHEATED, f"while timed on {where}, the values the harness "
                                   f"rewrites `{name}` from were changed: the kernel wrote outside its "
                                   "outputs", "measure")

    def _torn(self, group: SlotGroup, seed: int, calls: int, arg, expected: np.ndarray,
              now: np.ndarray, after: np.ndarray) -> bool:
        """Does ``now`` differ from ``expected`` only inside the unit the in-flight call's
        mutation was copying when the stop came (a multi-byte unit caught half written)? For an
        input rewritten whole: is every unit either as it was or as the rewrite (``after``) has it?"""
        rank = [a.name for a in self._mutated_args(group)].index(arg.name)
        units_now, units_exp = self._units(now.copy(), arg), self._units(expected, arg)
        if arg.name in group.full:
            units_new = self._units(after, arg)
            same = (units_now == units_exp).all(axis=1) | (units_now == units_new).all(axis=1)
            # at most one unit caught half copied
            return int((~same).sum()) <= 1
        dst, _ = mutation_indices(seed, np.array([calls]), rank, len(units_exp),
                                  len(self._units(group.donors[arg.name][1], arg)), group.rows.get(arg.name, 1))
        differ = np.flatnonzero((units_now != units_exp).any(axis=1))
        return len(differ) >= 1 and bool(np.isin(differ, dst).all())

    def _collides(self, group: SlotGroup, seed: int, p: Probe, mine: np.ndarray) -> bool:
        """Did a driver mutation within the probe's counter window hit the probe's unit?"""
        window = mine[(mine >= p.before) & (mine <= p.after)]
        if not len(window):
            return False
        if p.arg in group.full:
            return True
        rank = [a.name for a in self._mutated_args(group)].index(p.arg)
        arg = next(a for a in self.problem.args if a.name == p.arg)
        count = len(self._units(group.copies[p.slot][p.arg], arg))
        donor_count = len(self._units(group.donors[p.arg][1], arg))
        dst, _ = mutation_indices(seed, window, rank, count, donor_count, group.rows.get(p.arg, 1))
        return bool((dst == p.unit).any())

    def _replay_into(self, group: SlotGroup, j: int, arrays: dict, seed: int, calls: np.ndarray) -> None:
        if not len(calls):
            return
        from swarmfactory.harness.arena import replay

        for rank, a in enumerate(self._mutated_args(group)):
            replay(self._units(arrays[a.name], a), self._units(group.donor(j, a.name)[1], a), seed, calls, rank,
                   full=a.name in group.full, rows=group.rows.get(a.name, 1))

    def _sync(self, group: SlotGroup, seed: int, where: str, always_check: bool) -> float:
        # a secret refresh of a random few sets (which ones, the kernel cannot know, and the two
        # checked are drawn after the batch); every output poisoned
        for j in self.rng.choice(group.n, size=min(group.n, 4), replace=False):
            self._refresh(group, int(j))
        for j in range(group.n):
            group.poison(j)
        ns = self.proc.batch(group.first, group.n, group.n, seed, self.timeout, "measure")
        self.last_ns = float(ns)
        ns = max(ns - 0.8 * self.h.exchange_ns(), 0.5 * ns)
        checked = set(self.rng.choice(group.n, size=min(2, group.n), replace=False).tolist())
        for j in range(group.n):
            group.replay(j, seed, np.array([j]))
            if j in checked:
                self._check(group, j, where + f" (set {j})", always_check)
            else:
                damage = group.damage(j)
                if damage:
                    raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", "measure")
        return ns / group.n

    # -- checks ---------------------------------------------------------------------------------
    def _check_inputs(self, group: SlotGroup, j: int, where: str) -> None:
        damage = group.damage(j)
        if damage:
            raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", "measure")
        changed = group.changed_inputs(j)
        if changed:
            raise Rejected(Outcome.CHEATED, f"while timed, the inputs of {where} differ from what the "
                           f"harness wrote (`{changed[0]}` changed: the kernel wrote to an input, or "
                           "the call counter was forged)", "measure")

    def _check(self, group: SlotGroup, j: int, where: str, always: bool) -> None:
        self._check_inputs(group, j, where)
        self._check_outputs(group, j, group.inputs(j, copy=False), where, always)

    def _check_outputs(self, group: SlotGroup, j: int, inputs: dict, where: str, always: bool) -> None:
        cost = self.check_cost.get(id(group))
        sample_s = self.h.config.sample_ms * 1e-3
        if not always and cost is not None and cost > sample_s:
            if self.rng.random() > max(0.25, sample_s / cost):
                return
        t0 = time.perf_counter()
        data = expected_for(self.problem, inputs)
        try:
            check_slot(group, j, self.problem, data, where, "measure", check_inputs=False)
        except Rejected as rej:
            raise Rejected(Outcome.CHEATED, "outputs produced while timing are wrong although "
                           f"verification passed: {rej.detail}", "measure") from None
        self.check_cost[id(group)] = time.perf_counter() - t0
