"""Anthropic's Messages API through the official anthropic client (pinned in requirements.txt):
a message whole and streamed, and the same text as the chat request it amounts to (sent through
the openai client); a prefill continued; stop sequences and max_tokens as stop reasons; a forced
tool call, streamed and not, and the tool loop (tool_use and tool_result blocks give the prompt the chat messages
give); structured output with messages.parse; count_tokens and the prefix cache in usage;
thinking blocks from a reasoning parser; message threads (the SDK's tool runner threads its
turns: the same replies as unthreaded; a reply continued once; the errors clients act on, and
the fallback where the server keeps no state); refusals in Anthropic's error shape, the x-api-key
header. The router's front runs the same code (test_route.py sends a message through it)."""
import json
from typing import Literal

import anthropic
from anthropic import beta_tool
import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import Server

GREEDY = {"temperature": 0}  # not in the SDK's signature any more: sent as an extra field
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                                  "description": "Weather in a city",
                                                  "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(tool_server):
    return anthropic.Anthropic(base_url=tool_server.url, api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def chat(tool_server):
    return OpenAI(base_url=tool_server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_the_model_list_in_anthropics_shape(claude):
    page = claude.models.list()
    assert [m.id for m in page.data] == ["sy-test"] and page.has_more is False
    model = claude.models.retrieve("sy-test")
    assert model.type == "model" and model.display_name == "sy-test"
    assert model.created_at is not None and model.max_input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("claude-opus")


def test_a_message_whole_and_streamed_is_the_chat_answer(claude, chat):
    args = dict(model="sy-test", max_tokens=12, system="You are terse.",
                messages=[{"role": "user", "content": [{"type": "text", "text": "Who art"},
                                                       {"type": "text", "text": "thou?"}]}],
                extra_body=GREEDY)
    whole = claude.messages.create(**args)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "sy-test"
    assert whole.id.startswith("msg_")
    assert [b.type for b in whole.content] == ["text"]
    assert whole.stop_reason == "max_tokens" and whole.stop_sequence is None
    assert whole.usage.output_tokens == 12
    with claude.messages.stream(**args) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text_of(whole) == text_of(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == 12
    # The chat request it amounts to: the system prompt, the text blocks joined by a newline.
    same = chat.chat.completions.create(
        model="sy-test", max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Who art\nthou?"}])
    assert same.choices[0].message.content == text_of(whole)
    usage = whole.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == same.usage.prompt_tokens
    assert claude.messages.count_tokens(
        model="sy-test", system="You are terse.", messages=args["messages"]
    ).input_tokens == same.usage.prompt_tokens


def test_stop_sequences_and_the_prefix_cache(claude):
    long_prompt = [{"role": "user", "content": "Tell me of the king and his court. " * 12}]
    first = claude.messages.create(model="sy-test", max_tokens=16, messages=long_prompt,
                                   extra_body=GREEDY)
    again = claude.messages.create(model="sy-test", max_tokens=16, messages=long_prompt,
                                   extra_body=GREEDY)
    # The second reads its prompt's full pages from the cache, and says so; the text is the same.
    assert again.usage.cache_read_input_tokens > 0
    assert (again.usage.input_tokens + again.usage.cache_read_input_tokens ==
            first.usage.input_tokens + first.usage.cache_read_input_tokens)
    assert text_of(again) == text_of(first)
    # A stop sequence from the middle of that answer ends it there, and is named.
    text = text_of(first)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    cut = claude.messages.create(model="sy-test", max_tokens=16, messages=long_prompt,
                                 stop_sequences=[stop], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text.startswith(text_of(cut)) and stop not in text_of(cut)
    with claude.messages.stream(model="sy-test", max_tokens=16, messages=long_prompt,
                                stop_sequences=[stop], extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == (
        "stop_sequence", stop, text_of(cut))


def tool_uses(message):
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def test_forced_tool_use_streamed_and_not_and_the_tool_loop(claude, chat):
    args = dict(model="sy-test", max_tokens=400, messages=ASK, tools=TOOLS,
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                extra_body=GREEDY)
    whole = claude.messages.create(**args)
    assert whole.stop_reason == "tool_use", whole
    calls = tool_uses(whole)
    assert len(calls) == 1 and calls[0][0] == "get_weather"
    jsonschema.validate(calls[0][1], WEATHER)
    with claude.messages.stream(**args) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert tool_uses(final) == calls and final.stop_reason == "tool_use"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "input_json" in events  # the SDK's event for each input_json_delta
    # Named: the call is that tool's.
    named = claude.messages.create(**{**args, "tool_choice": {"type": "tool",
                                                              "name": "get_weather"}})
    assert [name for name, _ in tool_uses(named)] == ["get_weather"]
    # The loop: the call and its result sent back give the prompt of the chat messages they
    # amount to, and so the same answer.
    use = next(b for b in whole.content if b.type == "tool_use")
    follow = claude.messages.create(
        model="sy-test", max_tokens=10, tools=TOOLS, extra_body=GREEDY,
        messages=ASK + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in whole.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "Sunny, 21 C"}]}])
    assert follow.stop_reason in ("max_tokens", "end_turn", "tool_use")
    same = chat.chat.completions.create(
        model="sy-test", max_tokens=10, temperature=0, tools=OPENAI_TOOLS,
        messages=ASK + [
            {"role": "assistant", "content": text_of(whole) or None,
             "tool_calls": [{"id": use.id, "type": "function",
                             "function": {"name": use.name,
                                          "arguments": json.dumps(use.input,
                                                                  separators=(",", ":"))}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"}])
    assert same.usage.prompt_tokens == (follow.usage.input_tokens +
                                        follow.usage.cache_read_input_tokens)
    message = same.choices[0].message
    assert text_of(follow) == (message.content or "")
    assert [(n, json.dumps(i, separators=(",", ":"))) for n, i in tool_uses(follow)] == [
        (t.function.name, t.function.arguments) for t in message.tool_calls or []]


def test_a_prefill_is_continued(claude, chat):
    """A final assistant message is continued (the chat path's continue_final_message): the
    answer is the rest of it, the same as chat's."""
    prefilled = ASK + [{"role": "assistant", "content": "The weather in Paris is"}]
    out = claude.messages.create(model="sy-test", max_tokens=8, messages=prefilled,
                                 extra_body=GREEDY)
    same = chat.chat.completions.create(
        model="sy-test", max_tokens=8, temperature=0, messages=prefilled,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert text_of(out) == same.choices[0].message.content
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == same.usage.prompt_tokens
    # Not the answer to the question asked afresh.
    fresh = claude.messages.create(model="sy-test", max_tokens=8, messages=ASK,
                                   extra_body=GREEDY)
    assert (fresh.usage.input_tokens + fresh.usage.cache_read_input_tokens <
            same.usage.prompt_tokens)


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo"]
    sky: Literal["sunny", "rainy"]


def test_structured_output_with_parse(claude, tool_server):
    out = claude.messages.parse(model="sy-test", max_tokens=200, messages=ASK,
                                output_format=Forecast, extra_body=GREEDY)
    assert out.stop_reason == "end_turn", out
    assert isinstance(out.parsed_output, Forecast)
    # Beside tools, under auto, the model may answer or call (the Messages API has no logit bias
    # to decide it): the answer keeps its schema, a call the tool's.
    either = claude.messages.create(
        model="sy-test", max_tokens=200, messages=ASK, tools=TOOLS,
        output_config={"format": {"type": "json_schema",
                                   "schema": Forecast.model_json_schema()}},
        extra_body=GREEDY)
    assert either.stop_reason in ("end_turn", "tool_use"), either
    if either.stop_reason == "end_turn":
        Forecast.model_validate_json(text_of(either))
    else:
        jsonschema.validate(tool_uses(either)[0][1], WEATHER)


def test_refusals_in_anthropics_shape_and_the_server_goes_on(claude, tool_server):
    def refused(exc, **kwargs):
        with pytest.raises(exc) as info:
            claude.messages.create(**{"model": "sy-test", "max_tokens": 4, "messages": ASK,
                                      **kwargs})
        assert info.value.body["type"] == "error", info.value.body
        return info.value.body["error"]
    image = refused(anthropic.BadRequestError, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}])
    assert image["type"] == "invalid_request_error"
    assert image["message"].startswith("messages[0].content[0].type:")
    prefill = refused(anthropic.BadRequestError, messages=ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather",
                                           "input": {}}]}])
    assert "prefill" in prefill["message"]
    assert refused(anthropic.BadRequestError,
                   tools=[{"type": "web_search_20250305", "name": "web_search"}]
                   )["message"].startswith("tools[0].type:")
    assert refused(anthropic.BadRequestError,
                   output_config={"effort": "extreme"})["message"].startswith("output_config.effort")
    assert refused(anthropic.BadRequestError, max_tokens=0)["message"].startswith("max_tokens")
    assert refused(anthropic.NotFoundError, model="claude-opus")["type"] == "not_found_error"
    # The HTTP server's own errors on this path take the same shape.
    status, body, _ = tool_server.request("GET", "/v1/messages")
    assert status == 405 and body["type"] == "error", body
    status, body, _ = tool_server.request("POST", "/v1/messages", raw=b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    assert claude.messages.create(model="sy-test", max_tokens=2, messages=ASK).usage.output_tokens


def test_the_api_key_as_anthropics_clients_send_it(model_dir):
    s = Server(model_dir, "--api-key", "sekrit", "--kv-cache-tokens", "4096")
    try:
        with pytest.raises(anthropic.AuthenticationError) as info:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="sy-test", max_tokens=2, messages=ASK)
        assert info.value.body["error"]["type"] == "authentication_error"
        # This SDK sends the key as "Authorization: Bearer"; Anthropic's API, Claude Code and
        # older SDKs send "x-api-key".
        good = anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0)
        assert good.messages.create(model="sy-test", max_tokens=2, messages=ASK).usage
        header = anthropic.Anthropic(base_url=s.url, api_key=None, max_retries=0,
                                     default_headers={"x-api-key": "sekrit"})
        assert header.messages.count_tokens(model="sy-test", messages=ASK).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key=None, max_retries=0,
                                default_headers={"x-api-key": "wrong"}).messages.create(
                model="sy-test", max_tokens=2, messages=ASK)
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_thinking_blocks_from_the_reasoning_parser(model_dir):
    """R1's template opens the think block: with the deepseek_r1 parser the output is thinking
    until </think> (never, for the tiny model in a few tokens), streamed as thinking deltas and
    signed."""
    from test_tool_calling import with_template
    s = Server(with_template(model_dir, "deepseek-r1"), "--kv-cache-tokens", "8192",
               "--reasoning-parser", "deepseek_r1")
    try:
        c = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=300)
        args = dict(model="sy-test", max_tokens=30, messages=ASK, extra_body=GREEDY)
        whole = c.messages.create(**args)
        assert [b.type for b in whole.content] == ["thinking"], whole
        assert whole.content[0].thinking and whole.content[0].signature
        with c.messages.stream(**args) as stream:
            thinking = "".join(e.thinking for e in stream if e.type == "thinking")
            final = stream.get_final_message()
        assert thinking == whole.content[0].thinking == final.content[0].thinking
        assert final.content[0].signature
        # Extended thinking as Anthropic checks it: a budget of at least 1024, below max_tokens.
        thinking = {"type": "enabled", "budget_tokens": 1024}
        with pytest.raises(anthropic.BadRequestError) as info:
            c.messages.create(**{**args, "max_tokens": 1000, "thinking": thinking})
        assert "budget_tokens" in info.value.body["error"]["message"]
        # budget_tokens is enforced (vLLM's thinking_token_budget): the model, which never closes
        # its thinking unaided, answers after 1024 thinking tokens — where it has not ended its
        # output before (an end-of-sequence token within them, as on some CPUs' arithmetic; the
        # mapping itself is messages_api_test's, the budget the engine tests').
        enabled = c.messages.create(**{**args, "max_tokens": 1030, "thinking": thinking})
        types = [b.type for b in enabled.content]
        if enabled.usage.output_tokens > 1025:
            assert types == ["thinking", "text"], enabled
        else:
            assert types == ["thinking"] and enabled.stop_reason == "end_turn", enabled
    finally:
        assert s.stop() == 0, "".join(s.log)


def weather_runner(client, thread=True):
    """The SDK's tool runner over one forced tool, two turns; the calls the tool got."""
    calls = []

    @beta_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"],
                    unit: Literal["celsius", "fahrenheit"]) -> str:
        """Weather in a city."""
        calls.append((city, unit))
        return f"Sunny in {city}"

    args = dict(model="sy-test", max_tokens=400, tools=[get_weather], messages=ASK,
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                max_iterations=2, extra_body=GREEDY)
    if not thread:
        args["thread"] = False
    replies = list(client.beta.messages.tool_runner(**args))
    return replies, calls


def test_the_sdks_tool_runner_threads_its_turns(claude, tool_server):
    """The tool runner sends `thread` by default: the first turn creates one, the second sends
    only the tool result. Its replies are those of the runner that sends the whole history."""
    stored = tool_server.metric("responses_stored")
    threaded, calls = weather_runner(claude)
    assert tool_server.metric("responses_stored") == stored + 2
    unthreaded, same_calls = weather_runner(claude, thread=False)
    assert len(threaded) == 2 and calls == same_calls and len(calls) == 2
    assert [tool_uses(m) for m in threaded] == [tool_uses(m) for m in unthreaded]
    assert [m.usage.input_tokens + m.usage.cache_read_input_tokens for m in threaded] == [
        m.usage.input_tokens + m.usage.cache_read_input_tokens for m in unthreaded]


def test_thread_rules_and_their_errors(claude):
    create = dict(model="sy-test", max_tokens=400, system="Be brief.", tools=TOOLS,
                  tool_choice={"type": "tool", "name": "get_weather"}, messages=ASK,
                  extra_body=GREEDY)
    first = claude.beta.messages.create(**create, thread={"type": "create"})
    use = next(b for b in first.content if b.type == "tool_use")
    result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "Sunny"}]}]
    follow = dict(model="sy-test", max_tokens=6, messages=result, extra_body=GREEDY)
    second = claude.beta.messages.create(
        **follow, thread={"type": "continue", "previous_message_id": first.id})
    # The same as the conversation sent whole.
    whole = claude.messages.create(
        model="sy-test", max_tokens=6, system="Be brief.", tools=TOOLS, extra_body=GREEDY,
        messages=ASK + [{"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in first.content]}]
        + result)
    assert text_of(second) == text_of(whole) and tool_uses(second) == tool_uses(whole)
    assert (second.usage.input_tokens + second.usage.cache_read_input_tokens ==
            whole.usage.input_tokens + whole.usage.cache_read_input_tokens)
    # A reply is continued once.
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.beta.messages.create(
            **follow, thread={"type": "continue", "previous_message_id": first.id})
    assert info.value.error_code == "thread_already_continued"
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.beta.messages.create(
            **follow, thread={"type": "continue", "previous_message_id": "msg_nowhere"})
    assert info.value.error_code == "thread_not_found"
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.beta.messages.create(
            **follow, system="Be verbose.",
            thread={"type": "continue", "previous_message_id": second.id})
    assert info.value.error_code == "thread_fingerprint_mismatch"
    assert "system" in info.value.body["error"]["message"]
    # That refusal did not use the reply up.
    assert claude.beta.messages.create(
        **follow, thread={"type": "continue", "previous_message_id": second.id}).id


def test_without_a_store_the_tool_runner_goes_on_unthreaded(model_dir):
    s = Server(model_dir, "--responses-store-mb", "0", "--kv-cache-tokens", "8192",
               "--enable-auto-tool-choice")
    try:
        c = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=300)
        with pytest.raises(anthropic.BadRequestError) as info:
            c.beta.messages.create(model="sy-test", max_tokens=2, messages=ASK,
                                   thread={"type": "create"})
        assert info.value.error_code == "thread_unsupported_request"
        replies, calls = weather_runner(c)
        assert len(replies) == 2 and len(calls) == 2
    finally:
        assert s.stop() == 0, "".join(s.log)
