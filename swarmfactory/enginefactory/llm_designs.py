"""An LLM that proposes engine designs: knob settings for `engine tune`, from the knob space, the
machine, the serving target and the designs measured so far.

``DesignLLM`` wraps a ``ChatClient`` (any OpenAI-compatible endpoint). ``propose`` makes one call
and returns the designs of the answer; ``submit`` / ``ready`` make the same call in the
background, so a slow model never holds up a serving measurement. A bad answer or a failed call
yields no designs and a ``CallRecord`` saying why; nothing here raises into the tuner. After
``MAX_FATAL`` unrecoverable errors in a row (HTTP 4xx, configuration) or at the cost cap the
agent disables itself and ``disabled`` says why.

The designs returned use only knobs and values of the space given, with the deployment's fixed
knobs applied and duplicates within an answer removed. They are not built: the caller builds each
with ``design.build`` (which may still refuse a combination), drops designs it has measured (by
design key) and, for q4_1, those that are not batch invariant. What each knob means comes from
its declaration on ``EngineConfig`` (``engine.config.Knob``, read by ``design.knob_table``).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from dataclasses import dataclass, field

from swarmfactory.agents.llm import MAX_FATAL, render_prompt
from swarmfactory.hardware import cpu_fingerprint
from swarmfactory.llm.client import ChatClient, CostCapReached, LLMError, parse_endpoint

from . import design as D

MAX_SHOWN = 20          # measured designs in a prompt, best first
MAX_FAILURES_SHOWN = 5  # of which at most this many that failed (newest)
FATAL_KINDS = ("http_fatal", "config", "context_overflow")
RATIONALE_KEYS = ("why", "rationale", "reason")
NO_JSON = "no JSON array or object in the answer"
SYSTEM = ("You are an expert in LLM inference serving performance on CPUs. You propose engine "
          "configurations and answer with JSON exactly as asked.")


@dataclass(frozen=True)
class DesignProposal:
    knobs: dict          # knob -> value, every value from the space; the fixed knobs applied
    rationale: str


@dataclass
class CallRecord:
    """One call: ``status`` is ok (designs came back), no_designs (an answer without a usable
    design), empty, parse_error, or the client's error kind (timeout, http, http_fatal, config,
    context_overflow, cost_cap) or error."""

    status: str
    proposals: list[DesignProposal] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)    # why each item of the answer was not used
    usage: dict = field(default_factory=dict)           # prompt/completion tokens, cost_usd, seconds
    error: str | None = None
    raw: str | None = None                              # the answer, when nothing of it was used


def serving_target(cfg) -> str:
    """A TuneConfig as the prompt states the target."""
    work = ", ".join(f"{i}x{o}" for i, o in cfg.workloads)
    line = (f"{cfg.weights} weights; workloads {work} (input x output tokens); concurrency "
            f"{', '.join(map(str, cfg.concurrency))}")
    return line + (f"; TTFT p99 at most {cfg.ttft_p99_s:g} s at every level" if cfg.ttft_p99_s else "")


def client_for(spec: str, model: str | None, timeout_s: float, cost_cap_usd: float) -> ChatClient:
    """The client for ``--llm SPEC [--llm-model M]``; LLMError (kind config) for a bad spec or a
    paid endpoint without its key. ``local`` is refused: it would share the CPU with the designs
    being measured."""
    if spec == "local":
        raise LLMError("config", "--llm local is not available for engine tune: it would share the CPU with the "
                                 "designs being measured; use openai:MODEL or http://HOST:PORT/v1 --llm-model NAME")
    ep = parse_endpoint(spec, model)
    return ChatClient(ep, timeout_s=timeout_s, cost_cap_usd=cost_cap_usd if ep.paid else None)


# -- parsing ------------------------------------------------------------------------------------------
def _payload(text: str):
    """The first JSON array or object in a fenced block, else in the text; None if there is none."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S)
    chunks = re.findall(r"```[a-zA-Z]*\s*\n(.*?)```", text, flags=re.S) + [text]
    dec = json.JSONDecoder()
    for chunk in chunks:
        for m in list(re.finditer(r"[\[{]", chunk))[:200]:
            try:
                return dec.raw_decode(chunk, m.start())[0]
            except ValueError:
                continue
    return None


def _value(raw, values: tuple):
    """``raw`` as one of ``values`` (JSON spellings: "32" for 32, null or "calibrated" for None);
    raises ValueError."""
    if isinstance(raw, bool):  # True == 1 in Python: not a knob value here
        raise ValueError
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    for v in values:
        if raw == v and type(raw) is type(v):
            return v
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit() and int(raw) in values:
        return int(raw)
    if raw is None and "calibrated" in values:
        return "calibrated"
    if isinstance(raw, str) and raw.lower() in ("null", "none", "calibrated") and None in values:
        return None
    raise ValueError


def parse_designs(text: str, space: dict, fixed: dict, n: int) -> tuple[list[DesignProposal], list[str]]:
    """Up to ``n`` designs from an answer, and a reason for each item left out. Never raises.

    An unknown knob is dropped from its design (models add notes such as "weights"); a value not
    in the knob's list drops the whole design. ``fixed`` overrides what the answer says."""
    data = _payload(text or "")
    if data is None:
        return [], [NO_JSON]
    if isinstance(data, dict):
        data = data["designs"] if isinstance(data.get("designs"), list) else [data]
    out, dropped, keys = [], [], set()
    for i, item in enumerate(data):
        where = f"design {i + 1}"
        if not isinstance(item, dict):
            dropped.append(f"{where}: not an object ({type(item).__name__})")
            continue
        why = next((str(item[k]) for k in RATIONALE_KEYS if k in item), "")
        body = item.get("knobs") if isinstance(item.get("knobs"), dict) else \
            {k: v for k, v in item.items() if k not in RATIONALE_KEYS}
        knobs, bad = {}, None
        for name, raw in body.items():
            if name not in space:
                dropped.append(f"{where}: unknown knob {name!r} ignored (knobs: {', '.join(space)})")
                continue
            try:
                knobs[name] = _value(raw, space[name])
            except ValueError:
                bad = f"{where}: {name}={json.dumps(raw)} is not one of {json.dumps(list(space[name]))}"
                break
        if bad:
            dropped.append(bad)
            continue
        if not knobs:
            dropped.append(f"{where}: no knob of the space set")
            continue
        knobs.update(fixed)
        key = json.dumps(knobs, sort_keys=True)
        if key in keys:
            dropped.append(f"{where}: the same design as an earlier one in this answer")
            continue
        if len(out) >= n:
            dropped.append(f"{where}: more than the {n} asked for")
            continue
        keys.add(key)
        out.append(DesignProposal(knobs, " ".join(why.split())[:300]))
    return out, dropped


# -- the prompt -----------------------------------------------------------------------------------------
def _show(v) -> str:
    return "null" if v is None else json.dumps(v)


def _rows(measured: list[dict]) -> tuple[list[dict], int]:
    """Measured designs for the prompt: the best that passed (by ratio), then the newest failures."""
    good = sorted((m for m in measured if m.get("ratio")), key=lambda m: -m["ratio"])
    bad = [m for m in measured if not m.get("ratio")][-MAX_FAILURES_SHOWN:]
    shown = good[:MAX_SHOWN - len(bad)] + bad
    rows = []
    for m in shown:
        serving = m.get("serving")
        rows.append({"knobs": " ".join(f"{k}={_show(v)}" for k, v in m["knobs"].items()),
                     "verdict": m.get("verdict", "?"), "ratio": f"{m['ratio']:.3f}" if m.get("ratio") else None,
                     "detail": " ".join(str(m.get("detail") or "").split())[:240],
                     "serving": (serving if isinstance(serving, str) else json.dumps(serving, separators=(",", ":")))[:300]
                     if serving else None})
    return rows, len(measured) - len(shown)


def declared_meanings() -> dict[str, str]:
    """What each of EngineConfig's design knobs means, as declared on its field."""
    return {name: kf.meaning for name, kf in D.knob_table().items()}


def design_prompt(space: dict, measured: list[dict], fixed: dict, n: int, target: str,
                  meanings: dict[str, str] | None = None) -> list[dict]:
    """The chat messages asking for up to ``n`` designs. ``meanings``: knob -> what it does
    (default: ``declared_meanings``); a knob without one is shown with its values only."""
    fp = cpu_fingerprint()
    meanings = declared_meanings() if meanings is None else meanings
    knobs = [{"name": k, "choices": ", ".join(_show(v) for v in vals), "meaning": meanings.get(k),
              "fixed": _show(fixed[k]) if k in fixed else None} for k, vals in space.items()]
    rows, omitted = _rows(measured)
    user = render_prompt("engine_design.md.j2", target=target or "this machine", machine=fp, knobs=knobs,
                         invariance=inspect.getdoc(D.batch_invariant), measured=rows, omitted=omitted, n=n)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# -- the agent ------------------------------------------------------------------------------------------
class DesignLLM:
    def __init__(self, client: ChatClient, target: str = "", max_tokens: int = 1500, temperature: float = 0.7):
        self.client, self.target = client, target
        self.max_tokens, self.temperature = max_tokens, temperature
        self.name = f"llm-design:{client.endpoint.label}"
        self.pending: threading.Thread | None = None   # a daemon: a call in flight never holds up exit
        self.answer: CallRecord | None = None           # the pending call's, once it finished
        self.calls: list[CallRecord] = []
        self.disabled: str | None = None    # why the agent stopped calling; None while it calls
        self.fatal = 0                      # unrecoverable errors in a row
        self.store = self.run_id = self.problem = None

    def bind(self, store, run_id: str, problem: str) -> None:
        """Record every call in ``store`` (llm_calls) under ``run_id`` and ``problem``."""
        self.store, self.run_id, self.problem = store, run_id, problem

    def propose(self, space: dict, measured: list[dict], fixed, n: int,
                meanings: dict[str, str] | None = None) -> list[DesignProposal]:
        """One call, waited for; [] when it failed or the answer held no usable design. ``fixed``:
        a dict or (knob, value) pairs (TuneConfig.fixed); ``meanings`` as ``design_prompt``'s."""
        if self.disabled:
            return []
        fixed = dict(fixed)
        return self._call(design_prompt(space, measured, fixed, n, self.target, meanings), space, fixed, n).proposals

    def submit(self, space: dict, measured: list[dict], fixed, n: int, meanings: dict[str, str] | None = None) -> bool:
        """``propose`` in the background, unless a call is pending or the agent is disabled;
        False when no call was started."""
        if self.disabled or self.busy():
            return False
        fixed = dict(fixed)
        messages = design_prompt(space, measured, fixed, n, self.target, meanings)

        def call():
            self.answer = self._call(messages, space, fixed, n)

        self.answer = None
        self.pending = threading.Thread(target=call, name="sf-llm-design", daemon=True)
        self.pending.start()
        return True

    def busy(self) -> bool:
        return self.pending is not None and self.pending.is_alive()

    def ready(self) -> list[DesignProposal]:
        """The designs of the call that finished since the last ``ready``, else []."""
        if self.pending is None or self.pending.is_alive():
            return []
        self.pending, answer = None, self.answer
        return answer.proposals if answer else []

    def _call(self, messages: list[dict], space: dict, fixed: dict, n: int) -> CallRecord:
        rec = CallRecord("ok")
        try:
            text, rec.usage = self.client.chat(messages, self.max_tokens, self.temperature)
            rec.proposals, rec.dropped = parse_designs(text, space, fixed, n)
            if not rec.proposals:
                rec.status = "empty" if not text.strip() else \
                    "parse_error" if rec.dropped == [NO_JSON] else "no_designs"
                rec.error, rec.raw = "; ".join(rec.dropped) or "an empty answer", text
            self.fatal = 0
        except CostCapReached as exc:
            rec.status, rec.error = exc.kind, str(exc)
            self.disabled = str(exc)
        except LLMError as exc:
            rec.status, rec.error = exc.kind, str(exc)
            self.fatal = self.fatal + 1 if exc.kind in FATAL_KINDS else 0
            if self.fatal >= MAX_FATAL:
                self.disabled = f"{MAX_FATAL} unrecoverable errors in a row, the last: {exc}"
        except Exception as exc:  # noqa: BLE001 - a model call never takes the tune down
            rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"
        self.calls.append(rec)
        self._record(rec)
        return rec

    def _record(self, rec: CallRecord) -> None:
        if self.store is None:
            return
        u = rec.usage
        self.store.record_llm_call({
            "run_id": self.run_id, "agent": self.name, "endpoint": self.client.endpoint.public(),
            "model": self.client.endpoint.model, "problem": self.problem or "engine", "operator": "design",
            "status": rec.status, "prompt_tokens": u.get("prompt_tokens", 0),
            "completion_tokens": u.get("completion_tokens", 0), "cost_usd": u.get("cost_usd", 0.0),
            "seconds": u.get("seconds", 0.0), "error": rec.error, "raw": (rec.raw or "")[:20000] or None,
            "parent": None})

    def close(self) -> None:
        """No further calls; one in flight is abandoned (its answer is still recorded if it comes)."""
        self.disabled = self.disabled or "closed"
