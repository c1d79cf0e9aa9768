"""Model-guided search: a cost model predicts the speedup of unseen configurations; the agent
proposes the best predicted, with exploration (an upper-confidence bonus from the spread of
bootstrap-trained models, and an occasional random pick).

The model (``knowledge.costmodel``) trains on this problem's evidence on this machine and on what
the board carries from elsewhere (``board.transfer``: other problems, other machines, described by
their features), so on a new problem or a new machine it proposes from the first turn, and its own
evidence takes over as it accumulates. Once the problem has a few measured configurations of its
own, each source of the transferred evidence (this machine's other problems, each other machine)
is checked against them (does a model trained on it alone rank them better than chance, and does
its favourite among them measure near the best of them here?); a source that fails is dropped, and
with none left the agent uses its own evidence only. What another machine's evidence condemns is
a hypothesis here, not a verdict: while such a source is in use and its advice stalls (the last
evaluation did not beat the best before it, and was not itself a probe), the next proposal tests
its strongest untested claim (the best configuration so far with one knob set to a value nothing
measured here has, the one that evidence ranks furthest below it), so a knob value that is slow
there but fast here is found in a few evaluations instead of never, and the check above sees the
contradiction; while its advice keeps improving on the best, it is followed. A row of
another machine weighs its similarity to this one (``hardware.similarity``). Failed
configurations train it as a heavy penalty, so it learns to avoid them too. It reads the space it
searches through the protocol (problems/space.py) and its features (``costmodel.problem_features``),
so it proposes engine designs as it proposes kernels."""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal

POOL = 400
TOP_TOLERANCE = 0.10   # a source's favourite among the measured configurations: within 10% of the best of them


def top_holds(pred, actual, top: int = 2) -> bool:
    """Does a source's top hold on the configurations measured here? ``pred``: what a model
    trained on the source alone predicts of them; ``actual``: their log speedups here (a failure
    very low). It holds when the best measured of the ``top`` configurations it ranks highest is
    within ``TOP_TOLERANCE`` of the best measured of all: a source whose favourites are beaten
    here by one it ranks lower has a top that is not this problem's, however well it orders the
    rest (a whole-ranking Spearman over the configurations keeps such a source)."""
    import math

    if len(actual) < 2:
        return True
    order = sorted(range(len(pred)), key=lambda i: -pred[i])
    return max(actual[i] for i in order[:top]) >= max(actual) + math.log(1.0 - TOP_TOLERANCE)


def retire(rows: list, own: list) -> list:
    """``rows`` without the claims that this problem's own measurements contradict. A (problem,
    machine) group of transferred rows claims that a knob value ``v`` is worse than another value
    ``u`` when its best configuration with ``v`` measured more than ``TOP_TOLERANCE`` below its
    best with ``u`` (or ``v`` only failed there). Here, two configurations that differ in that knob
    alone (``own``: this problem's rows on this machine), the one with ``v`` within
    ``TOP_TOLERANCE`` of the one with ``u`` or faster, contradict the claim, and the group's rows
    with ``v`` are left out (here only: the rows stay as they are for their own machine and
    problem). What the group says of its other values stands.

    Only a matched pair assigns the blame: a configuration that differs from another in three
    knobs and measures near it says nothing of which of the three the group had wrong (a rule
    that retired every claim against every value of a configuration near the best so far, itself
    far from the best early on, retired true claims with the false one and left too little
    standing). The probes make such pairs: the best so far with one knob changed."""
    import math

    good = [r for r in own if r.log_speedup is not None]
    if len(good) < 2:
        return rows
    tol = math.log(1.0 - TOP_TOLERANCE)
    # (knob, v, u): here v measured within tolerance of u or faster, every other knob held equal.
    # Configurations are bucketed by their other knobs (one pass per knob, not every pair of
    # measurements: this runs at each proposal, and a long run has hundreds of them); in a bucket
    # some v-measurement is near some u-measurement when v's fastest is near u's slowest
    holds: set[tuple] = set()
    for k in {k for r in good for k in r.knobs}:
        buckets: dict[tuple, dict[str, list[float]]] = {}
        for r in good:
            if k in r.knobs:
                rest = tuple(sorted((n, repr(x)) for n, x in r.knobs.items() if n != k))
                span = buckets.setdefault(rest, {}).setdefault(repr(r.knobs[k]), [math.inf, -math.inf])
                span[0], span[1] = min(span[0], r.log_speedup), max(span[1], r.log_speedup)
        for values in buckets.values():
            for v, (_, fastest) in values.items():
                holds.update((k, v, u) for u, (slowest, _) in values.items() if u != v and fastest >= slowest + tol)
    if not holds:
        return rows
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.problem, r.hardware_id), []).append(r)
    out = []
    for group in groups.values():
        best: dict[tuple, float] = {}
        for r in group:
            s = r.log_speedup if r.log_speedup is not None else -math.inf
            for k, v in r.knobs.items():
                best[(k, repr(v))] = max(best.get((k, repr(v)), -math.inf), s)
        against = {(k, v) for k, v, u in holds
                   if (k, u) in best and best[(k, u)] > -math.inf and best.get((k, v), -math.inf) < best[(k, u)] + tol}
        out += [r for r in group if not any((k, repr(v)) in against for k, v in r.knobs.items())]
    return out


class ModelGuidedAgent(Agent):
    name = "model-guided"

    def __init__(self, min_points: int = 6, models: int = 3, explore: float = 0.5, epsilon: float = 0.1,
                 min_transfer: int = 24, lead_for: int = 8, check_after: int = 5):
        self.min_points, self.models, self.explore, self.epsilon = min_points, models, explore, epsilon
        self.min_transfer, self.lead_for, self.check_after = min_transfer, lead_for, check_after
        self._transfer_models: dict = {}
        self._checked: tuple = (None, [])
        self._probes: set[tuple[str, str]] = set()   # (problem, knob key) of every probe proposed

    def leads(self, board: Board) -> bool:
        """With transferred evidence and fewer than ``lead_for`` measured configurations of its own,
        the model is the best guess the swarm has: it proposes first (after the seed agent's
        defaults), from whatever rows stand (unless this problem's own evidence already contradicts
        every source of what was transferred)."""
        if len(board.transfer) < self.min_transfer:
            return False
        own = sum(1 for e in board.entries if e.knobs is not None and e.speedup is not None)
        return own < self.lead_for and len(self.transferred(board)) > 0

    def transfer_holds(self, board: Board) -> bool:
        """Does any source of what was transferred hold on this problem (``transferred``)?"""
        return bool(self.transferred(board)) or len(board.transfer) < self.min_transfer

    def transferred(self, board: Board) -> list:
        """The transferred rows this problem's own measurements leave standing. The sources are
        this machine's other problems and each other machine. First, what a source's rows say
        against a knob value that measures near the best here is retired here (``retire``).
        Then, once the problem has ``check_after`` measured configurations of its own, a model
        trained on one source alone predicts them, and a source is dropped (negative transfer)
        where its Spearman rho is <= 0 or its top does not hold (``top_holds``), or where so much of
        it was retired that fewer than ``min_transfer`` of its rows stand, so one source that hurts
        does not take the others with it. Every source is kept until there is evidence
        to check it; a source of fewer than ``min_transfer`` rows, too few to train a model of its
        own on, is kept."""
        from swarmfactory.knowledge.costmodel import make_row, spearman

        p, hw = board.problem, board.hardware or {}
        rows = list(board.transfer)
        own = [(e.knobs, r) for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)
               for r in [make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight)] if r is not None]
        if not own or len(rows) < self.min_transfer:
            return rows
        key = (p.name, id(board.transfer), len(rows), len(own))
        if self._checked[0] != key:
            standing = retire(rows, [r for _, r in own])
            kept = standing
            if len(own) >= self.check_after:
                source = lambda r: "here" if r.hardware_id == hw.get("id") else r.hardware_id
                size: dict[str, int] = {}
                for r in rows:
                    size[source(r)] = size.get(source(r), 0) + 1
                sources: dict[str, list] = {}
                for r in standing:
                    sources.setdefault(source(r), []).append(r)
                kept = []
                actual = [r.log_speedup if r.log_speedup is not None else -1e9 for _, r in own]
                for name, group in sources.items():
                    if size[name] < self.min_transfer:
                        kept += group   # too few to train a model on: nothing to check it with
                        continue
                    if len(group) < self.min_transfer:
                        continue        # so much of it contradicted here that too little stands to check
                    pred, _ = self._model_of(key[:3], group).predict(p, hw, [k for k, _ in own])
                    if spearman(pred, actual) > 0 and top_holds(pred, actual):
                        kept += group
            self._transfer_models = {k: v for k, v in self._transfer_models.items() if k[:3] == key[:3]}
            self._checked = (key, kept)
        return self._checked[1]

    def _model_of(self, board_key: tuple, rows: list, here: dict | None = None):
        """A one-tree-ensemble model of ``rows`` alone, cached while the board's transferred rows are
        the same (``board_key``) and keyed by which rows they are: retirement can leave a source as
        many rows as before but other ones."""
        from swarmfactory.knowledge.costmodel import CostModel, relative_targets

        mkey = board_key + (tuple(id(r) for r in rows), here is not None)
        model = self._transfer_models.get(mkey)
        if model is None:
            model = CostModel(models=1, n_estimators=60, seed=0).fit(relative_targets(list(rows)), here=here)
            self._transfer_models[mkey] = model
        return model

    def stalled(self, problem: str, data: list) -> bool:
        """Did the last evaluation (``data`` in evaluation order) fail to beat the best before it,
        without being a probe itself? (A failure or an unmeasured candidate beats nothing; one
        still in flight is not an evaluation yet.)"""
        data = [e for e in data if e.outcome != "pending"]
        if len(data) < 2 or data[-1].knobs is None or (problem, knob_key(data[-1].knobs)) in self._probes:
            return False
        before = [e.speedup for e in data[:-1] if e.correct and e.speedup is not None]
        last = data[-1]
        return not (last.correct and last.speedup is not None and last.speedup > max(before, default=0.0))

    def probe(self, board: Board, transfer: list, data: list) -> Proposal | None:
        """A test of the strongest claim of another machine's evidence that nothing here has tested:
        the best configuration measured so far with one knob set to a value no configuration
        measured here has, the one a model of the other machines' rows ranks furthest below it.
        None where there is nothing to test: no other machine's rows in use (fewer than
        ``min_transfer``, or dropped by ``transferred``), nothing measured yet, no such value left,
        or every such value ranked above the best so far (the model's own pick tests those)."""
        p, hw = board.problem, board.hardware or {}
        others = [r for r in transfer if r.hardware_id != hw.get("id")]
        measured = [e for e in data if e.correct and e.speedup is not None]
        if len(others) < self.min_transfer or not measured:
            return None
        best = max(measured, key=lambda e: e.speedup)
        here = {(k, repr(e.knobs.get(k))) for e in data for k in p.knobs}
        tried = board.tried()
        variants = []
        for k, values in p.knobs.items():
            for v in values:
                knobs = {**best.knobs, k: v}
                if (k, repr(v)) not in here and p.valid_knobs(knobs) and knob_key(knobs) not in tried:
                    variants.append(knobs)
        if not variants:
            return None
        model = self._model_of((p.name, id(board.transfer), len(board.transfer)), others, here=hw)
        pred, _ = model.predict(p, hw, [best.knobs] + variants)
        claim, i = max((pred[0] - pred[j + 1], j) for j in range(len(variants)))
        if claim <= 0:
            return None
        return knob_proposal(board, variants[i], self.name, "probe: another machine's claim", [best])

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets

        p, rng = board.problem, board.rng
        hw = board.hardware or {}
        data = [e for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)]
        own = [r for r in (make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight) for e in data) if r is not None]
        transfer = self.transferred(board)
        if not p.knobs or (len(own) < self.min_points and (len(board.transfer) < self.min_transfer or not transfer)):
            return []
        if self.stalled(p.name, data):   # the advice stalls: test what another machine's evidence condemns
            test = self.probe(board, transfer, data)
            if test is not None:
                self._probes.add((p.name, knob_key(test.knobs)))
                return [test]
        for r in own:
            r.hardware_id = hw.get("id", r.hardware_id)
        rows = relative_targets(transfer + own)
        tried = board.tried()
        pool, seen = [], set()
        for _ in range(POOL * 3):
            if len(pool) >= POOL:
                break
            knobs = {k: rng.choice(list(v)) for k, v in p.knobs.items()}
            key = knob_key(knobs)
            if key in tried or key in seen or not p.valid_knobs(knobs):
                continue
            seen.add(key)
            pool.append(knobs)
        if not pool:
            return []
        model = CostModel(models=self.models, n_estimators=60, seed=rng.randrange(1 << 30))
        mean, spread = model.fit(rows, own=(p.name, hw.get("id")), here=hw).predict(p, hw, pool)
        score = mean + self.explore * spread
        order = sorted(range(len(pool)), key=lambda i: -score[i])
        parents = board.elites(1)
        out = []
        for i in order:
            if len(out) >= n:
                break
            pick = pool[rng.randrange(len(pool))] if rng.random() < self.epsilon else pool[i]
            prop = knob_proposal(board, pick, self.name, "cost-model" if own else "cost-model (transferred)",
                                 parents)
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out
