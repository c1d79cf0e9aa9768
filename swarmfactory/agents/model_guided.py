"""Model-guided search: a cost model predicts the speedup of unseen configurations; the agent
proposes the best predicted, with exploration (an upper-confidence bonus from the spread of
bootstrap-trained models, and an occasional random pick).

The model (``knowledge.costmodel``) trains on this problem's evidence on this machine and on what
the board carries from elsewhere (``board.transfer``: other problems, other machines, described by
their features), so on a new problem or a new machine it proposes from the first turn, and its own
evidence takes over as it accumulates. Once the problem has a few measured configurations of its
own, each source of the transferred evidence (this machine's other problems, each other machine)
is checked against them (does a model trained on it alone rank them better than chance?); a source
that does not is dropped, and with none left the agent uses its own evidence only. A row of
another machine weighs its similarity to this one (``hardware.similarity``). Failed
configurations train it as a heavy penalty, so it learns to avoid them too. It reads the space it
searches through the protocol (problems/space.py) and its features (``costmodel.problem_features``),
so it proposes engine designs as it proposes kernels."""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal

POOL = 400


class ModelGuidedAgent(Agent):
    name = "model-guided"

    def __init__(self, min_points: int = 6, models: int = 3, explore: float = 0.5, epsilon: float = 0.1,
                 min_transfer: int = 24, lead_for: int = 8, check_after: int = 5):
        self.min_points, self.models, self.explore, self.epsilon = min_points, models, explore, epsilon
        self.min_transfer, self.lead_for, self.check_after = min_transfer, lead_for, check_after
        self._transfer_models: dict = {}
        self._checked: tuple = (None, [])

    def leads(self, board: Board) -> bool:
        """With transferred evidence and fewer than ``lead_for`` measured configurations of its own,
        the model is the best guess the swarm has: it proposes first (unless this problem's own
        evidence already contradicts every source of what was transferred)."""
        if len(board.transfer) < self.min_transfer:
            return False
        own = sum(1 for e in board.entries if e.knobs is not None and e.speedup is not None)
        return own < self.lead_for and len(self.transferred(board)) >= self.min_transfer

    def transfer_holds(self, board: Board) -> bool:
        """Does any source of what was transferred hold on this problem (``transferred``)?"""
        return bool(self.transferred(board)) or len(board.transfer) < self.min_transfer

    def transferred(self, board: Board) -> list:
        """The transferred rows of the sources that rank this problem's own measured configurations
        better than chance. The sources are this machine's other problems and each other machine;
        once the problem has ``check_after`` measured configurations of its own, a model trained on
        one source alone predicts them, and a source with Spearman rho <= 0 is dropped (negative
        transfer), so one source that hurts does not take the others with it. Every source is kept
        until there is evidence to check it; a source of fewer than ``min_transfer`` rows, too few
        to train a model of its own on, is kept."""
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets, spearman

        p, hw = board.problem, board.hardware or {}
        rows = list(board.transfer)
        own = [(e.knobs, r) for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)
               for r in [make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight)] if r is not None]
        if len(own) < self.check_after or len(rows) < self.min_transfer:
            return rows
        key = (p.name, id(board.transfer), len(rows), len(own))
        if self._checked[0] != key:
            sources: dict[str, list] = {}
            for r in rows:
                sources.setdefault("here" if r.hardware_id == hw.get("id") else r.hardware_id, []).append(r)
            kept = []
            actual = [r.log_speedup if r.log_speedup is not None else -1e9 for _, r in own]
            for name, group in sources.items():
                if len(group) < self.min_transfer:
                    kept += group   # too few to train a model on: nothing to check it with
                    continue
                mkey = (p.name, id(board.transfer), len(rows), name)
                model = self._transfer_models.get(mkey)
                if model is None:
                    model = CostModel(models=1, n_estimators=60, seed=0).fit(relative_targets(list(group)))
                    self._transfer_models[mkey] = model
                pred, _ = model.predict(p, hw, [k for k, _ in own])
                if spearman(pred, actual) > 0:
                    kept += group
            self._transfer_models = {k: v for k, v in self._transfer_models.items() if k[:3] == key[:3]}
            self._checked = (key, kept)
        return self._checked[1]

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets

        p, rng = board.problem, board.rng
        hw = board.hardware or {}
        data = [e for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)]
        own = [r for r in (make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight) for e in data) if r is not None]
        transfer = self.transferred(board)
        if not p.knobs or (len(own) < self.min_points and len(transfer) < self.min_transfer):
            return []
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
