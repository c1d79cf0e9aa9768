"""Evidence tables (SQLAlchemy Core). Append-only: rows are inserted, never rewritten, except a
run's status line. Bump SCHEMA_VERSION with any change; a store with another version is refused
with a message rather than silently misread."""

from __future__ import annotations

from sqlalchemy import (JSON, Column, DateTime, Float, Integer, MetaData, String, Table, Text,
                        UniqueConstraint, func)

SCHEMA_VERSION = 1
metadata = MetaData()


def _created():
    return Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False)


meta = Table("sf_meta", metadata, Column("key", String(64), primary_key=True),
             Column("value", Text, nullable=False))

runs = Table(
    "runs", metadata,
    Column("id", String(32), primary_key=True),
    Column("status", String(16), nullable=False),          # running | finished | interrupted
    Column("config", JSON, nullable=False),
    Column("hardware_id", String(32), nullable=False),
    Column("parent_run", String(32)),
    Column("finished_at", DateTime(timezone=True)),
    _created(),
)

problems = Table(
    "problems", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("spec_hash", String(32), nullable=False),
    Column("signature", Text, nullable=False),
    Column("description", Text, nullable=False),
    _created(),
    UniqueConstraint("name", "spec_hash"),
)

candidates = Table(
    "candidates", metadata,
    Column("id", String(64), primary_key=True),            # content hash of source + flags
    Column("problem", String(128), nullable=False, index=True),
    Column("backend", String(32), nullable=False),
    Column("source", Text, nullable=False),
    Column("flags", JSON, nullable=False),
    Column("knobs", JSON),
    Column("parents", JSON, nullable=False),
    Column("agent", String(64), nullable=False),
    Column("operator", String(64), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("run_id", String(32)),
    _created(),
)

evaluations = Table(
    "evaluations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("candidate_id", String(64), nullable=False, index=True),
    Column("problem", String(128), nullable=False, index=True),
    Column("problem_spec", String(32), nullable=False),
    Column("validation_version", String(32), nullable=False),
    Column("run_id", String(32), index=True),
    Column("purpose", String(16), nullable=False),         # search | remeasure | eval | reverify
    Column("hardware_id", String(32), nullable=False),
    Column("hardware", JSON, nullable=False),
    Column("tools", JSON, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("stage", String(16), nullable=False),
    Column("detail", Text, nullable=False),
    Column("speedup", Float), Column("ci_low", Float), Column("ci_high", Float),
    Column("vs_reference", Float), Column("roofline_fraction", Float),
    Column("baseline", String(256)),
    Column("shapes", JSON, nullable=False),
    Column("flags", JSON, nullable=False),
    Column("evidence", JSON, nullable=False),
    Column("cases_checked", Integer, nullable=False),
    Column("seconds", Float, nullable=False),
    _created(),
)

validation_cases = Table(
    "validation_cases", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem", String(128), nullable=False, index=True),
    Column("case_key", String(512), nullable=False),
    Column("shape", JSON, nullable=False),
    Column("seed", Integer, nullable=False),
    Column("dist", String(32), nullable=False),
    Column("found_by", String(64), nullable=False),
    Column("broke_candidate", String(64)),
    Column("note", Text),
    _created(),
    UniqueConstraint("problem", "case_key"),
)

champions = Table(
    "champions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem", String(128), nullable=False),
    Column("problem_spec", String(32), nullable=False),
    Column("hardware_id", String(32), nullable=False),
    Column("candidate_id", String(64)),                    # NULL: dethroned, no successor
    Column("evaluation_id", Integer),
    Column("run_id", String(32)),
    Column("speedup", Float),
    Column("reason", Text, nullable=False),
    _created(),
)

baselines = Table(
    "baselines", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem", String(128), nullable=False),
    Column("spec_hash", String(32), nullable=False),
    Column("shape_key", String(256), nullable=False),
    Column("hardware_id", String(32), nullable=False),
    Column("tools_key", String(128), nullable=False),
    Column("compile", Integer, nullable=False),
    Column("record", JSON, nullable=False),
    _created(),
)

roofs = Table(
    "roofs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hardware_id", String(32), nullable=False),
    Column("threads", Integer, nullable=False),
    Column("record", JSON, nullable=False),
    _created(),
)

# Written by the analyst (swarmfactory/knowledge/analyst.py). A lesson's identity is data["key"]
# and its status data["status"] (active | retired, with data["why"]); a status change is a new row,
# so the latest row of a key is the lesson as it stands and its earlier rows are its history.
lessons = Table(
    "lessons", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem", String(128)),
    Column("hardware_id", String(32), nullable=False),
    Column("agent", String(64), nullable=False),
    Column("text", Text, nullable=False),
    Column("data", JSON, nullable=False),
    Column("run_id", String(32)),
    _created(),
)

llm_calls = Table(
    "llm_calls", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), index=True),
    Column("agent", String(128), nullable=False),
    Column("endpoint", JSON, nullable=False),              # label, base_url, model, key *variable name*
    Column("model", String(256), nullable=False),
    Column("problem", String(128), nullable=False),
    Column("operator", String(32), nullable=False),        # rewrite | repair
    Column("status", String(32), nullable=False),          # ok | empty | parse_error | apply_error | timeout | http | ...
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("cost_usd", Float, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("error", Text),
    Column("raw", Text),                                   # the answer, when it could not be used
    Column("parent", String(64)),
    _created(),
)

# Evaluation leases (swarmfactory/evidence/leases.py): several coordinators on one store claim a
# (candidate, problem spec, validation version, hardware) before evaluating it. Added without a
# schema bump: no existing row changes meaning, and a store opened without the table gets it
# (created on first use). ``expires_at`` is seconds since the epoch on the database's clock, so
# coordinators on machines with skewed clocks agree on when a lease has expired.
leases = Table(
    "leases", metadata,
    Column("candidate_id", String(64), nullable=False),
    Column("problem_spec", String(32), nullable=False),
    Column("validation_version", String(32), nullable=False),
    Column("hardware_id", String(32), nullable=False),
    Column("problem", String(128), nullable=False, index=True),
    Column("owner", String(64), nullable=False),           # run id : coordinator token
    Column("state", String(8), nullable=False),            # held | done
    Column("expires_at", Float, nullable=False),
    Column("attempts", Integer, nullable=False),           # claims so far (a takeover adds one)
    _created(),
    UniqueConstraint("candidate_id", "problem_spec", "validation_version", "hardware_id"),
)

# Processes a run, an evaluation or a tuning session started (swarmfactory/lifecycle.py), by pid
# and start time on one boot of one machine, with their owner's: should the owner die without
# ending them, the next run on the store does. Added without a schema bump (created on first use).
processes = Table(
    "processes", metadata,
    Column("boot", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("start", String(32), nullable=False),           # /proc/PID/stat start time
    Column("what", String(64), nullable=False),
    Column("owner_pid", Integer, nullable=False),
    Column("owner_start", String(32)),
    _created(),
    UniqueConstraint("boot", "pid", "start"),
)
