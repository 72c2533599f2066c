"""The Responses API (/v1/responses, stateless) through the official openai client:
responses.create with text and message inputs, the typed stream (responses.stream and
stream=True) equal to the non-streamed text, responses.parse with a Pydantic model, json_schema
and json_object formats, max_output_tokens → incomplete, usage, and bad requests refused by name
while the server goes on serving; function tools (function_call items, streamed arguments,
function_call_output in a follow-up turn) and reasoning items through the chat path's parsers."""
import json
import time
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import Server
from test_structured_outputs import PERSON

# The order the official API sends its events in, for one message output.
EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added", "response.output_text.delta",
          "response.output_text.done", "response.content_part.done",
          "response.output_item.done", "response.completed"]


def test_text_input(client):
    out = client.responses.create(model="sy-test", input="HAMLET: To be, or not",
                                  max_output_tokens=40, temperature=0)
    assert out.object == "response" and out.id.startswith("resp_")
    assert out.status in ("completed", "incomplete")
    assert len(out.output) == 1 and out.output[0].type == "message"
    assert out.output[0].role == "assistant"
    assert out.output_text == out.output[0].content[0].text
    assert out.usage.input_tokens > 0
    assert 0 < out.usage.output_tokens <= 40
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.input_tokens_details.cached_tokens >= 0
    assert out.usage.output_tokens_details.reasoning_tokens == 0  # no reasoning parser
    assert out.max_output_tokens == 40 and out.temperature == 0


def test_input_items_and_instructions_render_as_chat(client):
    """instructions + message items (string and input_text contents, developer → system) give
    the same prompt, and so the same greedy text, as the chat request they amount to."""
    chat = client.chat.completions.create(
        model="sy-test", max_tokens=30, temperature=0,
        messages=[{"role": "system", "content": "Speak as Hamlet."},
                  {"role": "user", "content": "Who are you?"},
                  {"role": "assistant", "content": "A prince."},
                  {"role": "user", "content": "Of where?"}])
    out = client.responses.create(
        model="sy-test", max_output_tokens=30, temperature=0, instructions="Speak as Hamlet.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Who are you?"}]},
               {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "A prince.", "annotations": []}]},
               {"role": "user", "content": "Of where?"}])
    assert out.output_text == chat.choices[0].message.content
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    dev = client.responses.create(
        model="sy-test", max_output_tokens=30, temperature=0,
        input=[{"role": "developer", "content": "Speak as Hamlet."},
               {"role": "user", "content": "Who are you?"},
               {"role": "assistant", "content": "A prince."},
               {"role": "user", "content": "Of where?"}])
    assert dev.output_text == out.output_text


def test_max_output_tokens_is_incomplete(client):
    out = client.responses.create(model="sy-test", input="Tell a long tale.",
                                  max_output_tokens=3, temperature=0)
    assert out.status == "incomplete"
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 3
    assert out.output[0].status == "incomplete"


def test_stream_helper_equals_non_streamed(client):
    args = dict(model="sy-test", input="KING: What news?", max_output_tokens=60, temperature=0)
    plain = client.responses.create(**args)
    with client.responses.stream(**args) as stream:
        events = list(stream)
    final = events[-1].response  # the helper's get_final_response needs response.completed
    types = [e.type for e in events]
    # Each kind in the documented order; deltas as many as there were pieces of text.
    assert [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t] == (
        EVENTS if plain.status == "completed" else EVENTS[:-1] + ["response.incomplete"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == plain.output_text
    assert final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.id == events[0].response.id


def test_stream_true_ends_incomplete(client):
    stream = client.responses.create(model="sy-test", input="Tell a long tale.",
                                     max_output_tokens=5, temperature=0, stream=True)
    events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == 5
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[0].content[0].text == text


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=10)


def test_parse_with_a_pydantic_model(client):
    out = client.responses.parse(model="sy-test", input="Is the king dead?",
                                 max_output_tokens=200, temperature=0, text_format=Verdict)
    assert out.status == "completed", out.output_text
    assert isinstance(out.output_parsed, Verdict)
    assert 0 <= out.output_parsed.confidence <= 10
    assert out.text.format.type == "json_schema"


def test_parse_streamed(client):
    with client.responses.stream(model="sy-test", input="Is the king dead?",
                                 max_output_tokens=200, temperature=0,
                                 text_format=Verdict) as stream:
        final = stream.get_final_response()
    plain = client.responses.parse(model="sy-test", input="Is the king dead?",
                                   max_output_tokens=200, temperature=0, text_format=Verdict)
    assert final.output_parsed == plain.output_parsed


def test_json_schema_and_json_object_formats(client):
    out = client.responses.create(
        model="sy-test", input="Describe a character as JSON.", max_output_tokens=300,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                         "strict": True}})
    assert out.status == "completed", out.output_text
    jsonschema.validate(json.loads(out.output_text), PERSON)
    out = client.responses.create(model="sy-test", input="Some JSON, please.",
                                  max_output_tokens=300, temperature=0.8,
                                  text={"format": {"type": "json_object"}})
    assert out.output_text.startswith("{")
    if out.status == "completed":
        assert isinstance(json.loads(out.output_text), dict)


@pytest.mark.parametrize("body,param,words", [
    ({"previous_response_id": 5}, "previous_response_id", "string"),
    ({"store": "yes"}, "store", "true or false"),
    ({"conversation": {"id": 7}}, "conversation", "conversation id"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation",
     "previous_response_id"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tool_choice",
     "--enable-auto-tool-choice"),
    ({"top_logprobs": 3}, "top_logprobs", "message.output_text.logprobs"),
    ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs",
     "[0, 20]"),
    ({"frobnicate": 1}, "frobnicate", "not supported"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "not supported"),
    ({"truncation": "middle"}, "truncation", "disabled"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "must be one of"),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary", "auto"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "input_image"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role", "wizard"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item_reference"),
    ({"max_output_tokens": 0}, "max_output_tokens", "positive"),
    ({"max_output_tokens": 10 ** 9}, "max_output_tokens", "must be in"),
    ({"temperature": -1}, "temperature", "must be in"),
    ({"text": {"format": {"type": "json_schema", "schema": PERSON}}}, "text.format.name",
     "string"),
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "array", "uniqueItems": True}}}},
     "text.format", "uniqueItems"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type", "json_schema"),
])
def test_bad_requests_are_refused_by_name(server, client, body, param, words):
    got, error, _ = server.request("POST", "/v1/responses",
                                   {"model": "sy-test", "input": "x", **body})
    assert got == 400, error
    assert error["error"]["param"] == param, error
    assert words in error["error"]["message"], error
    # The server goes on serving.
    out = client.responses.create(model="sy-test", input="x", max_output_tokens=2)
    assert out.usage.output_tokens == 2


def test_malformed_bodies(server, client):
    for raw in (b"{", b"[]", b'"x"'):
        got, error, _ = server.request("POST", "/v1/responses", raw=raw)
        assert got == 400, error
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="another-model", input="x")
    got, _, _ = server.request("GET", "/v1/responses")
    assert got == 405


# ---- stored responses (serve/responses_store.h; the default --responses-store-mb 256) ----

def test_previous_response_id_continues_a_stored_response(client):
    first = client.responses.create(model="sy-test", input="Hello there", instructions="Be brief.",
                                     max_output_tokens=8, temperature=0)
    assert first.store is True and first.previous_response_id is None
    second = client.responses.create(model="sy-test", input="And then?",
                                     previous_response_id=first.id, max_output_tokens=8,
                                     temperature=0)
    assert second.previous_response_id == first.id
    # The same as sending the conversation whole: the first turn's input and output, then the
    # new input; the first turn's instructions are not carried over (OpenAI's rule).
    whole = [{"role": "user", "content": "Hello there"}]
    whole += [item.model_dump(exclude_none=True) for item in first.output]
    whole += [{"role": "user", "content": "And then?"}]
    stateless = client.responses.create(model="sy-test", input=whole, max_output_tokens=8,
                                        temperature=0, store=False)
    assert stateless.store is False
    assert second.output_text == stateless.output_text
    assert second.usage.input_tokens == stateless.usage.input_tokens
    # A third turn on the second: the whole chain.
    third = client.responses.create(model="sy-test", input="Go on.", previous_response_id=second.id,
                                    max_output_tokens=4, temperature=0)
    items = client.responses.input_items.list(third.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"),
                                                ("message", "user"), ("message", "assistant"),
                                                ("message", "user")]
    assert items[1].id == first.output[0].id and items[3].id == second.output[0].id
    assert [i.id for i in client.responses.input_items.list(third.id).data] == [
        i.id for i in reversed(items)]  # newest first by default
    page = client.responses.input_items.list(third.id, order="asc", limit=2, after=items[0].id)
    assert [i.id for i in page.data] == [items[1].id, items[2].id] and page.has_more


def test_retrieve_and_delete(server, client):
    made = client.responses.create(model="sy-test", input="Keep this", max_output_tokens=4,
                                   temperature=0)
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
    events = list(client.responses.create(model="sy-test", input="Stream this",
                                          max_output_tokens=4, temperature=0, stream=True))
    assert events[-1].type == "response.incomplete"  # stored as it ended: the budget cut it
    streamed = events[-1].response
    assert client.responses.retrieve(streamed.id).model_dump() == streamed.model_dump()
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(made.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="sy-test", input="x", previous_response_id=made.id)
    assert e.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="sy-test", input="x", max_output_tokens=2,
                                       store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    got, _, _ = server.request("POST", f"/v1/responses/{streamed.id}")
    assert got == 405
    got, _, _ = server.request("DELETE", f"/v1/responses/{streamed.id}/input_items")
    assert got == 405
    got, error, _ = server.request("GET", f"/v1/responses/{streamed.id}/input_items?limit=500")
    assert got == 400 and error["error"]["param"] == "limit"


def wait_for(client, response_id, done):
    """Polls GET /v1/responses/{id} until done(response) (a generous deadline: a failing run
    hangs no test)."""
    deadline = time.time() + 120
    while True:
        got = client.responses.retrieve(response_id)
        if done(got) or time.time() > deadline:
            return got
        time.sleep(0.02)


def aborted_requests(server):
    got, text, _ = server.request("GET", "/metrics")
    assert got == 200
    (line,) = [l for l in text.splitlines()
               if l.startswith("switchyard:request_success_total") and '"abort"' in l]
    return float(line.rsplit(" ", 1)[1])


def test_background_responses(server, client):
    """background: true answers at once with status queued; GET polls it to the finished object,
    the same answer as in the foreground; cancel aborts a running one."""
    args = dict(model="sy-test", input="Tell a story", max_output_tokens=24, temperature=0)
    queued = client.responses.create(**args, background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = wait_for(client, queued.id, lambda r: r.status not in ("queued", "in_progress"))
    assert done.status == "incomplete" and done.usage.output_tokens == 24
    assert done.output_text == client.responses.create(**args).output_text
    # A long one, cancelled once it runs: its last object says cancelled, with what it wrote.
    long = client.responses.create(model="sy-test", input="Tell a long story", background=True,
                                   max_output_tokens=20000, temperature=0)
    wait_for(client, long.id, lambda r: r.status == "in_progress")
    aborted = aborted_requests(server)
    assert client.responses.cancel(long.id).status == "cancelled"
    final = wait_for(client, long.id, lambda r: r.usage is not None)
    assert final.status == "cancelled" and 0 < final.usage.output_tokens < 20000
    assert aborted_requests(server) == aborted + 1  # the engine stopped it
    with pytest.raises(openai.BadRequestError):  # nothing running to cancel
        client.responses.cancel(long.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_none")
    for extra, param in (({"store": False}, "store"), ({"background": "yes"}, "background")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**{**args, "background": True, **extra})
        assert e.value.body["param"] == param


def test_background_responses_stream_and_resume(server, client):
    """background with stream: the events stream while the server runs the response; a client
    that breaks off resumes after the last sequence_number it saw (the SDK's
    responses.stream(response_id=…, starting_after=…)), and once finished the events are kept
    and streamed again whole. A client that leaves does not stop a background response."""
    args = dict(model="sy-test", input="Tell a story", max_output_tokens=24, temperature=0)
    foreground = client.responses.create(**args)
    first = []
    with client.responses.stream(**args, background=True) as stream:
        for event in stream:
            first.append(event)
            if event.sequence_number == 6:
                break
    rid = first[0].response.id
    assert [e.type for e in first[:3]] == ["response.created", "response.queued",
                                           "response.in_progress"]
    assert first[0].response.status == "queued" and first[0].response.background is True
    with client.responses.stream(response_id=rid, starting_after=6) as stream:
        rest = list(stream)
    assert rest[0].sequence_number == 7 and rest[-1].type == "response.incomplete"
    assert rest[-1].response.output_text == foreground.output_text
    # Finished: all of it again, numbered from 0, the same text in its deltas.
    replay = list(client.responses.retrieve(rid, stream=True))
    assert [e.sequence_number for e in replay] == list(range(len(replay)))
    assert [e.type for e in replay[7:]] == [e.type for e in rest]
    assert "".join(e.delta for e in replay if e.type == "response.output_text.delta") == \
        foreground.output_text
    got, body, _ = server.request("GET", f"/v1/responses/{foreground.id}?stream=true")
    assert got == 400 and body["error"]["param"] == "stream", body
    got, body, _ = server.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=x")
    assert got == 400 and body["error"]["param"] == "starting_after", body
    # A long one whose client leaves: it runs on; a second reader follows it to its cancel.
    aborted = aborted_requests(server)
    with client.responses.stream(model="sy-test", input="Tell a long story", background=True,
                                 max_output_tokens=20000, temperature=0) as stream:
        for event in stream:
            if event.type == "response.created":
                long_id = event.response.id
            if event.sequence_number == 5:
                break
    running = wait_for(client, long_id, lambda r: r.status != "queued")
    assert running.status == "in_progress" and aborted_requests(server) == aborted
    follower = client.responses.retrieve(long_id, stream=True, starting_after=3)
    seen = next(iter(follower))
    assert seen.sequence_number == 4
    assert client.responses.cancel(long_id).status == "cancelled"
    tail = list(follower)  # ends once the cancelled run has stopped
    assert all(e.type != "response.completed" for e in tail)
    final = wait_for(client, long_id, lambda r: r.usage is not None)
    assert final.status == "cancelled" and aborted_requests(server) == aborted + 1


def test_conversations_hold_turns_and_their_items(server, client):
    """The Conversations API: a conversation made with items and metadata; responses that name it
    read its items first and add their turn (the same answer as the conversation sent whole);
    its items listed in pages, retrieved and deleted; metadata updated; deleted, it is gone."""
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}],
                                       metadata={"topic": "kings"})
    assert conv.object == "conversation" and conv.metadata == {"topic": "kings"}
    first = client.responses.create(model="sy-test", input="Tell me of the king.",
                                    conversation=conv.id, max_output_tokens=6, temperature=0)
    second = client.responses.create(model="sy-test", input="And the queen?",
                                     conversation={"id": conv.id}, max_output_tokens=6,
                                     temperature=0, store=False)
    assert second.conversation.id == conv.id
    whole = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "Tell me of the king."}]
    whole += [item.model_dump(exclude_none=True) for item in first.output]
    whole += [{"role": "user", "content": "And the queen?"}]
    alone = client.responses.create(model="sy-test", input=whole, max_output_tokens=6,
                                    temperature=0, store=False)
    assert second.output_text == alone.output_text
    assert second.usage.input_tokens == alone.usage.input_tokens
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [(i.type, i.role) for i in items] == [
        ("message", "system"), ("message", "user"), ("message", "assistant"),
        ("message", "user"), ("message", "assistant")]
    assert items[2].id == first.output[0].id  # output items keep their ids
    assert len({i.id for i in items}) == 5
    # Pages, newest first by default.
    page = client.conversations.items.list(conv.id, limit=2)
    assert [i.id for i in page.data] == [items[4].id, items[3].id] and page.has_more
    # Items added by hand join the list; one retrieved and deleted.
    added = client.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "Go on."}])
    assert added.data[0].role == "user" and added.data[0].id not in {i.id for i in items}
    got = client.conversations.items.retrieve(items[1].id, conversation_id=conv.id)
    assert got.id == items[1].id and got.content[0].text == "Tell me of the king."
    client.conversations.items.delete(items[1].id, conversation_id=conv.id)
    assert len(list(client.conversations.items.list(conv.id))) == 5
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(items[1].id, conversation_id=conv.id)
    assert client.conversations.update(conv.id, metadata={"topic": "queens"}).metadata == {
        "topic": "queens"}
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="sy-test", input="x", conversation=conv.id)
    assert e.value.body["param"] == "conversation"
    for body, param in (({"items": "x"}, "items"), ({"metadata": {"k": 1}}, "metadata.k"),
                        ({"items": [{"role": "wizard", "content": "x"}]}, "items[0].role"),
                        ({"frob": 1}, "frob")):
        got, error, _ = server.request("POST", "/v1/conversations", body)
        assert got == 400 and error["error"]["param"] == param, error


def test_a_store_in_a_directory_outlives_the_server(model_dir):
    """--responses-store-dir: a stored response and a conversation outlive a restart of the
    server: retrieved, listed and continued (previous_response_id, conversation) by the next
    process as by the first; a second server on the same directory is refused."""
    from conftest import TMP
    directory = f"{TMP}/responses-store-{time.time_ns()}"
    first = Server(model_dir, "--responses-store-dir", directory)
    try:
        c = openai.OpenAI(base_url=first.url + "/v1", api_key="x", max_retries=0)
        stored = c.responses.create(model="sy-test", input="Tell me of the king.",
                                    max_output_tokens=4, temperature=0)
        conv = c.conversations.create(items=[{"role": "system", "content": "Be brief."}],
                                      metadata={"topic": "kings"})
        c.responses.create(model="sy-test", input="And the queen?", conversation=conv.id,
                           max_output_tokens=4, temperature=0)
        items = [i.id for i in c.conversations.items.list(conv.id, order="asc")]
        follow = dict(model="sy-test", input="Go on.", previous_response_id=stored.id,
                      max_output_tokens=4, temperature=0, store=False)
        before = c.responses.create(**follow).output_text
        with pytest.raises(AssertionError) as refused:  # the directory is this server's
            Server(model_dir, "--responses-store-dir", directory)
        assert "another process" in str(refused.value)
    finally:
        assert first.stop() == 0, "".join(first.log)
    second = Server(model_dir, "--responses-store-dir", directory)
    try:
        c = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0)
        again = c.responses.retrieve(stored.id)
        assert again.output_text == stored.output_text and again.id == stored.id
        assert c.conversations.retrieve(conv.id).metadata == {"topic": "kings"}
        assert [i.id for i in c.conversations.items.list(conv.id, order="asc")] == items
        assert c.responses.create(**follow).output_text == before
    finally:
        assert second.stop() == 0, "".join(second.log)


def test_truncation_auto_drops_the_earliest_turns(model_dir):
    """truncation "auto": a conversation longer than the context loses its earliest turns (after
    the instructions) until it fits — the same answer as the client sending the fewest turns
    that fit by hand; "disabled" (the default) answers context_length_exceeded."""
    s = Server(model_dir, "--max-model-len", "160", "--kv-cache-tokens", "4096")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        turns = []
        for i in range(6):
            turns.append({"role": "user", "content": f"Tell me of king number {i}, and his " +
                          "deeds " * 6})
            turns.append({"role": "assistant", "content": f"King {i} was " + "great " * 6})
        turns.append({"role": "user", "content": "Which was the best?"})
        args = dict(model="sy-test", instructions="Be brief.", max_output_tokens=8,
                    temperature=0)
        with pytest.raises(openai.BadRequestError) as info:
            c.responses.create(input=turns, **args)
        assert info.value.body["code"] == "context_length_exceeded", info.value.body
        assert info.value.body["param"] == "max_output_tokens", info.value.body
        out = c.responses.create(input=turns, truncation="auto", **args)
        assert out.truncation == "auto" and out.usage.input_tokens + 8 <= 160
        for dropped in range(1, 7):  # whole turns, earliest first, by hand
            try:
                by_hand = c.responses.create(input=turns[2 * dropped:], **args)
                break
            except openai.BadRequestError:
                continue
        assert dropped > 1  # more than one turn had to go
        assert out.output_text == by_hand.output_text
        assert out.usage.input_tokens == by_hand.usage.input_tokens
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_the_store_keeps_its_budget_and_can_be_off(model_dir):
    """--responses-store-mb: the least recently used go first; 0 keeps nothing and refuses
    store: true and previous_response_id by name."""
    small = Server(model_dir, "--responses-store-mb", "0.004")  # about two Response objects
    try:
        c = openai.OpenAI(base_url=small.url + "/v1", api_key="x", max_retries=0)
        made = [c.responses.create(model="sy-test", input=f"turn {i}", max_output_tokens=2)
                for i in range(6)]
        c.responses.retrieve(made[-1].id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(made[0].id)
        got, text, _ = small.request("GET", "/metrics")
        metrics = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                   for line in text.splitlines() if line.startswith("switchyard:responses_")}
        assert 1 <= metrics["switchyard:responses_stored"] < 6, metrics
        assert 0 < metrics["switchyard:responses_store_bytes"] <= 0.004 * 2 ** 20, metrics
        assert metrics["switchyard:responses_store_evictions_total"] == (
            6 - metrics["switchyard:responses_stored"]), metrics
    finally:
        assert small.stop() == 0, "".join(small.log)
    off = Server(model_dir, "--responses-store-mb", "0")
    try:
        c = openai.OpenAI(base_url=off.url + "/v1", api_key="x", max_retries=0)
        out = c.responses.create(model="sy-test", input="x", max_output_tokens=2)
        assert out.store is False
        for body, param in (({"store": True}, "store"),
                            ({"previous_response_id": out.id}, "previous_response_id"),
                            ({"background": True}, "background"),
                            ({"conversation": "conv_1"}, "conversation")):
            got, error, _ = off.request("POST", "/v1/responses",
                                        {"model": "sy-test", "input": "x", **body})
            assert got == 400 and error["error"]["param"] == param, error
            assert "keeps no state" in error["error"]["message"] or "keeps none" in error[
                "error"]["message"], error
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(out.id)
    finally:
        assert off.stop() == 0, "".join(off.log)


# ---- tools and reasoning (the chat path's parsers and forcing grammars, chat_output/) ----

from test_tool_calling import (ADD, SCHEMAS, TOOLS, r1_client,  # noqa: E402,F401
                               tools_client)

# Responses function tools are flat: {"type": "function", "name", "parameters", ...}.
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ASK = "What is the weather in Paris, and what is 2 + 40?"


def check_function_calls(output, names=SCHEMAS):
    calls = [item for item in output if item.type == "function_call"]
    assert calls, output
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert call.name in names
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return calls


def test_required_function_calls_equal_chat(tools_client):
    out = tools_client.responses.create(model="sy-test", input=ASK, tools=FLAT_TOOLS,
                                        tool_choice="required", max_output_tokens=300,
                                        temperature=0)
    assert out.status == "completed"
    calls = check_function_calls(out.output)
    assert [item.type for item in out.output] == ["function_call"] * len(calls)
    chat = tools_client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": ASK}], tools=TOOLS,
        tool_choice="required", max_tokens=300, temperature=0).choices[0].message
    assert [(c.name, c.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in chat.tool_calls]


def test_required_calls_with_a_text_format_equal_without(tools_client):
    """A typed output (text.format) beside tool_choice "required", as agent frameworks send it:
    the forced call applies, the same call as without the format."""
    args = dict(model="sy-test", input=ASK, tools=FLAT_TOOLS, tool_choice="required",
                max_output_tokens=300, temperature=0, parallel_tool_calls=False)
    plain = check_function_calls(tools_client.responses.create(**args).output)
    typed = tools_client.responses.create(**args, text={"format": {
        "type": "json_schema", "name": "person", "schema": PERSON}})
    assert typed.status == "completed"
    assert [(c.name, c.arguments) for c in check_function_calls(typed.output)] == [
        (c.name, c.arguments) for c in plain]


def test_function_call_streamed_equals_whole(tools_client):
    args = dict(model="sy-test", input=ASK, tools=FLAT_TOOLS, max_output_tokens=300,
                temperature=0, parallel_tool_calls=False,
                tool_choice={"type": "function", "name": "add"})
    whole = tools_client.responses.create(**args)
    (call,) = check_function_calls(whole.output, names={"add"})
    with tools_client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[2].item.type == "function_call" and events[2].item.name == "add"
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments
    (streamed,) = check_function_calls(final.output, names={"add"})
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_function_call_outputs_in_a_follow_up_turn(tools_client):
    first = tools_client.responses.create(model="sy-test", input=ASK, tools=FLAT_TOOLS,
                                          tool_choice="required", max_output_tokens=300,
                                          temperature=0)
    calls = check_function_calls(first.output)
    turn = [{"role": "user", "content": ASK}] + [c.model_dump(exclude_none=True) for c in calls]
    turn += [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"}
             for c in calls]
    # The same prompt as the chat request with the assistant's tool_calls and tool messages.
    messages = [{"role": "user", "content": ASK},
                {"role": "assistant", "tool_calls": [
                    {"id": c.call_id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}]
    messages += [{"role": "tool", "tool_call_id": c.call_id, "content": "sunny, 21 C"}
                 for c in calls]
    chat = tools_client.chat.completions.create(model="sy-test", messages=messages, tools=TOOLS,
                                                tool_choice="none", max_tokens=10, temperature=0)
    out = tools_client.responses.create(model="sy-test", input=turn, tools=FLAT_TOOLS,
                                        tool_choice="none", max_output_tokens=10, temperature=0)
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.output_text == chat.choices[0].message.content
    again = tools_client.responses.create(model="sy-test", input=turn, tools=FLAT_TOOLS,
                                          tool_choice="required", max_output_tokens=300,
                                          temperature=0)
    check_function_calls(again.output)


@pytest.mark.parametrize("body,param,words", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"minLength": 3}}}}}],
      "tool_choice": "required"}, "tools[0].parameters", "'not'"),
    ({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice",
     "not among the tools"),
    ({"tools": FLAT_TOOLS, "tool_choice": {"type": "mcp"}}, "tool_choice", "must be"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments",
     "string"),
])
def test_bad_tools_are_refused_by_name(tool_server, tools_client, body, param, words):
    got, error, _ = tool_server.request("POST", "/v1/responses",
                                        {"model": "sy-test", "input": ASK, **body})
    assert got == 400, error
    assert error["error"]["param"] == param, error
    assert words in error["error"]["message"], error
    out = tools_client.responses.create(model="sy-test", input="x", max_output_tokens=2)
    assert out.usage.output_tokens == 2


def test_reasoning_items(r1_client):
    """With --reasoning-parser (an R1-template copy of the default model, which never closes its
    thinking unaided): a reasoning item whose text is the chat path's reasoning_content, streamed
    as response.reasoning_text.delta."""
    args = dict(model="sy-test", input=ASK, max_output_tokens=20, temperature=0)
    out = r1_client.responses.create(**args)
    chat = r1_client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": ASK}], max_tokens=20,
        temperature=0).choices[0].message
    assert out.status == "incomplete"
    assert [item.type for item in out.output] == ["reasoning"]
    assert out.output[0].content[0].text == chat.model_extra["reasoning_content"]
    events = list(r1_client.responses.create(**args, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == out.output[0].content[0].text
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].content[0].text == text
    # It never closed its thinking: every output token is reasoning (vLLM's count).
    assert out.usage.output_tokens_details.reasoning_tokens == out.usage.output_tokens == 20
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == 20


def test_reasoning_effort(r1_client):
    """reasoning.effort is the chat path's reasoning_effort (low=4 on this server): the
    reasoning item holds what the chat path's reasoning_content does, the answer follows, and
    the response echoes the effort and summary asked for (no summary is written)."""
    out = r1_client.responses.create(model="sy-test", input=ASK, max_output_tokens=16,
                                      temperature=0, reasoning={"effort": "low", "summary": "auto"})
    chat = r1_client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": ASK}], max_tokens=16,
        temperature=0, reasoning_effort="low").choices[0].message
    assert [item.type for item in out.output] == ["reasoning", "message"], out.output
    assert out.output[0].content[0].text == chat.model_extra["reasoning_content"]
    assert out.output_text == chat.content
    assert (out.reasoning.effort, out.reasoning.summary) == ("low", "auto")


def test_output_text_logprobs(client):
    """include: ["message.output_text.logprobs"] with top_logprobs, as OpenAI and vLLM: the
    message's output_text carries each token's log-probability and its alternatives — the chat
    path's for the same greedy request — and the stream's deltas carry them piece by piece."""
    args = dict(model="sy-test", input="HAMLET: To be, or not", max_output_tokens=12,
                temperature=0, include=["message.output_text.logprobs"], top_logprobs=2)
    out = client.responses.create(**args)
    assert out.top_logprobs == 2
    part = out.output[0].content[0]
    chat = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "HAMLET: To be, or not"}],
        max_tokens=12, temperature=0, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert len(part.logprobs) == out.usage.output_tokens == len(chat)
    for got, want in zip(part.logprobs, chat):
        assert (got.token, got.logprob, got.bytes) == (want.token, want.logprob, want.bytes)
        assert [(t.token, t.logprob) for t in got.top_logprobs] == [
            (t.token, t.logprob) for t in want.top_logprobs]
        assert len(got.top_logprobs) == 2
    events = list(client.responses.create(**args, stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == [
        (lp.token, lp.logprob) for lp in part.logprobs]
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert len(done.logprobs) == len(part.logprobs)
    # Without the include there are none (top_logprobs 0 is the default and changes nothing).
    plain = client.responses.create(**{**args, "include": None, "top_logprobs": 0})
    assert plain.output[0].content[0].logprobs == []
