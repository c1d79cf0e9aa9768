"""Model-guided search: a cost model predicts the speedup of unseen configurations; the agent
proposes the best predicted, with exploration (an upper-confidence bonus from the spread of
bootstrap-trained models, and an occasional random pick).

The model (``knowledge.costmodel``) trains on this problem's evidence on this machine and on what
the board carries from elsewhere (``board.transfer``: other problems, other machines, described by
their features), so on a new problem or a new machine it proposes from the first turn, and its own
evidence takes over as it accumulates. Once the problem has a few measured configurations of its
own, the transferred evidence is checked against them (does a model trained on it alone rank them
better than chance?); where it does not, the agent uses its own evidence only. Failed
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
        self._checked: tuple = (None, True)

    def leads(self, board: Board) -> bool:
        """With transferred evidence and fewer than ``lead_for`` measured configurations of its own,
        the model is the best guess the swarm has: it proposes first (unless this problem's own
        evidence already contradicts what was transferred)."""
        if len(board.transfer) < self.min_transfer:
            return False
        own = sum(1 for e in board.entries if e.knobs is not None and e.speedup is not None)
        return own < self.lead_for and self.transfer_holds(board)

    def transfer_holds(self, board: Board) -> bool:
        """Does what was transferred rank this problem's own measured configurations better than
        chance? A model trained on the transferred rows alone predicts them; with ``check_after``
        or more and a Spearman rho <= 0 it does not (negative transfer): the agent then trains on
        the problem's own evidence only and no longer leads. True until there is evidence to check."""
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets, spearman

        p, hw = board.problem, board.hardware or {}
        own = [(e.knobs, r) for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)
               for r in [make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight)] if r is not None]
        if len(own) < self.check_after or len(board.transfer) < self.min_transfer:
            return True
        key = (p.name, id(board.transfer), len(board.transfer), len(own))
        if self._checked[0] != key:
            model = self._transfer_models.get(key[:3])
            if model is None:
                model = CostModel(models=1, n_estimators=60, seed=0).fit(relative_targets(list(board.transfer)))
                self._transfer_models = {key[:3]: model}
            pred, _ = model.predict(p, hw, [k for k, _ in own])
            actual = [r.log_speedup if r.log_speedup is not None else -1e9 for _, r in own]
            self._checked = (key, spearman(pred, actual) > 0)
        return self._checked[1]

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets

        p, rng = board.problem, board.rng
        hw = board.hardware or {}
        data = [e for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)]
        own = [r for r in (make_row(p, hw, e.knobs, e.outcome, e.speedup, e.weight) for e in data) if r is not None]
        transfer = list(board.transfer) if self.transfer_holds(board) else []
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
        mean, spread = model.fit(rows, own=(p.name, hw.get("id"))).predict(p, hw, pool)
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
