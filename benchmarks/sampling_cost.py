"""What logprobs, penalties and structured output cost a batch of streams, in the engine itself.

Runs the engine in this process (no HTTP, so only the sampler's work differs): ``--streams``
sequences decode ``--tokens`` tokens each, together, once per variant, in rounds (the variants
interleaved, so that a change in the machine's load touches all of them alike), and prints the
median output tok/s per variant with its ratio to the plain one and the contention measured
over the whole run (``others``: the CPUs' share used by other processes).

Variants: plain (the model's argmax: temperature 0), ``logprobs`` (top 5), ``penalties``
(presence, frequency and repetition) and ``json_schema`` (every row constrained by a JSON schema
whose one long string keeps it going: a bitmask from xgrammar per row and step, applied to the
logits). Every variant samples at temperature 0 except that the grammar changes which tokens
win; each produces ``--tokens`` tokens per stream (``ignore_eos`` where allowed; a constrained
row may finish its JSON earlier, which the output notes).

    .venv/bin/python benchmarks/sampling_cost.py [--model PATH.gguf] [--streams 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarmfactory import contention as C  # noqa: E402
from swarmfactory.engine import Engine, EngineConfig, SamplingParams  # noqa: E402

# a short bounded field, then one long string: every row stays constrained for the whole run
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                           "story": {"type": "string", "minLength": 2000}},
          "required": ["title", "story"]}


def variants(tokens: int) -> dict[str, SamplingParams]:
    base = {"max_tokens": tokens, "temperature": 0.0}
    return {
        "plain": SamplingParams(**base, ignore_eos=True),
        "logprobs (top 5)": SamplingParams(**base, ignore_eos=True, logprobs=5),
        "penalties": SamplingParams(**base, ignore_eos=True, presence_penalty=0.5, frequency_penalty=0.5,
                                    repetition_penalty=1.1),
        "json_schema": SamplingParams(**base, grammar=json.dumps({"type": "json_schema", "schema": SCHEMA,
                                                                    "strict": True})),
    }


def run_once(engine: Engine, params: SamplingParams, streams: int) -> tuple[float, int]:
    prompts = [f"Story {i}: once upon a time" for i in range(streams)]
    seqs = [engine.add_request(p, params) for p in prompts]
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    dur = time.perf_counter() - t0
    return dur, sum(len(s.output_ids) for s in seqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2)")
    ap.add_argument("--weights", default="q4_1")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    cfg = {"weights": args.weights, "max_batch": max(16, args.streams), "max_seq_len": 512}
    if args.model:
        cfg["model"] = args.model
    if args.threads:
        cfg["threads"] = args.threads
    engine = Engine(EngineConfig(**cfg))
    vs = variants(args.tokens)
    engine.grammars.compile(json.loads(vs["json_schema"].grammar))  # compiled once, as the server does
    run_once(engine, vs["plain"], args.streams)  # warm-up
    meter = C.Meter(sorted(os.sched_getaffinity(0)), ours=lambda: [os.getpid()])
    a = meter.snapshot()
    rates: dict[str, list[float]] = {k: [] for k in vs}
    short = {}
    for _ in range(args.rounds):
        for name, p in vs.items():
            dur, n = run_once(engine, p, args.streams)
            if n < args.streams * args.tokens:  # a constrained row closed its JSON early
                short[name] = min(short.get(name, n), n)
            rates[name].append(n / dur)
    reading = meter.between(a, meter.snapshot())
    plain = statistics.median(rates["plain"])
    print(f"{engine.model_id} ({args.weights}), {args.streams} streams x {args.tokens} tokens, {args.rounds} rounds, "
          f"threads {engine.config.resolved_threads()}, paths {engine.paths.as_dict().get('native')}")
    print(f"{'variant':<18} {'tok/s (median)':>15} {'range':>17} {'vs plain':>9}")
    for name, r in rates.items():
        med = statistics.median(r)
        print(f"{name:<18} {med:>15.1f} {min(r):>8.1f}-{max(r):<8.1f} {med / plain:>8.2f}x")
    for name, n in short.items():
        print(f"note: {name} produced as few as {n} of {args.streams * args.tokens} tokens in a round "
              "(rows that finished their JSON early)")
    others = "n/a" if reading.others is None else f"{reading.others:.0%}"
    print(f"contention over the run: others {others} of the CPUs (other processes than this one)")


if __name__ == "__main__":
    main()
