"""Agents against a replayed board: no hardware needed to test search logic."""

import random

import pytest

from swarmfactory.agents import make_agents
from swarmfactory.agents.base import Board, Entry, knob_key
from swarmfactory.agents.crossover import CrossoverAgent
from swarmfactory.agents.knobs import KnobAgent, RandomRestartAgent, SeedAgent
from swarmfactory.agents.model_guided import ModelGuidedAgent
from swarmfactory.problems import load_problem
from swarmfactory.swarm.bandit import Bandit


@pytest.fixture
def problem():
    return load_problem("rmsnorm")


def board_with(problem, n, seed=0):
    """A board replaying n random evaluations with a synthetic, knob-dependent speedup."""
    rng = random.Random(seed)
    entries = []
    for i in range(n):
        knobs = {k: rng.choice(list(v)) for k, v in problem.knobs.items()}
        speed = 1.0 + knobs["vw"] / 4 + (0.5 if knobs["scale"] == "mul_inv" else 0)
        entries.append(Entry(f"c{i}", knobs, "faster", speed, "replay", 0))
    return Board(problem, entries, None, [], random.Random(seed + 1))


def test_seed_proposes_the_defaults_once(problem):
    board = Board(problem, [], None, [], random.Random(0))
    (prop,) = SeedAgent().propose(board)
    assert prop.knobs == dict(problem.knob_defaults) and prop.source == problem.render()
    board.entries.append(Entry("x", prop.knobs, "faster", 2.0, "seed", 0))
    assert SeedAgent().propose(board) == []


def test_knob_agent_changes_only_knobs_of_its_aspect(problem):
    board = board_with(problem, 10)
    agent = KnobAgent("vectorisation")
    props = agent.propose(board, 5)
    assert props
    for prop in props:
        parent = next(e for e in board.entries if e.candidate_id == prop.parents[0])
        changed = {k for k in problem.knobs if prop.knobs[k] != parent.knobs[k]}
        assert changed and all(problem.knob_aspects[k] == "vectorisation" for k in changed)
        assert knob_key(prop.knobs) not in board.tried()


def test_knob_agent_without_knobs_of_its_aspect_proposes_nothing(problem):
    assert KnobAgent("blocking").propose(board_with(problem, 5)) == []


def test_crossover_takes_every_knob_from_one_parent(problem):
    board = board_with(problem, 12)
    for prop in CrossoverAgent().propose(board, 4):
        a, b = (next(e for e in board.entries if e.candidate_id == p) for p in prop.parents)
        assert all(prop.knobs[k] in (a.knobs[k], b.knobs[k]) for k in problem.knobs)


def test_model_guided_prefers_what_the_evidence_says_is_fast(problem):
    board = board_with(problem, 40)
    props = ModelGuidedAgent(epsilon=0.0, explore=0.0).propose(board, 5)
    assert len(props) == 5
    assert all(knob_key(p.knobs) not in board.tried() and problem.valid_knobs(p.knobs) for p in props)
    # synthetic truth: wide vectors and mul_inv are fast; the model should have learnt it
    assert sum(p.knobs["vw"] >= 8 for p in props) >= 4


def test_model_guided_waits_for_enough_evidence(problem):
    assert ModelGuidedAgent().propose(board_with(problem, 3)) == []


def test_random_restart_samples_untried_configs(problem):
    board = board_with(problem, 5)
    props = RandomRestartAgent().propose(board, 6)
    assert len({knob_key(p.knobs) for p in props}) == 6


def test_bandit_gives_more_turns_to_agents_that_improve_champions():
    bandit = Bandit(["good", "bad"], random.Random(0))
    for _ in range(20):
        bandit.reward("good", "faster", champion=True)
        bandit.reward("bad", "wrong", champion=False)
    firsts = [bandit.order()[0] for _ in range(200)]
    assert firsts.count("good") > 180
    table = {r["agent"]: r for r in bandit.table()}
    assert table["good"]["champions"] == 20 and table["bad"]["yield"] == 0


def test_agent_sets_and_unknown_agents():
    names = [a.name for a in make_agents("default")]
    assert {"seed", "crossover", "model-guided", "random-restart", "knob-vectorisation"} <= set(names)
    with pytest.raises(ValueError, match="unknown agent"):
        make_agents("default,wizard")
