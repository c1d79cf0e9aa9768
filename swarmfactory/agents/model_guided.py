"""Model-guided search: a cost model predicts the speedup of unseen configurations; the agent
proposes the best predicted, with exploration (an upper-confidence bonus from the spread of
bootstrap-trained models, and an occasional random pick).

The model (``knowledge.costmodel``) trains on this problem's evidence on this machine and on what
the board carries from elsewhere (``board.transfer``: other problems, other machines, described by
their features), so on a new problem or a new machine it proposes from the first turn, and its own
evidence takes over as it accumulates. Failed configurations train it as a heavy penalty, so it
learns to avoid them too."""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal

POOL = 400


class ModelGuidedAgent(Agent):
    name = "model-guided"

    def __init__(self, min_points: int = 6, models: int = 3, explore: float = 0.5, epsilon: float = 0.1,
                 min_transfer: int = 24, lead_for: int = 8):
        self.min_points, self.models, self.explore, self.epsilon = min_points, models, explore, epsilon
        self.min_transfer, self.lead_for = min_transfer, lead_for

    def leads(self, board: Board) -> bool:
        """With transferred evidence and fewer than ``lead_for`` measured configurations of its own,
        the model is the best guess the swarm has: it proposes first."""
        if len(board.transfer) < self.min_transfer:
            return False
        own = sum(1 for e in board.entries if e.knobs is not None and e.speedup is not None)
        return own < self.lead_for

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        from swarmfactory.knowledge.costmodel import CostModel, make_row, relative_targets

        p, rng = board.problem, board.rng
        hw = board.hardware or {}
        data = [e for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)]
        own = [r for r in (make_row(p, hw, e.knobs, e.outcome, e.speedup) for e in data) if r is not None]
        transfer = list(board.transfer)
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
