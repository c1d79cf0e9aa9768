"""Model-guided search: a gradient-boosting cost model trained on the evidence so far predicts
the log-speedup of unseen configurations; the agent proposes the best predicted, with
exploration (an upper-confidence bonus from the spread of bootstrap-trained models, and an
occasional random pick). Failed configurations train the model as a heavy penalty, so it learns
to avoid them too."""

from __future__ import annotations

import math

import numpy as np

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal

FAIL_LOG_SPEEDUP = math.log(0.05)
POOL = 400


def encode(problem, knobs: dict) -> list[float]:
    row = []
    for k, values in problem.knobs.items():
        values = list(values)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            row.append(math.log2(max(float(knobs[k]), 1e-9)) if min(values) > 0 else float(knobs[k]))
        row.extend(1.0 if knobs[k] == v else 0.0 for v in values)
    return row


class ModelGuidedAgent(Agent):
    name = "model-guided"

    def __init__(self, min_points: int = 6, models: int = 4, explore: float = 0.5, epsilon: float = 0.1):
        self.min_points, self.models, self.explore, self.epsilon = min_points, models, explore, epsilon

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        from sklearn.ensemble import GradientBoostingRegressor

        p, rng = board.problem, board.rng
        data = [e for e in board.entries if e.knobs is not None and set(e.knobs) == set(p.knobs)]
        if not p.knobs or len(data) < self.min_points:
            return []
        X = np.array([encode(p, e.knobs) for e in data])
        y = np.array([math.log(e.speedup) if e.correct and e.speedup else FAIL_LOG_SPEEDUP for e in data])
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
        Xp = np.array([encode(p, k) for k in pool])
        nprng = np.random.default_rng(rng.randrange(1 << 30))
        preds = []
        for _ in range(self.models):
            idx = nprng.integers(0, len(X), len(X))
            model = GradientBoostingRegressor(n_estimators=60, max_depth=3, learning_rate=0.1,
                                              random_state=int(nprng.integers(1 << 30)))
            model.fit(X[idx], y[idx])
            preds.append(model.predict(Xp))
        preds = np.array(preds)
        score = preds.mean(axis=0) + self.explore * preds.std(axis=0)
        order = list(np.argsort(-score))
        parents = board.elites(1)
        out = []
        for i in order:
            if len(out) >= n:
                break
            pick = pool[rng.randrange(len(pool))] if rng.random() < self.epsilon else pool[i]
            prop = knob_proposal(board, pick, self.name, "cost-model", parents)
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out
