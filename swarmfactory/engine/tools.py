"""Function calling for ``/v1/chat/completions``: ``tools`` and ``tool_choice``.

How a request with tools runs:

- **The prompt.** Where the model's chat template knows tools (it reads a ``tools`` variable,
  as Qwen 2.5/3's and Llama 3.1's do), the tools go to the template, as transformers passes
  them. Where it does not (SmolLM2's, Gemma 3's), a system message lists them as JSON and asks
  for a call as ``{"name": ..., "arguments": {...}}`` (llama.cpp's generic approach): the model
  still sees what it may call. Assistant messages carrying ``tool_calls`` and ``tool`` messages
  are written in that same JSON for such templates.
- **The answer.** ``tool_choice: "none"``: plain text. ``"auto"`` (the default with tools): the
  text is parsed for calls (``<tool_call>{...}</tool_call>`` blocks, as Hermes/Qwen write them,
  or a whole answer that is one JSON call or a list of them, fenced or not); calls found become
  ``tool_calls`` with ``finish_reason: "tool_calls"``, the rest of the text stays ``content``.
  ``"required"``: the output is constrained (``structured.py``) to a JSON list of one or more
  ``{"name", "arguments"}`` calls, each name one of the tools and its arguments valid against
  that tool's ``parameters`` schema. A named function (``{"type": "function", "function":
  {"name": ...}}``): the output is constrained to that function's arguments (finish reason
  ``stop``, as OpenAI answers a forced function).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any


class ToolError(ValueError):
    """A ``tools`` / ``tool_choice`` the server cannot use; the message says why (a 400)."""


def functions(tools: list[dict] | None) -> list[dict]:
    """The ``function`` objects of ``tools``, checked: each a ``{"type": "function", "function":
    {"name": ..., "parameters": {...}}}`` with a unique name."""
    out, names = [], set()
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'")
        if name in names:
            raise ToolError(f"tools[{i}]: two functions are named {name!r}")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON Schema object")
        names.add(name)
        out.append({"name": name, "description": f.get("description", ""), "parameters": params})
    return out


def choice(tool_choice: Any, funcs: list[dict]) -> str | dict:
    """``"none"``, ``"auto"``, ``"required"`` or the named function (its dict), checked."""
    if tool_choice is None:
        return "auto" if funcs else "none"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not funcs:
            raise ToolError("tool_choice 'required' needs tools")
        return tool_choice
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        for f in funcs:
            if f["name"] == name:
                return f
        raise ToolError(f"tool_choice names {name!r}, which is not one of the tools")
    raise ToolError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}")


def grammar(mode: str | dict, funcs: list[dict], parallel: bool = True) -> dict | None:
    """The structured-output spec that forces a call (``required``: one or more, one only when
    ``parallel_tool_calls`` is false; a named function: its arguments), or None."""
    if isinstance(mode, dict):
        return {"type": "json_schema", "schema": mode["parameters"], "strict": True}
    if mode != "required":
        return None
    calls = [{"type": "object", "properties": {"name": {"enum": [f["name"]]}, "arguments": f["parameters"]},
              "required": ["name", "arguments"]} for f in funcs]
    return {"type": "json_schema", "strict": True,
            "schema": {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
                       "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}}


def template_knows_tools(template_source: str | None) -> bool:
    return bool(template_source) and re.search(r"\btools\b", template_source) is not None


def system_prompt(funcs: list[dict]) -> str:
    """What a model whose template knows no tools is told about them."""
    listed = json.dumps([{"name": f["name"], "description": f["description"], "parameters": f["parameters"]}
                         for f in funcs], ensure_ascii=False)
    return ("You can call these functions:\n" + listed + "\nTo call one, reply with only a JSON object: "
            '{"name": <function name>, "arguments": <arguments object>}. Otherwise reply normally.')


def messages_for_template(messages: list[dict], funcs: list[dict], native: bool) -> list[dict]:
    """The conversation as the template gets it: as is for a template that knows tools; else
    with the tools described in a system message, and calls and results written as text."""
    if native:
        return messages
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = [{"name": c.get("function", {}).get("name"), "arguments": _loads(c.get("function", {}).get("arguments"))}
                     for c in m.pop("tool_calls")]
            m["content"] = (m.get("content") or "") + json.dumps(calls[0] if len(calls) == 1 else calls,
                                                                  ensure_ascii=False)
        if m.get("role") == "tool":
            m = {"role": "user", "content": f"Result of the call {m.get('tool_call_id') or ''}: {m.get('content') or ''}"}
        out.append(m)
    if funcs:
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + system_prompt(funcs)}
        else:
            out.insert(0, {"role": "system", "content": system_prompt(funcs)})
    return out


def _loads(s):
    try:
        return json.loads(s) if isinstance(s, str) else (s or {})
    except json.JSONDecodeError:
        return s


def _call(obj, names: set[str]) -> dict | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args)
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse(text: str, funcs: list[dict]) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a model's answer in ``auto`` mode: the calls it wrote in one of
    the forms the module docstring lists; text that is not a call stays content."""
    names = {f["name"] for f in funcs}
    blocks = _BLOCK.findall(text)
    if blocks:
        calls = [c for b in blocks if (c := _call(_loads(b), names))]
        if calls:
            rest = _BLOCK.sub("", text).strip()
            return (rest or None), calls
    body = text.strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return text, []
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call(o, names) for o in items]
    if items and all(calls):
        return None, calls
    return text, []


def forced(text: str, mode: str | dict) -> list[dict]:
    """The tool_calls of an answer constrained by ``grammar(mode)``."""
    obj = json.loads(text)
    if isinstance(mode, dict):
        return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": mode["name"], "arguments": json.dumps(obj, ensure_ascii=False)}}]
    names = {c["name"] for c in obj}
    return [_call(c, names) for c in obj]


def could_start_a_call(text: str) -> bool:
    """While streaming in ``auto`` mode: whether the text so far may still turn out to be a call
    (so it is held back rather than sent as content)."""
    s = text.lstrip()
    return not s or s[0] in "{[`" or "<tool_call>".startswith(s[:11]) or s.startswith("<tool_call>")
