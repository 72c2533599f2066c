"""LangChain's ChatOpenAI (langchain-openai) against the server, on Chat Completions and on the
Responses API: tools bound and called (whole and streamed chunks aggregated), the tool loop with
the call and a ToolMessage sent back, and typed outputs through with_structured_output — as a
json_schema answer, as a forced function call, and as an answer with tools still offered beside
it (the request carries tools, tool_choice auto and the answer's schema)."""
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from conftest import calls_begin


class Forecast(BaseModel):
    """A forecast."""
    sky: Literal["sunny", "rainy"]
    warm: bool


@tool
def get_weather(city: Literal["Paris", "Rome"], unit: Literal["celsius", "fahrenheit"]) -> str:
    """The weather in a city."""
    return f"sunny, 25 degrees {unit}"


def chat_model(server, responses, **extra):
    return ChatOpenAI(model="sy-test", base_url=server.url + "/v1", api_key="x", temperature=0,
                      max_tokens=300, max_retries=0, timeout=300,
                      use_responses_api=responses, **extra)


@pytest.mark.parametrize("responses", [False, True])
def test_bound_tools_are_called_whole_and_streamed(tool_server, responses):
    # strict: additionalProperties false, so the tiny model cannot add keys until its budget.
    llm = chat_model(tool_server, responses).bind_tools(
        [get_weather], tool_choice="get_weather", parallel_tool_calls=False, strict=True)
    whole = llm.invoke("What is the weather in Paris?")
    assert not whole.invalid_tool_calls, whole
    (call,) = whole.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert get_weather.invoke(call["args"]).startswith("sunny")  # the tool's own validation
    chunks = list(llm.stream("What is the weather in Paris?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(call["name"], call["args"])]


@pytest.mark.parametrize("responses", [False, True])
def test_the_tool_loop(tool_server, responses):
    llm = chat_model(tool_server, responses)
    ask = HumanMessage("What is the weather in Rome?")
    first = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False,
                           strict=True).invoke([ask])
    (call,) = first.tool_calls
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = llm.with_structured_output(Forecast).invoke([ask, first, result])
    assert isinstance(answer, Forecast)
    # The history rebuilt by hand, as a client that stored only the parsed call sends it (its
    # arguments re-serialized: another prompt than the model's own spelling).
    again = llm.with_structured_output(Forecast).invoke(
        [ask, AIMessage("", tool_calls=[call]), result])
    assert isinstance(again, Forecast)


@pytest.mark.parametrize("responses", [False, True])
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_typed_outputs(tool_server, responses, method):
    llm = chat_model(tool_server, responses)
    # strict: additionalProperties false. Without it the forced call's object stays open, and on
    # some CPUs' rounding the tiny model adds keys until its budget cuts the call.
    out = llm.with_structured_output(Forecast, method=method, strict=True,
                                     include_raw=True).invoke("Will it rain tomorrow?")
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], Forecast)


def test_a_typed_answer_with_tools_beside_it(tool_server):
    """with_structured_output(tools=...): tools (auto) and the answer's schema in one request;
    a bias on the calls' first token decides between them (the tiny model's own choice differs
    with the CPU's rounding)."""
    begin = calls_begin(tool_server)
    for bias, called in ((100, True), (-100, False)):
        llm = chat_model(tool_server, False, logit_bias={begin: bias},
                         model_kwargs={"parallel_tool_calls": False})
        out = llm.with_structured_output(
            Forecast, tools=[get_weather], strict=True, include_raw=True).invoke(
                "Will it rain in Paris?")
        raw = out["raw"]
        if called:
            (call,) = raw.tool_calls
            assert get_weather.invoke(call["args"]).startswith("sunny")
            assert out["parsed"] is None
        else:
            assert not raw.tool_calls
            assert isinstance(out["parsed"], Forecast), out
