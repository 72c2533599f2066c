"""Chat templates beyond DeepSeek's, end to end: a --chat-template the server interprets, and a
request's own chat_template on a server started with --trust-request-chat-template. The
reference is transformers' own renderer (render_jinja_template, Jinja2 3.1.6), run here on the
same conversations: the server's prompt ids must equal the ids of transformers' text."""

import json
import os

import openai
import pytest
from openai import OpenAI
from transformers.utils.chat_template_utils import render_jinja_template

from conftest import REPO, TMP, Server

TEMPLATES = os.path.join(REPO, "tests", "fixtures", "jinja", "templates")


def read_template(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


def special_tokens(model_dir):
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    token = lambda t: t["content"] if isinstance(t, dict) else (t or "")
    return {"bos_token": token(config.get("bos_token")), "eos_token": token(config.get("eos_token"))}


def as_vllm_passes_them(messages):
    """vLLM's preparation for a Jinja template: tool-call arguments as objects."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for call in m.get("tool_calls") or []:
            arguments = call["function"].get("arguments")
            call["function"]["arguments"] = json.loads(arguments) if arguments else {}
    return out


def reference_ids(server, template, messages, tokens, **kwargs):
    """transformers' rendering of the conversation, tokenized by the server as plain text."""
    rendered, _ = render_jinja_template(
        conversations=[as_vllm_passes_them(messages)], tools=None, documents=None,
        chat_template=template, add_generation_prompt=True, **tokens, **kwargs)
    status, body, _ = server.request("POST", "/tokenize",
                                     {"prompt": rendered[0], "add_special_tokens": False})
    assert status == 200, body
    return body["tokens"]


def server_ids(server, messages, **fields):
    status, body, _ = server.request("POST", "/tokenize", {"messages": messages, **fields})
    assert status == 200, body
    return body["tokens"]


CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Count to 3."}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "",
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
    [{"role": "user", "content": "Привет, 世界! \"quotes\" and \\ backslashes"}],
]


@pytest.fixture(scope="module")
def qwen_server(model_dir):
    """The default model served with Qwen3's template (loops, macros, namespace, tojson)."""
    s = Server(model_dir, "--kv-cache-tokens", "8192",
               "--chat-template", os.path.join(TEMPLATES, "qwen3-0.6b.jinja"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def trusting_server(model_dir):
    s = Server(model_dir, "--kv-cache-tokens", "8192", "--trust-request-chat-template")
    yield s
    assert s.stop() == 0, "".join(s.log)


TOOL_USE = ("TOOLS {{ tools | tojson }}\n{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            "{% endfor %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def named_templates_server(model_dir):
    """The default model as a checkpoint in transformers' newer layout: chat_template.jinja
    (ChatML) and additional_chat_templates/tool_use.jinja beside tokenizer_config.json."""
    path = os.path.join(TMP, "model-named-templates")
    os.makedirs(os.path.join(path, "additional_chat_templates"), exist_ok=True)
    for name in os.listdir(model_dir):
        if not os.path.exists(os.path.join(path, name)):
            os.symlink(os.path.join(model_dir, name), os.path.join(path, name))
    with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(read_template("vllm-chatml.jinja"))
    with open(os.path.join(path, "additional_chat_templates", "tool_use.jinja"), "w") as f:
        f.write(TOOL_USE)
    s = Server(path, "--kv-cache-tokens", "8192", "--tool-call-parser", "deepseek_v3")
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_named_templates_as_transformers_picks_them(named_templates_server, model_dir):
    """chat_template.jinja replaces tokenizer_config.json's template; a request with tools
    renders with the tool_use template, as transformers' get_chat_template chooses."""
    tokens = special_tokens(model_dir)
    messages = CONVERSATIONS[0]
    assert server_ids(named_templates_server, messages) == reference_ids(
        named_templates_server, read_template("vllm-chatml.jinja"), messages, tokens)
    rendered, _ = render_jinja_template(
        conversations=[messages], tools=[WEATHER], documents=None, chat_template=TOOL_USE,
        add_generation_prompt=True, **tokens)
    status, body, _ = named_templates_server.request(
        "POST", "/tokenize", {"prompt": rendered[0], "add_special_tokens": False})
    assert status == 200, body
    assert server_ids(named_templates_server, messages, tools=[WEATHER]) == body["tokens"]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_server_template_prompt_is_transformers(qwen_server, model_dir, index):
    template = read_template("qwen3-0.6b.jinja")
    messages = CONVERSATIONS[index]
    assert server_ids(qwen_server, messages) == reference_ids(
        qwen_server, template, messages, special_tokens(model_dir))


def test_template_kwargs_reach_the_template(qwen_server, model_dir):
    """chat_template_kwargs are the template's variables: Qwen3's enable_thinking=False closes
    an empty think block in the generation prompt."""
    template = read_template("qwen3-0.6b.jinja")
    messages = CONVERSATIONS[0]
    off = server_ids(qwen_server, messages, chat_template_kwargs={"enable_thinking": False})
    assert off == reference_ids(qwen_server, template, messages, special_tokens(model_dir),
                                enable_thinking=False)
    assert off != server_ids(qwen_server, messages)


def test_chat_completion_is_completion_of_the_rendered_prompt(qwen_server, model_dir):
    """A greedy chat completion is the greedy completion of transformers' prompt."""
    client = OpenAI(base_url=qwen_server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = CONVERSATIONS[1]
    chat = client.chat.completions.create(model="sy-test", messages=messages, max_tokens=12,
                                          temperature=0)
    ids = reference_ids(qwen_server, read_template("qwen3-0.6b.jinja"), messages,
                        special_tokens(model_dir))
    plain = client.completions.create(model="sy-test", prompt=ids, max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids)


def test_bad_tool_call_arguments_are_refused(qwen_server):
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c", "type": "function",
                                 "function": {"name": "f", "arguments": "{not json"}}]}]
    status, body, _ = qwen_server.request("POST", "/v1/chat/completions",
                                          {"messages": messages, "max_tokens": 1})
    assert status == 400
    assert body["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


CHATML = read_template("vllm-chatml.jinja")
PARTS = ("{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{{ p.text }}|"
         "{% endfor %}{% endfor %}")
ARGUMENTS = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}"
             "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")


def test_request_template_is_transformers(trusting_server, model_dir):
    client = OpenAI(base_url=trusting_server.url + "/v1", api_key="x", max_retries=0,
                    timeout=120)
    tokens = special_tokens(model_dir)
    for messages in CONVERSATIONS[:2]:
        assert server_ids(trusting_server, messages, chat_template=CHATML) == reference_ids(
            trusting_server, CHATML, messages, tokens)
    chat = client.chat.completions.create(model="sy-test", messages=CONVERSATIONS[0],
                                          max_tokens=4, temperature=0,
                                          extra_body={"chat_template": CHATML})
    ids = reference_ids(trusting_server, CHATML, CONVERSATIONS[0], tokens)
    assert chat.usage.prompt_tokens == len(ids)
    # Tool-call arguments reach a template as objects (vLLM's way), not as the JSON text sent.
    assert server_ids(trusting_server, CONVERSATIONS[2], chat_template=ARGUMENTS) == \
        reference_ids(trusting_server, ARGUMENTS, CONVERSATIONS[2], tokens)
    # A template that loops over content gets OpenAI's parts, a string content as one part.
    messages = [{"role": "user", "content": "plain"},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]
              if isinstance(m["content"], str) else m["content"]} for m in messages]
    assert server_ids(trusting_server, messages, chat_template=PARTS) == reference_ids(
        trusting_server, PARTS, parts, tokens)


@pytest.mark.parametrize("template,words", [
    ("{% for m in messages %}", "line 1"),
    ("{{ messages | no_such_filter }}", "No filter named"),
    ("{{ raise_exception('Conversation roles must alternate') }}",
     "Conversation roles must alternate"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "steps"),
    ("{{ 'x' * 1000000000 }}", "bytes"),
])
def test_bad_request_templates_are_400_and_the_server_serves_on(trusting_server, template, words):
    status, body, _ = trusting_server.request(
        "POST", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
         "chat_template": template})
    assert status == 400, body
    assert words in body["error"]["message"]
    status, body, _ = trusting_server.request(
        "POST", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert status == 200, body


def test_untrusted_server_refuses_request_templates(server):
    status, body, _ = server.request(
        "POST", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "chat_template": CHATML})
    assert status == 400
    assert body["error"]["param"] == "chat_template"
    assert "--trust-request-chat-template" in body["error"]["message"]


def test_openai_client_sees_the_refusal(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sy-test",
                                       messages=[{"role": "user", "content": "x"}],
                                       extra_body={"chat_template": CHATML})
