"""Tool calling and reasoning through the official openai client: tool_choice required and named
(forced by the grammar in DeepSeek-V3's own format, so even the tiny default model returns calls
whose arguments validate with jsonschema against the function's schema), streamed tool-call deltas
reassembled equal to the non-streamed call, parallel calls, auto, a follow-up turn with the tool
results, reasoning_content split from <think>…</think> (an R1-template copy of the default model)
streamed and not, bad tools refused by name, and the forced call through the router and an
mpirun group."""
import json
import os
import shutil
from typing import Literal

import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import TMP, Server, calls_begin

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                   "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
# Tokens for a forced call: enough that the grammar, not the budget, ends it. Between JSON tokens
# the grammar allows up to a newline and 40 spaces (structured/json_lexical.h), and a greedy tiny
# model can take that at every gap: on Zen 3's AVX2 products it wrote `{"a":92` and then spaces
# until a 300-token budget ran out. One call of either schema spells at most ~450 characters, so
# this bounds a single call; where parallel calls are allowed it only leaves room for several.
BUDGET = 1000
CHAT = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 40?"}]


@pytest.fixture(scope="module")
def tools_client(tool_server):
    return OpenAI(base_url=tool_server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def check_calls(message, names=SCHEMAS):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function"
        assert call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_tool_calls_validate(tools_client):
    out = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=BUDGET,
        temperature=0.8, seed=1, n=3)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        assert choice.message.content is None
        check_calls(choice.message)


def test_named_tool_call_validates(tools_client):
    out = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=BUDGET, temperature=0.8, seed=2,
        n=2, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "add"}})
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        assert len(choice.message.tool_calls) == 1
        check_calls(choice.message, names={"add"})


def reassemble(stream):
    calls, content, finish, first = {}, "", None, {}
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                if d.index not in calls:
                    # vLLM's shape: the call's first delta has its id, type and name.
                    assert d.id and d.id.startswith("call_") and d.type == "function", d
                    assert d.function.name, d
                    calls[d.index] = {"name": d.function.name, "arguments": ""}
                    first[d.index] = d.id
                else:
                    assert d.id is None and not d.function.name, d
                calls[d.index]["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], content, finish


def answer_of(out, stream):
    """(calls as {name, arguments}, content, finish_reason) of a one-choice answer, whole or
    streamed."""
    if stream:
        return reassemble(out)
    choice = out.choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments}
             for c in choice.message.tool_calls or []]
    return calls, choice.message.content, choice.finish_reason


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_streamed_deltas_equal_the_whole_call(tools_client, choice):
    args = dict(model="sy-test", messages=CHAT, tools=TOOLS, tool_choice=choice, max_tokens=BUDGET,
                temperature=0)
    whole = tools_client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls"
    check_calls(whole.message)
    calls, content, finish = reassemble(tools_client.chat.completions.create(**args, stream=True))
    assert finish == "tool_calls"
    assert content == ""
    assert calls == [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in whole.message.tool_calls]


def test_parallel_calls(tools_client):
    out = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=400,
        temperature=1.0, seed=7, n=8)
    counts = []
    for choice in out.choices:
        if choice.finish_reason == "tool_calls":
            check_calls(choice.message)
            counts.append(len(choice.message.tool_calls))
    assert counts and max(counts) >= 2, counts  # the grammar lets the model call several
    single = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=400,
        temperature=1.0, seed=7, n=8, parallel_tool_calls=False)
    for choice in single.choices:
        if choice.finish_reason == "tool_calls":
            assert len(choice.message.tool_calls) == 1


def test_auto_leaves_the_model_free(tools_client):
    args = dict(model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=40, temperature=0)
    whole = tools_client.chat.completions.create(**args).choices[0]
    # The tiny model writes prose: content, no calls; the same text streamed.
    assert whole.finish_reason in ("stop", "length")
    assert not whole.message.tool_calls
    calls, content, finish = reassemble(tools_client.chat.completions.create(**args, stream=True))
    assert calls == [] and content == whole.message.content and finish == whole.finish_reason


def test_tool_results_in_a_follow_up_turn(tools_client):
    first = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=BUDGET,
        temperature=0).choices[0].message
    check_calls(first)
    messages = CHAT + [first.model_dump(exclude_none=True)]
    for call in first.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": json.dumps({"result": "sunny, 21 C"})})
    for choice in ("none", "auto"):
        out = tools_client.chat.completions.create(
            model="sy-test", messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=20,
            temperature=0)
        assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert out.usage.prompt_tokens > 0
    # And a forced call again after the results (one: free to, the tiny model calls on and on
    # until max_tokens after some prompts).
    again = tools_client.chat.completions.create(
        model="sy-test", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=BUDGET,
        temperature=0, parallel_tool_calls=False).choices[0]
    assert again.finish_reason == "tool_calls"
    check_calls(again.message)


@pytest.mark.parametrize("body,param,words", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "not among the tools"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"minLength": 3}}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "'not'"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name", "characters"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type", "function"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"x": {"not": {"minLength": 3}}}}}}},
     "response_format", "'not'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
])
def test_bad_tools_are_refused_by_name(tool_server, tools_client, body, param, words):
    got, error, _ = tool_server.request(
        "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, **body})
    assert got == 400, error
    assert error["error"]["param"] == param, error
    assert words in error["error"]["message"], error
    # The server keeps serving. ignore_eos: a sampled tiny model may end before its budget.
    out = tools_client.chat.completions.create(model="sy-test", messages=CHAT, max_tokens=3,
                                               extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 3


FORCED_WEATHER = dict(model="sy-test", messages=CHAT, tools=TOOLS, temperature=0,
                      parallel_tool_calls=False,
                      tool_choice={"type": "function", "function": {"name": "get_weather"}})


def cut_in_the_arguments(tools_client, args):
    """(max_tokens, the arguments written by then) for a budget that cuts the greedy call a few
    characters into its arguments: found from the whole call's tokens, since how the forced
    header is spelled in tokens is the model's choice."""
    full = tools_client.chat.completions.create(**args, max_tokens=BUDGET,
                                                logprobs=True).choices[0]
    assert full.finish_reason == "tool_calls", full.message
    text = ""
    for k, entry in enumerate(full.logprobs.content):
        text += entry.token
        if "```json\n" in text and len(text.split("```json\n", 1)[1]) >= 3:
            arguments = text.split("```json\n", 1)[1]
            assert full.message.tool_calls[0].function.arguments.startswith(arguments)
            return k + 1, arguments
    raise AssertionError(text)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_its_budget(tools_client, stream):
    """max_tokens ending inside a call: the call with the arguments written so far and
    finish_reason "length" (OpenAI's shape), streamed and whole alike; ending inside the call's
    header: no call and no content (the format's raw tokens are no answer)."""
    args = FORCED_WEATHER
    budget, arguments = cut_in_the_arguments(tools_client, args)
    for max_tokens, expected in ((budget, [{"name": "get_weather", "arguments": arguments}]),
                                 (3, [])):
        out = tools_client.chat.completions.create(**args, max_tokens=max_tokens, stream=stream)
        calls, content, finish = answer_of(out, stream)
        assert finish == "length" and not content, out
        assert calls == expected


def test_a_function_call_cut_by_its_budget_is_incomplete(tools_client):
    args = FORCED_WEATHER
    budget, arguments = cut_in_the_arguments(tools_client, args)
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    ask = dict(model="sy-test", input=CHAT, tools=flat, temperature=0, parallel_tool_calls=False,
               tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=budget)
    whole = tools_client.responses.create(**ask)
    assert whole.status == "incomplete"
    assert [(o.type, o.name, o.arguments, o.status) for o in whole.output] == [
        ("function_call", "get_weather", arguments, "incomplete")]
    events = list(tools_client.responses.create(**ask, stream=True))
    assert events[-1].type == "response.incomplete"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(o.type, o.arguments, o.status) for o in done] == [
        ("function_call", arguments, "incomplete")]


FORECAST = {"type": "object",
            "properties": {"sky": {"enum": ["sunny", "rainy"]}, "warm": {"type": "boolean"}},
            "required": ["sky", "warm"], "additionalProperties": False}
AS_FORECAST = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": FORECAST}}


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_a_forced_call_takes_precedence_over_the_answer_format(tools_client, choice):
    """Agent frameworks send a typed final output (response_format) with tool_choice "required"
    on the turns that must call: the call's grammar applies (vLLM's precedence), the same call as
    without the format."""
    args = dict(model="sy-test", messages=CHAT, tools=TOOLS, tool_choice=choice,
                max_tokens=BUDGET, temperature=0, parallel_tool_calls=False)
    plain = tools_client.chat.completions.create(**args).choices[0]
    typed = tools_client.chat.completions.create(**args, response_format=AS_FORECAST).choices[0]
    assert typed.finish_reason == "tool_calls" and typed.message.content is None
    check_calls(typed.message)
    assert [(c.function.name, c.function.arguments) for c in typed.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in plain.message.tool_calls]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_with_a_json_answer_format_may_call_or_answer(tool_server, tools_client, stream):
    """tool_choice "auto" and a JSON answer format: one grammar, the answer's JSON or calls. A
    bias on the calls' first token decides which (the tiny model's own choice differs with the
    CPU's rounding): toward it, a call whose arguments follow its schema; against it, JSON that
    the answer's schema validates. A format over the whole output (vLLM's) allows no call."""
    begin = calls_begin(tool_server)
    for fmt in (AS_FORECAST, {"type": "json_object"}):
        args = dict(model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=BUDGET,
                    temperature=0, parallel_tool_calls=False, response_format=fmt)
        for bias in (100, -100):
            out = tools_client.chat.completions.create(**args, logit_bias={str(begin): bias},
                                                       stream=stream)
            calls, content, finish = answer_of(out, stream)
            if bias > 0:
                assert finish == "tool_calls" and not content and len(calls) == 1, (fmt, out)
                jsonschema.validate(json.loads(calls[0]["arguments"]),
                                    SCHEMAS[calls[0]["name"]])
            elif fmt is AS_FORECAST:
                assert finish == "stop" and calls == [], (fmt, out)
                jsonschema.validate(json.loads(content), FORECAST)
            else:  # any object: the tiny model may go on until the budget
                assert calls == [] and content.lstrip().startswith("{"), (fmt, out)


def test_parse_with_pydantic_function_tools(tool_server, tools_client):
    """The openai client's parse() with strict tools made from Pydantic models: parsed_arguments,
    whole and through the stream helper; and a Pydantic answer format beside them."""
    class Weather(BaseModel):
        city: Literal["Paris", "Rome"]
        unit: Literal["celsius", "fahrenheit"]

    class Sky(BaseModel):
        sky: Literal["sunny", "rainy"]
        warm: bool

    args = dict(model="sy-test", messages=CHAT, tools=[openai.pydantic_function_tool(Weather)],
                tool_choice="required", max_tokens=BUDGET, temperature=0,
                parallel_tool_calls=False)
    (call,) = tools_client.chat.completions.parse(**args).choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather)
    with tools_client.chat.completions.stream(**args) as stream:
        for _ in stream:
            pass
        (streamed,) = stream.get_final_completion().choices[0].message.tool_calls
    assert streamed.function.parsed_arguments == call.function.parsed_arguments
    answer = tools_client.chat.completions.parse(
        **{**args, "tool_choice": "auto"}, response_format=Sky,
        logit_bias={str(calls_begin(tool_server)): -100}).choices[0]
    assert isinstance(answer.message.parsed, Sky) and not answer.message.tool_calls


def test_auto_with_other_answer_formats_answers_in_them(tool_server, tools_client):
    """A regex or a choice has no place beside calls: it shapes the whole answer, as before."""
    begin = calls_begin(tool_server)
    out = tools_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=20, temperature=0,
        logit_bias={str(begin): 100}, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert out.choices[0].message.content in ("yes", "no")
    assert not out.choices[0].message.tool_calls


def test_auto_needs_the_flag(server, client):
    """Without --enable-auto-tool-choice (as vLLM): tools with the default choice "auto" are a 400
    that says so; required still works."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=5)
    assert "--enable-auto-tool-choice" in str(e.value)
    out = client.chat.completions.create(model="sy-test", messages=CHAT, tools=TOOLS,
                                         tool_choice="required", max_tokens=BUDGET, temperature=0)
    assert out.choices[0].finish_reason == "tool_calls"
    check_calls(out.choices[0].message)


# ---- reasoning ----

def with_template(model_dir, stem):
    """The default model with another DeepSeek chat template (tests/fixtures/tokenizer/templates)."""
    path = os.path.join(TMP, "model-" + stem)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "tokenizer_config.json" and not os.path.exists(os.path.join(path, name)):
            os.symlink(os.path.join(model_dir, name), os.path.join(path, name))
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(REPO, "tests", "fixtures", "tokenizer", "templates",
                           stem + ".jinja")) as f:
        config["chat_template"] = f.read()
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return path


@pytest.fixture(scope="module")
def r1_client(model_dir):
    """R1's template: its generation prompt opens the think block, so the output starts inside
    the reasoning."""
    s = Server(with_template(model_dir, "deepseek-r1"), "--kv-cache-tokens", "16384",
               "--reasoning-parser", "deepseek_r1", "--reasoning-effort-budgets", "low=4")
    yield OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
    assert s.stop() == 0, "".join(s.log)


THINK_END = 6  # "</think>" in the default tokenizer


def stream_reasoning(stream):
    reasoning, content, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return reasoning, content, finish


def test_reasoning_content_streamed_equals_whole(r1_client):
    # A bias on "</think>" makes the tiny model close its thinking after a few tokens.
    args = dict(model="sy-test", messages=CHAT, max_tokens=40, temperature=0,
                logit_bias={str(THINK_END): 3})
    whole = r1_client.chat.completions.create(**args).choices[0]
    reasoning = whole.message.model_extra.get("reasoning_content")
    assert reasoning is not None and whole.message.content is not None, whole.message
    assert "</think>" not in reasoning
    assert stream_reasoning(r1_client.chat.completions.create(**args, stream=True)) == (
        reasoning, whole.message.content, whole.finish_reason)
    # Without the bias it never closes: all reasoning, as vLLM's deepseek_r1 parser says.
    plain = r1_client.chat.completions.create(model="sy-test", messages=CHAT, max_tokens=20,
                                              temperature=0).choices[0]
    assert plain.message.content is None and plain.message.model_extra["reasoning_content"]


def test_thinking_token_budget_closes_the_reasoning(r1_client):
    """vLLM's thinking_token_budget: the tiny model never closes its thinking unaided; with a
    budget the engine writes "</think>" after that many reasoning tokens and the answer follows,
    the reasoning being the unbudgeted output's first tokens. Streamed as whole; 0 answers at
    once; bad budgets are refused by name."""
    args = dict(model="sy-test", messages=CHAT, max_tokens=16, temperature=0, logprobs=True)
    free = r1_client.chat.completions.create(**args).choices[0]
    assert free.message.content is None
    budget = r1_client.chat.completions.create(
        **args, extra_body={"thinking_token_budget": 5}).choices[0]
    tokens = [t.token for t in budget.logprobs.content]
    assert tokens[5] == "</think>" and tokens.count("</think>") == 1, tokens
    assert tokens[:5] == [t.token for t in free.logprobs.content[:5]]
    assert budget.message.model_extra["reasoning_content"] == "".join(tokens[:5])
    assert budget.message.content == "".join(tokens[6:]) and budget.finish_reason == "length"
    del args["logprobs"]
    streamed = stream_reasoning(r1_client.chat.completions.create(
        **args, stream=True, extra_body={"thinking_token_budget": 5}))
    assert streamed == (budget.message.model_extra["reasoning_content"], budget.message.content,
                        "length")
    at_once = r1_client.chat.completions.create(
        **args, extra_body={"thinking_token_budget": 0}).choices[0]
    assert not at_once.message.model_extra.get("reasoning_content") and at_once.message.content
    unlimited = r1_client.chat.completions.create(
        **args, extra_body={"thinking_token_budget": -1}).choices[0]
    assert unlimited.message.content is None
    for bad in (-2, 1.5, "5"):
        with pytest.raises(openai.BadRequestError) as info:
            r1_client.chat.completions.create(**args, extra_body={"thinking_token_budget": bad})
        assert "thinking_token_budget" in str(info.value), info.value


def test_reasoning_effort_is_a_thinking_budget(r1_client):
    """reasoning_effort as the level's budget (--reasoning-effort-budgets low=4 here): low thinks
    for 4 tokens, as thinking_token_budget 4 does; none answers at once; high (unbounded by
    default) never closes; an explicit thinking_token_budget rules; unknown levels are refused."""
    args = dict(model="sy-test", messages=CHAT, max_tokens=16, temperature=0)
    low = r1_client.chat.completions.create(**args, reasoning_effort="low").choices[0].message
    four = r1_client.chat.completions.create(
        **args, extra_body={"thinking_token_budget": 4}).choices[0].message
    assert low.model_extra["reasoning_content"] and low.content, low
    assert (low.model_extra["reasoning_content"], low.content) == (
        four.model_extra["reasoning_content"], four.content)
    none = r1_client.chat.completions.create(**args, reasoning_effort="none").choices[0].message
    assert not none.model_extra.get("reasoning_content") and none.content, none
    high = r1_client.chat.completions.create(**args, reasoning_effort="high").choices[0].message
    assert high.content is None, high
    ruled = r1_client.chat.completions.create(
        **args, reasoning_effort="none", extra_body={"thinking_token_budget": -1}).choices[0]
    assert ruled.message.content is None, ruled.message
    with pytest.raises(openai.BadRequestError) as info:
        r1_client.chat.completions.create(**args, extra_body={"reasoning_effort": "extreme"})
    assert "reasoning_effort" in str(info.value) and "low" in str(info.value), info.value


def test_structured_output_constrains_only_the_answer(r1_client):
    """With the reasoning parser, the grammar applies after </think>: the reasoning is free text,
    the content validates."""
    out = r1_client.chat.completions.create(
        model="sy-test", messages=CHAT, max_tokens=300, temperature=0,
        logit_bias={str(THINK_END): 3},
        response_format={"type": "json_schema", "json_schema": {"name": "add", "schema": ADD}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message
    assert choice.message.model_extra["reasoning_content"]
    jsonschema.validate(json.loads(choice.message.content), ADD)
    forced = r1_client.chat.completions.create(
        model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=BUDGET, temperature=0,
        logit_bias={str(THINK_END): 3},
        tool_choice={"type": "function", "function": {"name": "add"}}).choices[0]
    assert forced.finish_reason == "tool_calls", forced.message
    assert forced.message.model_extra["reasoning_content"]
    check_calls(forced.message, names={"add"})


def test_deepseek_v31_calls_and_thinking(model_dir):
    """V3.1's template: tool calls forced in its own format (the parser picked from the
    template), and its thinking mode (chat_template_kwargs) split by the deepseek_v3 reasoning
    parser; without thinking, the output is all content."""
    s = Server(with_template(model_dir, "deepseek-v3.1"), "--kv-cache-tokens", "16384",
               "--reasoning-parser", "deepseek_v3")
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        args = dict(model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required",
                    max_tokens=BUDGET, temperature=0, parallel_tool_calls=False)
        whole = c.chat.completions.create(**args).choices[0]
        assert whole.finish_reason == "tool_calls", whole.message
        check_calls(whole.message)
        calls, _, finish = reassemble(c.chat.completions.create(**args, stream=True))
        assert finish == "tool_calls"
        assert calls == [{"name": t.function.name, "arguments": t.function.arguments}
                         for t in whole.message.tool_calls]
        think = dict(model="sy-test", messages=CHAT, max_tokens=40, temperature=0,
                     logit_bias={str(THINK_END): 3},
                     extra_body={"chat_template_kwargs": {"thinking": True}})
        thought = c.chat.completions.create(**think).choices[0]
        assert thought.message.model_extra["reasoning_content"], thought.message
        assert stream_reasoning(c.chat.completions.create(**think, stream=True)) == (
            thought.message.model_extra["reasoning_content"], thought.message.content or "",
            thought.finish_reason)
        plain = c.chat.completions.create(model="sy-test", messages=CHAT, max_tokens=20,
                                          temperature=0).choices[0]
        assert plain.message.model_extra["reasoning_content"] is None and plain.message.content
    finally:
        assert s.stop() == 0, "".join(s.log)


# ---- through the router and an mpirun group ----

def test_forced_call_through_the_router():
    from test_route import Process, free_port, start_instance
    port = free_port()
    instance = start_instance(port)
    router = Process("route", "--engines", f"127.0.0.1:{port}", "--port", "0",
                     "--served-model-name", "sy-test", "--enable-auto-tool-choice")
    try:
        args = dict(model="sy-test", messages=CHAT, tools=TOOLS, tool_choice="required",
                    max_tokens=BUDGET, temperature=0, parallel_tool_calls=False)
        got = []
        for process in (router, instance):
            c = OpenAI(base_url=process.url + "/v1", api_key="x", max_retries=0, timeout=300)
            choice = c.chat.completions.create(**args).choices[0]
            assert choice.finish_reason == "tool_calls"
            check_calls(choice.message)
            got.append([(t.function.name, t.function.arguments) for t in choice.message.tool_calls])
        assert got[0] == got[1]
        calls, _, finish = reassemble(
            OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0,
                   timeout=300).chat.completions.create(**args, stream=True))
        assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in calls] == got[0]
    finally:
        router.stop()
        instance.stop()


def test_forced_call_in_an_mpirun_group(model_dir):
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    s = Server(model_dir, "--kv-cache-tokens", "8192", ranks=2, threads=1)
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        choice = c.chat.completions.create(
            model="sy-test", messages=CHAT, tools=TOOLS, max_tokens=BUDGET, temperature=0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message, names={"get_weather"})
    finally:
        assert s.stop() in (0, 1)


# ---- the tools in the prompt, tool_choice none, /tokenize, reasoning tokens ----

# Keys deliberately out of sorted order: the prompt keeps the client's order, as vLLM's does.
UNSORTED = {"type": "function", "function": {"parameters": {
    "type": "object", "required": ["zone"], "properties": {"zone": {"type": "string"},
                                                           "at": {"type": "integer"}}},
    "name": "clock"}}


def prompt_tokens(client, **extra):
    return client.chat.completions.create(model="sy-test", messages=CHAT, max_tokens=1,
                                          **extra).usage.prompt_tokens


def tokenize(server, **body):
    status, out, _ = server.request("POST", "/tokenize", {"messages": CHAT, **body})
    assert status == 200, out
    return out["tokens"]


def test_tools_render_in_the_clients_key_order(tool_server):
    """Each tool as vLLM hands it to the template (pydantic's model_dump: type, function with
    name, description — null when absent — and parameters), the schema in the client's order,
    written as transformers' tojson writes it."""
    ids = tokenize(tool_server, tools=[UNSORTED])
    status, text, _ = tool_server.request("POST", "/detokenize", {"tokens": ids})
    assert status == 200, text
    vllm = {"type": "function", "function": {"name": "clock", "description": None,
                                             "parameters": UNSORTED["function"]["parameters"]}}
    assert json.dumps(vllm, ensure_ascii=False) in text["prompt"], text["prompt"]


def test_tokenize_takes_tools(tool_server, tools_client):
    """/tokenize with the chat fields gives the ids whose count the chat request reports."""
    for tools in (TOOLS, [UNSORTED], None):
        extra = {"tools": tools, "tool_choice": "required"} if tools else {}
        body = {"tools": tools} if tools else {}
        assert len(tokenize(tool_server, **body)) == prompt_tokens(tools_client, **extra)
    thinking = {"chat_template_kwargs": {"thinking": True}, "add_generation_prompt": False}
    assert len(tokenize(tool_server, tools=TOOLS, **thinking)) == prompt_tokens(
        tools_client, tools=TOOLS, tool_choice="none", extra_body=thinking)
    status, error, _ = tool_server.request(
        "POST", "/tokenize", {"messages": CHAT, "tools": [{"type": "function"}]})
    assert status == 400 and error["error"]["param"] == "tools[0].function", error


def test_tool_choice_none_renders_the_tools_by_default(tools_client):
    plain = prompt_tokens(tools_client)
    none = prompt_tokens(tools_client, tools=TOOLS, tool_choice="none")
    assert none == prompt_tokens(tools_client, tools=TOOLS, tool_choice="required") > plain


def test_exclude_tools_when_tool_choice_none(model_dir):
    s = Server(model_dir, "--kv-cache-tokens", "8192", "--exclude-tools-when-tool-choice-none")
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        plain = prompt_tokens(c)
        out = c.chat.completions.create(model="sy-test", messages=CHAT, tools=TOOLS,
                                        tool_choice="none", max_tokens=5)
        assert out.usage.prompt_tokens == plain
        assert out.choices[0].message.tool_calls is None
        assert prompt_tokens(c, tools=TOOLS, tool_choice="required") > plain
    finally:
        assert s.stop() == 0, "".join(s.log)


def reasoning_tokens_of(entries):
    """vLLM's count: the tokens before "</think>" (all of them when it never comes)."""
    tokens = [e.token for e in entries]
    return tokens.index("</think>") if "</think>" in tokens else len(tokens)


def test_reasoning_tokens_in_usage(r1_client, tools_client):
    for bias in ({str(THINK_END): 3}, None):
        args = dict(model="sy-test", messages=CHAT, max_tokens=30, temperature=0,
                    logit_bias=bias, logprobs=True)
        out = r1_client.chat.completions.create(**args)
        expected = reasoning_tokens_of(out.choices[0].logprobs.content)
        assert 0 < expected <= out.usage.completion_tokens
        assert out.usage.completion_tokens_details.reasoning_tokens == expected
        if bias:
            assert expected < out.usage.completion_tokens and out.choices[0].message.content
        last = list(r1_client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}))[-1]
        assert last.usage.completion_tokens_details.reasoning_tokens == expected
    # Without a reasoning parser there is nothing to count, and vLLM leaves the field out.
    plain = tools_client.chat.completions.create(model="sy-test", messages=CHAT, max_tokens=3)
    assert plain.usage.completion_tokens_details is None
