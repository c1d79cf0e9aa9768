"""The ranking-copy agent: the nearest measured problem's order first, until local evidence
contradicts it (real problems, planted cost-model rows)."""

from __future__ import annotations

import itertools
import random

from swarmfactory.agents import make_agents
from swarmfactory.agents.base import Board, Entry
from swarmfactory.agents.ranking_copy import RankingCopyAgent
from swarmfactory.knowledge.costmodel import make_row
from swarmfactory.problems import load_problem

HERE = {"id": "here", "vendor": "AMD", "features": ["avx2", "avx512f"], "cpus": 2}
OTHER = {"id": "other-cpu", "vendor": "Intel", "features": ["avx2"], "cpus": 2}


def _space(p):
    return [dict(zip(p.knobs, c)) for c in itertools.product(*p.knobs.values()) if p.valid_knobs(dict(zip(p.knobs, c)))]


def _rows(problem, hw, speed, n=40, seed=0, failed=0):
    rng = random.Random(seed)
    picks = rng.sample(_space(problem), n)
    rows = [make_row(problem, hw, k, "faster", speed(k)) for k in picks[failed:]]
    rows += [make_row(problem, hw, k, "wrong", None) for k in picks[:failed]]
    return rows


def test_copies_the_nearest_problem_measured_here_best_first_and_leads():
    geglu, swiglu, layernorm = (load_problem(n) for n in ("geglu", "swiglu", "layernorm"))
    wins = lambda k: 1 + (3 if k["vw"] == 16 else 0) + (1 if k["unroll"] == 4 else 0) + (0.5 if k["form"] == "stable" else 0)
    loses = lambda k: 5 - k["vw"] / 4   # what another CPU measured for geglu itself: the reverse
    transfer = (_rows(swiglu, HERE, wins, failed=6) + _rows(layernorm, HERE, lambda k: 1 + k["vw"])
                + _rows(geglu, OTHER, loses))
    agent = RankingCopyAgent()
    board = Board(geglu, [], None, [], random.Random(0), transfer=transfer, hardware=HERE)
    src, score = agent.source(board)
    shared = list(geglu.knobs)
    # this machine's swiglu (every knob shared) over layernorm (two shared) and over geglu on another CPU
    assert src == "swiglu@here" and set(shared) == set(geglu.knobs)
    assert agent.leads(board)
    props = agent.propose(board, 3)
    assert len(props) == 3 and all(p.agent == "ranking-copy" for p in props)
    # the source's best values of the knobs that matter there come first
    assert (props[0].knobs["vw"], props[0].knobs["unroll"], props[0].knobs["form"]) == (16, 4, "stable")
    assert score(props[0].knobs) >= max(r.log_speedup for r in transfer if r.problem == "swiglu" and r.log_speedup) - 0.05
    assert all(p.knobs["vw"] == 16 for p in props)   # the source's best first


def test_a_source_the_local_evidence_contradicts_stops_leading_and_proposing():
    geglu, swiglu = load_problem("geglu"), load_problem("swiglu")
    there = lambda k: 1 + k["vw"] + (0.5 if k["unroll"] == 4 else 0)
    transfer = _rows(swiglu, HERE, there, n=60)
    agent = RankingCopyAgent()
    # measured here: the reverse of the source's order
    own = [Entry(f"c{i}", k, "faster", 20 / (1 + k["vw"]), "x", 0)
           for i, k in enumerate(random.Random(3).sample(_space(geglu), 5))]
    early = Board(geglu, own[:4], None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert agent.holds(early) and agent.leads(early)   # too little evidence to check it yet
    board = Board(geglu, own, None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert not agent.holds(board) and not agent.leads(board) and agent.propose(board, 2) == []
    # where the local evidence agrees, it keeps going (and stops leading after lead_for of its own)
    agree = [Entry(e.candidate_id, e.knobs, "faster", there(e.knobs), "x", 0) for e in own]
    board = Board(geglu, agree, None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert agent.holds(board) and agent.leads(board) and agent.propose(board, 1)


def test_no_source_without_enough_measured_rows_sharing_a_knob():
    geglu, swiglu = load_problem("geglu"), load_problem("swiglu")
    agent = RankingCopyAgent(min_rows=8)
    few = _rows(swiglu, HERE, lambda k: 1.0, n=7)
    failed = _rows(swiglu, HERE, lambda k: 1.0, n=20, failed=20)  # failures: nothing to copy
    own_here = _rows(geglu, HERE, lambda k: 1.0, n=20)            # the board's own problem here
    for transfer in ([], few, failed, own_here):
        board = Board(geglu, [], None, [], random.Random(0), transfer=transfer, hardware=HERE)
        assert agent.source(board) is None and not agent.leads(board) and agent.propose(board) == []


def test_it_is_an_agent_a_run_can_name_but_not_in_the_default_set():
    # measured in the swarm it did not beat the default agents (docs/agents.md, Transfer)
    assert [a.name for a in make_agents("default,ranking-copy")][-1] == "ranking-copy"
    assert "ranking-copy" not in [a.name for a in make_agents("default")]


def test_another_machines_order_is_a_hypothesis_that_leads_only_once_confirmed_here():
    geglu = load_problem("geglu")
    there = lambda k: 1 + k["vw"] + (0.5 if k["unroll"] == 4 else 0)
    transfer = _rows(geglu, OTHER, there, n=60)   # the same problem, measured on another CPU only
    agent = RankingCopyAgent()
    board = Board(geglu, [], None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert agent.source(board)[0] == "geglu@other-cpu"
    assert not agent.leads(board) and agent.propose(board, 1)   # proposed when asked, never ahead of the rest
    own = [Entry(f"c{i}", k, "faster", there(k), "x", 0) for i, k in enumerate(random.Random(3).sample(_space(geglu), 5))]
    board = Board(geglu, own, None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert agent.leads(board)   # five local measurements agree with it
    wrong = [Entry(e.candidate_id, e.knobs, "faster", 1 / there(e.knobs), "x", 0) for e in own]
    board = Board(geglu, wrong, None, [], random.Random(0), transfer=transfer, hardware=HERE)
    assert not agent.leads(board) and agent.propose(board, 1) == []   # contradicted: retired here
