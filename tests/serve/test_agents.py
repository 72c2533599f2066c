"""An agent framework against the server: the OpenAI Agents SDK (openai-agents) running agents
on the default model through both of its model classes — the Responses API and Chat
Completions —, streamed and not: a function tool called with arguments its pydantic signature
accepts, the tool's output sent back, a typed final output (output_type) parsed from the answer,
and a handoff from one agent to another. The SDK sends a typed output's schema with every turn,
tool_choice "required" included, and "auto" once a tool has run."""
import asyncio
from typing import Literal

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                    Runner, function_tool, set_tracing_disabled)
from agents.items import HandoffCallItem, MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI
from openai.types.shared import Reasoning
from pydantic import BaseModel

from conftest import calls_begin

# The SDK sends traces to OpenAI's servers by default; there is no network here.
set_tracing_disabled(True)

MODELS = {"responses": OpenAIResponsesModel, "chat": OpenAIChatCompletionsModel}


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]
    warm: bool


def model(server, kind):
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return MODELS[kind](model="sy-test", openai_client=client)


def settings(**extra):
    # One call a turn: a greedy tiny model free to call again repeats calls until its budget.
    return ModelSettings(temperature=0, max_tokens=300, parallel_tool_calls=False, **extra)


def run(agent, question, stream, max_turns=4):
    async def go():
        if not stream:
            return await Runner.run(agent, question, max_turns=max_turns)
        result = Runner.run_streamed(agent, question, max_turns=max_turns)
        events = [event async for event in result.stream_events()]
        assert events, "the stream sent no events"
        return result
    return asyncio.run(go())


def weather_tool(calls, once):
    """get_weather, recording its calls; with `once`, offered only until it has been called (the
    second turn then has only the typed answer to give)."""
    @function_tool(is_enabled=(lambda ctx, agent: not calls) if once else True)
    def get_weather(city: Literal["Paris", "Rome"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The weather in a city."""
        calls.append((city, unit))
        return f"sunny, 25 degrees {unit}"
    return get_weather


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_a_tool_call_then_a_typed_answer(tool_server, kind, stream):
    # A reasoning effort as agents set it for reasoning models (reasoning_effort on chat,
    # reasoning.effort and .summary on Responses): accepted, a thinking budget by level.
    calls = []
    agent = Agent(name="forecaster", instructions="Answer briefly.", model=model(tool_server, kind),
                  tools=[weather_tool(calls, once=True)], output_type=Forecast,
                  model_settings=settings(tool_choice="required",
                                          reasoning=Reasoning(effort="low", summary="auto")))
    result = run(agent, "What is the weather in Paris?", stream)
    assert len(calls) == 1, calls  # the SDK ran the tool with arguments its signature accepts
    assert [type(item) for item in result.new_items] == [
        ToolCallItem, ToolCallOutputItem, MessageOutputItem], result.new_items
    assert result.new_items[1].output.startswith("sunny")  # not the SDK's error text
    assert isinstance(result.final_output, Forecast), result.final_output


def test_turns_chained_on_the_servers_store(tool_server):
    """auto_previous_response_id: the SDK sends each later turn as previous_response_id and only
    the new items (the tool's output), the conversation kept by the server's store."""
    calls = []
    agent = Agent(name="forecaster", instructions="Answer briefly.",
                  model=model(tool_server, "responses"),
                  tools=[weather_tool(calls, once=True)], output_type=Forecast,
                  model_settings=settings(tool_choice="required"))

    async def go():
        return await Runner.run(agent, "What is the weather in Paris?", max_turns=4,
                                auto_previous_response_id=True)
    result = asyncio.run(go())
    assert len(calls) == 1 and isinstance(result.final_output, Forecast), result.new_items
    first, last = result.raw_responses[0].response_id, result.raw_responses[-1].response_id
    status, stored, _ = tool_server.request("GET", f"/v1/responses/{last}")
    assert status == 200 and stored["previous_response_id"] == first, stored


def test_a_conversation_on_the_server_and_a_session_kept_there(tool_server):
    """conversation_id: the SDK sends each turn with the server's conversation, which then holds
    the whole run; OpenAIConversationsSession keeps a session's history in a server-side
    conversation (items listed, added and popped through the Conversations API)."""
    from agents.memory import OpenAIConversationsSession
    calls, session_calls = [], []
    agent = Agent(name="forecaster", instructions="Answer briefly.",
                  model=model(tool_server, "responses"),
                  tools=[weather_tool(calls, once=True)], output_type=Forecast,
                  model_settings=settings(tool_choice="required"))
    remembering = Agent(name="forecaster", instructions="Answer briefly.",
                        model=model(tool_server, "responses"),
                        tools=[weather_tool(session_calls, once=True)], output_type=Forecast,
                        model_settings=settings(tool_choice="required"))

    async def go():
        client = AsyncOpenAI(base_url=tool_server.url + "/v1", api_key="x", max_retries=0,
                             timeout=300)
        conversation = await client.conversations.create()
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4,
                                  conversation_id=conversation.id)
        items = [item async for item in client.conversations.items.list(conversation.id,
                                                                        order="asc")]
        session = OpenAIConversationsSession(openai_client=client)
        await Runner.run(remembering, "What is the weather in Paris?", session=session,
                         max_turns=4)
        kept = await session.get_items()
        popped = await session.pop_item()
        return result, items, kept, popped, await session.get_items()
    result, items, kept, popped, after = asyncio.run(go())
    assert len(calls) == 1 and isinstance(result.final_output, Forecast), result.new_items
    # The question, the call, its output, the answer: each turn's input and output, once.
    assert [item.type for item in items] == [
        "message", "function_call", "function_call_output", "message"], items
    assert items[1].call_id == items[2].call_id
    assert len(session_calls) == 1
    assert kept[0]["role"] == "user" and len(after) == len(kept) - 1
    assert popped == kept[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_tools_stay_offered_beside_the_typed_answer(tool_server, stream):
    """After the forced first call the SDK asks with tool_choice "auto" and the answer's schema:
    the grammar allows both. A bias against the calls' first token (Chat Completions' logit_bias;
    the tiny model's own choice differs with the CPU's rounding) makes it answer."""
    calls = []
    against_calls = {"logit_bias": {str(calls_begin(tool_server)): -100}}
    agent = Agent(name="forecaster", instructions="Answer briefly.",
                  model=model(tool_server, "chat"), tools=[weather_tool(calls, once=False)],
                  output_type=Forecast,
                  model_settings=settings(tool_choice="required", extra_body=against_calls))
    result = run(agent, "What is the weather in Rome?", stream)
    assert len(calls) == 1, calls
    assert isinstance(result.final_output, Forecast), result.final_output


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_a_handoff_to_a_typed_agent(tool_server, kind):
    forecaster = Agent(name="forecaster", instructions="Give the forecast.",
                       model=model(tool_server, kind), output_type=Forecast,
                       model_settings=settings())
    # The handoff is a tool of the triage agent; "required" makes it take it.
    triage = Agent(name="triage", instructions="Hand weather questions over.",
                   model=model(tool_server, kind), handoffs=[forecaster],
                   model_settings=settings(tool_choice="required"))
    result = run(triage, "Will it rain in Paris?", stream=False)
    assert result.last_agent is forecaster
    assert isinstance(result.new_items[0], HandoffCallItem), result.new_items
    assert isinstance(result.final_output, Forecast), result.final_output
