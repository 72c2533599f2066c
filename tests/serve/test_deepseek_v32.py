"""DeepSeek-V3.2's chat encoding and DSML tool calls, served end to end on the default model's
weights with `--chat-template deepseek_v32` (what a V3.2 checkpoint, which has no template, gets
by default). References: the prompt ids are DeepSeek's encoding_dsv32.py rendering
(tests/fixtures/deepseek-v32-encoding, made by tools/deepseek_v32/make_encoding_fixtures.py)
tokenized by Hugging Face tokenizers; forced calls come back through the official OpenAI client
from DSML, whole and streamed."""

import json
import os

import pytest
from openai import OpenAI
from tokenizers import Tokenizer

from conftest import REPO, Server, streamed_calls

CASES = os.path.join(REPO, "tests", "fixtures", "deepseek-v32-encoding", "cases.json")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                  "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "additionalProperties": False}}}


@pytest.fixture(scope="module")
def v32_server(model_dir):
    s = Server(model_dir, "--kv-cache-tokens", "8192", "--chat-template", "deepseek_v32",
               "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_v3")
    yield s
    assert s.stop() == 0, "".join(s.log)


# DSML's tags are text, two hundred tokens a call in the default model's tokenizer: one call a
# request (parallel_tool_calls false) and budgets that hold it.


def client_of(server):
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def request_tools(tools):
    """The fixture's tools as a client sends them: vLLM's dump puts null where a field is absent."""
    if not tools:
        return None
    return [{"type": t["type"], "function": {k: v for k, v in t["function"].items() if v is not None}}
            for t in tools]


@pytest.mark.parametrize("name", ["user_thinking", "system_history_thinking", "tools_chat",
                                  "tool_round_chat", "tool_round_thinking",
                                  "tool_round_answered_thinking", "developer_chat"])
def test_prompt_ids_are_deepseeks_encoding(model_dir, v32_server, name):
    case = next(c for c in json.load(open(CASES, encoding="utf-8")) if c["name"] == name)
    body = {"messages": case["messages"], "chat_template_kwargs": {"thinking": case["thinking"]}}
    if case["tools"]:
        body["tools"] = request_tools(case["tools"])
    status, out, _ = v32_server.request("POST", "/tokenize", body)
    assert status == 200, out
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    assert out["tokens"] == tokenizer.encode(case["rendered"], add_special_tokens=False).ids


def test_forced_calls_come_back_from_dsml(v32_server):
    client = client_of(v32_server)
    args = dict(model="sy-test", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=[WEATHER, ADD], tool_choice="required", max_tokens=600, temperature=0,
                parallel_tool_calls=False)
    whole = client.chat.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
            assert arguments["unit"] in ("celsius", "fahrenheit")
        else:
            assert call.function.name == "add"
            assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())
    calls, finish = streamed_calls(client, args)  # the ids are new "call_…" ones each request
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]


def test_thinking_mode_reasons_then_calls(v32_server):
    """thinking: true opens the think block at the end of the prompt: the output starts in the
    reasoning, and after its budget the named call is forced in DSML."""
    client = client_of(v32_server)
    response = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=600, temperature=0, parallel_tool_calls=False,
        extra_body={"thinking_token_budget": 6, "chat_template_kwargs": {"thinking": True}})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    message = choice.message.model_dump()
    assert message.get("reasoning_content"), message
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]
    # Chat mode (the default, as vLLM's): no reasoning, the call at once.
    response = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=[ADD], tool_choice="required", max_tokens=600, temperature=0,
        parallel_tool_calls=False)
    message = response.choices[0].message.model_dump()
    assert not message.get("reasoning_content")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["add"]
