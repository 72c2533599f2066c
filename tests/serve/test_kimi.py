"""Kimi K2 served end to end: a checkpoint laid out as Moonshot ships it (model_type kimi_k2,
tiktoken.model with Kimi's tokenizer class, K2-Thinking's chat template, <|im_end|> as the end of
a turn in generation_config.json), made from the default model's weights. References: the prompt
ids are transformers' rendering of the template (tools key-sorted, as Kimi's tokenizer class hands
them over) tokenized by the tiktoken library as Kimi's tokenizer drives it; calls come back through
the official OpenAI client in Kimi's call format, whole and streamed."""

import base64
import json
import os
import re
import sys

import pytest
from openai import OpenAI
from transformers.utils.chat_template_utils import render_jinja_template

from conftest import REPO, TMP, Server, streamed_calls

sys.path.insert(0, os.path.join(REPO, "tools", "tokenizer"))
import tiktoken  # noqa: E402
from gen_tiktoken_fixtures import KIMI_PATTERN, SPECIAL_IDS, byte_level_decoder, encode  # noqa: E402

FIXTURE = os.path.join(REPO, "tests", "fixtures", "tiktoken")
TEMPLATE = os.path.join(REPO, "tests", "fixtures", "jinja", "templates", "kimi-k2-thinking.jinja")
CALL_ID = re.compile(r"^functions\.(get_weather|add):\d+$")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["unit", "city"],
                   "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                  "city": {"type": "string", "maxLength": 12}},
                   "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
                   "additionalProperties": False}}}


class Kimi:
    """The checkpoint, and the reference tokenizer for it."""

    def __init__(self, model_dir):
        self.path = os.path.join(TMP, "model-kimi")
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        vocab_size = config["vocab_size"]
        # The default model's ordinary tokens, in id order, as the ranks; Kimi's 258 special ids
        # after them fill the model's vocabulary.
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        added = {a["id"] for a in spec["added_tokens"]}
        decode = byte_level_decoder()
        tokens = [bytes(decode[c] for c in t)
                  for t, i in sorted(spec["model"]["vocab"].items(), key=lambda x: x[1])
                  if i not in added][:vocab_size - SPECIAL_IDS]
        assert all(bytes([b]) in tokens for b in range(256))
        with open(os.path.join(self.path, "tiktoken.model"), "w") as f:
            f.writelines(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens))
        n = len(tokens)
        with open(os.path.join(FIXTURE, "tokenizer_config.json"), encoding="utf-8") as f:
            tok_config = json.load(f)
        fixture_ranks = min(int(k) for k in tok_config["added_tokens_decoder"])
        tok_config["added_tokens_decoder"] = {
            str(int(k) - fixture_ranks + n): v for k, v in tok_config["added_tokens_decoder"].items()}
        with open(TEMPLATE, encoding="utf-8") as f:
            self.template = f.read()
        tok_config["chat_template"] = self.template
        with open(os.path.join(self.path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tok_config, f, ensure_ascii=False, indent=1)
        self.specials = {f"<|reserved_token_{n + k}|>": n + k for k in range(SPECIAL_IDS)}
        for k, v in tok_config["added_tokens_decoder"].items():
            self.specials.pop(f"<|reserved_token_{k}|>", None)
            self.specials[v["content"]] = int(k)
        self.id = self.specials
        config.update({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
                       "bos_token_id": self.id["[BOS]"], "eos_token_id": self.id["[EOS]"]})
        with open(os.path.join(self.path, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        with open(os.path.join(self.path, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": self.id["<|im_end|>"], "max_length": 4096}, f)
        weights = os.path.join(self.path, "model.safetensors")
        if not os.path.exists(weights):
            os.symlink(os.path.join(model_dir, "model.safetensors"), weights)
        self.encoding = tiktoken.Encoding(
            name="kimi-test", pat_str=KIMI_PATTERN,
            mergeable_ranks={t: r for r, t in enumerate(tokens)}, special_tokens=self.specials)

    def reference_ids(self, messages, tools=None, **kwargs):
        """transformers' rendering (vLLM's preparation: arguments as objects; Kimi's: tools with
        every key sorted), then tiktoken as Kimi's tokenizer drives it."""
        conversation = json.loads(json.dumps(messages))
        for m in conversation:
            for call in m.get("tool_calls") or []:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        rendered, _ = render_jinja_template(
            conversations=[conversation], tools=deep_sorted(tools) if tools else None,
            documents=None, chat_template=self.template, add_generation_prompt=True,
            bos_token="[BOS]", eos_token="[EOS]", **kwargs)
        return encode(self.encoding, self.specials, rendered[0])


def deep_sorted(value):
    if isinstance(value, dict):
        return {k: deep_sorted(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [deep_sorted(v) for v in value]
    return value


@pytest.fixture(scope="module")
def kimi(model_dir):
    return Kimi(model_dir)


@pytest.fixture(scope="module")
def kimi_server(kimi):
    # No --tool-call-parser: Kimi's call tokens in the tokenizer choose kimi_k2.
    s = Server(kimi.path, "--kv-cache-tokens", "8192", "--enable-auto-tool-choice")
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def thinking_server(kimi):
    s = Server(kimi.path, "--kv-cache-tokens", "8192", "--reasoning-parser", "kimi_k2",
               "--tool-call-parser", "kimi_k2")
    yield s
    assert s.stop() == 0, "".join(s.log)


def client_of(server):
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


CONVERSATIONS = [
    ([{"role": "user", "content": "Hello there, 世界!"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
     [WEATHER, ADD]),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
       "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                       "function": {"name": "get_weather",
                                    "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
      {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"}],
     [WEATHER]),
    ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "  and   3+3?\n\n"}], None),
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_prompt_ids_are_transformers_and_tiktokens(kimi, kimi_server, index):
    messages, tools = CONVERSATIONS[index]
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    status, out, _ = kimi_server.request("POST", "/tokenize", body)
    assert status == 200, out
    assert out["tokens"] == kimi.reference_ids(messages, tools)


def test_forced_calls_come_back_in_kimis_format(kimi_server):
    client = client_of(kimi_server)
    args = dict(model="sy-test", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=[WEATHER, ADD], tool_choice="required", max_tokens=120, temperature=0)
    whole = client.chat.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert CALL_ID.match(call.id), call.id  # the model's own id, for the next turn's template
        assert call.id.split(".")[1].split(":")[0] == call.function.name
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
        else:
            assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())
    # Streamed: the same calls, assembled from deltas.
    calls, finish = streamed_calls(client, args)
    assert finish == "tool_calls"
    assert calls == [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in choice.message.tool_calls]


def test_a_named_call_follows_the_reasoning(thinking_server):
    """K2-Thinking: the output starts in the reasoning; after its budget the call is forced."""
    client = client_of(thinking_server)
    response = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=150, temperature=0, extra_body={"thinking_token_budget": 6})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    message = choice.message.model_dump()
    assert message.get("reasoning_content"), message
    assert "<think>" not in message["reasoning_content"]
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]
    assert CALL_ID.match(choice.message.tool_calls[0].id)
    # thinking: false in chat_template_kwargs: no reasoning split, the call forced at once.
    response = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=[ADD], tool_choice="required", max_tokens=100, temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": False}})
    message = response.choices[0].message.model_dump()
    assert not message.get("reasoning_content")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["add"]


def test_a_bad_generation_config_is_a_clear_error(kimi, tmp_path):
    import subprocess
    from conftest import BINARY
    bad = tmp_path / "kimi-bad"
    bad.mkdir()
    for name in os.listdir(kimi.path):
        os.symlink(os.path.join(kimi.path, name), bad / name)
    os.unlink(bad / "generation_config.json")
    (bad / "generation_config.json").write_text('{"eos_token_id": [99999999]}')
    out = subprocess.run([BINARY, "generate", "--model", str(bad), "--prompt", "hi",
                          "--max-tokens", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "generation_config.json: eos_token_id 99999999 is not a token id" in out.stderr + out.stdout


def test_im_end_ends_a_turn(kimi, kimi_server):
    """<|im_end|> ends the output as config.json's [EOS] does (generation_config.json names it),
    and is not part of the text; ignore_eos ignores it too."""
    client = client_of(kimi_server)
    im_end = kimi.id["<|im_end|>"]
    args = dict(model="sy-test", messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                logit_bias={str(im_end): 100})
    response = client.chat.completions.create(**args)
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens == 1
    assert not response.choices[0].message.content
    response = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 8
