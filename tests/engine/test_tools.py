"""Function calling: tools and tool_choice, parsed and constrained, through the official client
against the real server (SmolLM2, whose template knows no tools) and on their own."""

from __future__ import annotations

import json

import openai
import pytest

from swarmfactory.engine import tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                                       "required": ["tz"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_calls_are_parsed_from_the_forms_models_write():
    funcs = tools.functions([WEATHER, TIME])
    content, calls = tools.parse('Sure.<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
                                 funcs)
    assert content == "Sure." and calls[0]["function"]["name"] == "get_time"
    assert json.loads(calls[0]["function"]["arguments"]) == {"tz": "UTC"}
    for text in ('{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}',
                 '```json\n[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]\n```'):
        content, calls = tools.parse(text, funcs)
        assert content is None and json.loads(calls[0]["function"]["arguments"])["city"] == "Oslo"
    # text, an unknown function, a JSON answer that is no call: content, no calls
    for text in ("It is sunny.", '{"name": "rm_rf", "arguments": {}}', '{"answer": 42}'):
        assert tools.parse(text, funcs) == (text, [])
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


def test_bad_tools_and_tool_choice_are_refused():
    with pytest.raises(tools.ToolError, match="name"):
        tools.functions([{"type": "function", "function": {"name": "has space"}}])
    with pytest.raises(tools.ToolError, match="two functions"):
        tools.functions([WEATHER, WEATHER])
    funcs = tools.functions([WEATHER])
    with pytest.raises(tools.ToolError, match="not one of the tools"):
        tools.choice({"type": "function", "function": {"name": "nope"}}, funcs)
    with pytest.raises(tools.ToolError, match="needs tools"):
        tools.choice("required", [])
    assert tools.choice(None, funcs) == "auto" and tools.choice(None, []) == "none"


def test_a_template_without_tools_gets_them_in_a_system_message():
    funcs = tools.functions([WEATHER])
    msgs = tools.messages_for_template(
        [{"role": "user", "content": "hi"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "18 C"}], funcs, native=False)
    assert msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"name": "get_weather", "arguments": {"city": "Rome"}}
    assert msgs[3] == {"role": "user", "content": "Result of the call c1: 18 C"}
    assert tools.template_knows_tools("{% if tools %}...{% endif %}") and not tools.template_knows_tools("{{ x }}")


def _valid_weather(args: dict) -> None:
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and len(args["city"]) <= 20
    assert args["unit"] in ("celsius", "fahrenheit")


def test_required_gives_parsable_tool_calls_valid_against_their_schemas(client, model_id):
    for seed in range(3):
        r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=120, temperature=0.7, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None, ch
        assert ch.message.tool_calls
        for call in ch.message.tool_calls:
            args = json.loads(call.function.arguments)
            if call.function.name == "get_weather":
                _valid_weather(args)
            else:
                assert call.function.name == "get_time" and args in ({"tz": "UTC"}, {"tz": "CET"})


def test_a_named_function_gets_its_arguments_streamed_or_not(client, model_id):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME], tool_choice=named,
                                       max_tokens=60, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and [c.function.name for c in ch.message.tool_calls] == ["get_weather"]
    _valid_weather(json.loads(ch.message.tool_calls[0].function.arguments))
    chunks = list(client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME],
                                                 tool_choice=named, max_tokens=60, temperature=0, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_weather"]
    assert deltas[0].function.arguments == ch.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_auto_answers_text_or_calls_and_none_answers_text(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0)
    ch = r.choices[0]
    if ch.message.tool_calls:  # the model chose to call: the call is well formed
        assert ch.finish_reason == "tool_calls"
        json.loads(ch.message.tool_calls[0].function.arguments)
    else:
        assert ch.message.content and ch.finish_reason in ("stop", "length")
    streamed = list(client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], max_tokens=60,
                                                   temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    calls = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert (text or None) == ch.message.content and len(calls) == len(ch.message.tool_calls or [])
    plain = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], tool_choice="none",
                                           max_tokens=20, temperature=0).choices[0]
    assert plain.message.tool_calls is None and plain.message.content


def test_bad_tools_are_a_400(client, model_id):
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "other"}})
    with pytest.raises(openai.BadRequestError, match="constrains the output"):
        client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       response_format={"type": "json_object"}, max_tokens=4)
