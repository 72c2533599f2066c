"""Structured outputs through the official openai client: response_format json_schema (checked
with Python's jsonschema), chat.completions.parse with a Pydantic model, json_object streamed,
vLLM's guided_choice / guided_regex / structured_outputs, the log-probabilities of the masked
distribution, and bad grammars refused by name."""
import json
import math
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["calm", "angry", "merry"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "Describe a character as JSON."}]


def test_json_schema_outputs_validate(client):
    out = client.chat.completions.create(
        model="sy-test", messages=CHAT, max_tokens=400, temperature=1.0, seed=3, n=3,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    stopped = 0
    for choice in out.choices:
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), PERSON)
            stopped += 1
        else:  # cut short: still a prefix of the grammar's spelling
            assert choice.message.content.startswith("{")
    assert stopped >= 1


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=10)


def test_parse_with_a_pydantic_model(client):
    out = client.chat.completions.parse(model="sy-test", messages=CHAT, max_tokens=200,
                                        temperature=0, response_format=Verdict)
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Verdict)
    assert 0 <= choice.message.parsed.confidence <= 10


def test_json_object_streamed(client):
    stream = client.chat.completions.create(
        model="sy-test", messages=CHAT, max_tokens=300, temperature=0.7, seed=11, stream=True,
        response_format={"type": "json_object"})
    text, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


def test_guided_choice_and_regex(client):
    choices = ["Denmark", "Norway", "France"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        out = client.completions.create(model="sy-test", prompt="HAMLET: To", max_tokens=10,
                                        temperature=1.0, seed=5, n=2, extra_body=extra)
        for choice in out.choices:
            assert choice.finish_reason == "stop" and choice.text in choices
    pattern = r"[A-Z][a-z]{2,5} \d{1,3}(, [a-z]+)?"
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
        out = client.completions.create(model="sy-test", prompt="KING:", max_tokens=30,
                                        temperature=0.9, seed=1, extra_body=extra)
        choice = out.choices[0]
        if choice.finish_reason == "stop":
            assert re.fullmatch(pattern, choice.text), choice.text
        else:
            assert re.match(r"[A-Z]", choice.text), choice.text


def test_logprobs_are_of_the_masked_distribution(client):
    out = client.completions.create(model="sy-test", prompt="HAMLET: To", max_tokens=10,
                                    temperature=1.0, seed=2, logprobs=5,
                                    extra_body={"guided_choice": ["yes", "no"]})
    lp = out.choices[0].logprobs
    assert out.choices[0].text in ("yes", "no")
    for token_logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert math.isfinite(token_logprob)
        # Only the allowed continuations are alternatives, and they carry all the mass.
        assert 0 < len(top) <= 5
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4


@pytest.mark.parametrize("body,param,words", [
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {"maxLength": 2}}}}}, "guided_json",
     "'not'"),
    ({"guided_regex": "(a)\\1"}, "guided_regex", "backreferences"),
    ({"guided_grammar": "root ::= root \"a\" | \"b\""}, "guided_grammar", "left recursion"),
    ({"guided_json": {"type": "integer", "minimum": 5, "maximum": 3}}, "guided_json",
     "admits no string"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos", "structured output"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs", "structural_tag"),
])
def test_bad_grammars_are_refused_by_name(server, client, body, param, words):
    got, error, _ = server.request("POST", "/v1/completions", {"prompt": "x", **body})
    assert got == 400, error
    assert error["error"]["param"] == param, error
    assert words in error["error"]["message"], error
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="sy-test", messages=CHAT,
            response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "array", "uniqueItems": True}}})


def test_structured_output_through_the_router():
    """The grammar travels through the router's gRPC hop (switchyard.v1.Grammar): the instance
    enforces it, and the text equals what the instance gives directly."""
    from openai import OpenAI
    from test_route import free_port, start_instance, start_router
    port = free_port()
    instance = start_instance(port)
    router = start_router([port], "round_robin")
    try:
        args = dict(model="sy-test", messages=CHAT, max_tokens=150, temperature=0,
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "person", "schema": PERSON}})
        texts = []
        for process in (router, instance):
            c = OpenAI(base_url=process.url + "/v1", api_key="x", max_retries=0, timeout=300)
            choice = c.chat.completions.create(**args).choices[0]
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), PERSON)
            texts.append(choice.message.content)
        assert texts[0] == texts[1]
        got, error, _ = router.request("POST", "/v1/completions",
                                       {"model": "sy-test", "prompt": "x", "guided_regex": "(a)\\1"})
        assert got == 400 and "backreferences" in error["error"]["message"], error
    finally:
        router.stop()
        instance.stop()
