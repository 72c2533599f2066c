#!/usr/bin/env python3
"""Renders conversations with DeepSeek-V3.2's chat encoding, for tests/tokenizer_test.cc.

V3.2's release has no chat template: DeepSeek's encoding_dsv32.py renders conversations. The
reference here is that file as mlx-lm vendors it (mlx_lm/chat_templates/deepseek_v32.py, loaded
alone: mlx itself is not needed), driven as vLLM's DeepseekV32Tokenizer drives it: the request's
tools in a system message of their own at the front, thinking mode from the `thinking` template
argument (chat when absent), earlier reasoning dropped when the conversation ends with a user
message.

Writes tests/fixtures/deepseek-v32-encoding/cases.json: a list of
{"name", "messages", "tools" (as vLLM dumps them, or null), "thinking", and "rendered" or
"error"}. Run through tools/deepseek_v32/make_fixtures.sh.
"""

import importlib.util
import json
import os
import sysconfig

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "deepseek-v32-encoding")


def load_encoding():
    path = os.path.join(sysconfig.get_paths()["purelib"], "mlx_lm", "chat_templates", "deepseek_v32.py")
    spec = importlib.util.spec_from_file_location("deepseek_v32_encoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_render(encoding, messages, tools, thinking):
    """vLLM's DeepseekV32Tokenizer.apply_chat_template, rendering only."""
    messages = [dict(m) for m in messages]
    if tools:
        messages.insert(0, {"role": "system", "tools": tools})
    drop_thinking = messages[-1]["role"] == "user"
    return encoding.encode_messages(messages, thinking_mode="thinking" if thinking else "chat",
                                    drop_thinking=drop_thinking)


def tool(name, description, parameters):
    # vLLM's model_dump of a ChatCompletionToolsParam: absent fields are null.
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


WEATHER = tool("get_weather", "Weather at a place", {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"},
                   "days": {"type": "integer"}, "units": {"enum": ["C", "F"]}},
    "required": ["city"]})
SEARCH = tool("search", None, {"type": "object", "properties": {
    "query": {"type": "string"}, "filters": {"type": "object"}, "limit": {"type": "number"},
    "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}}})
NO_PARAMS = tool("now", "The time", None)


def call(name, arguments, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def cases():
    user = {"role": "user", "content": "What is 2+2?"}
    system = {"role": "system", "content": "You are terse."}
    tool_turn = {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need weather.",
                 "tool_calls": [call("get_weather", {"city": "Paris", "days": 3}),
                                call("search", {"query": "a \"quoted\" term\nnext line", "filters": {"lang": "fr", "n": [1, 2.5]},
                                                "limit": 1.0, "exact": True, "tags": ["x", "ü"]}, "call_2")]}
    results = [{"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21°C"},
               {"role": "tool", "tool_call_id": "call_2", "content": "{\"hits\": 3}"}]
    out = []
    for thinking in (False, True):
        mode = "thinking" if thinking else "chat"
        out += [
            {"name": f"user_{mode}", "messages": [user], "tools": None, "thinking": thinking},
            {"name": f"system_history_{mode}", "messages": [
                system, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
                {"role": "user", "content": "Bye, ünïcode ✓"}], "tools": None, "thinking": thinking},
            {"name": f"tools_{mode}", "messages": [system, user], "tools": [WEATHER, SEARCH, NO_PARAMS],
             "thinking": thinking},
            {"name": f"tool_round_{mode}", "messages": [system, {"role": "user", "content": "Weather?"}, tool_turn] + results,
             "tools": [WEATHER, SEARCH], "thinking": thinking},
            {"name": f"tool_round_answered_{mode}", "messages": [
                {"role": "user", "content": "Weather?"}, tool_turn] + results + [
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is sunny."}],
             "tools": [WEATHER, SEARCH], "thinking": thinking},
            {"name": f"tool_round_then_user_{mode}", "messages": [
                {"role": "user", "content": "Weather?"}, tool_turn] + results + [
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is sunny."},
                {"role": "user", "content": "Thanks"}], "tools": [WEATHER], "thinking": thinking},
            {"name": f"call_without_arguments_{mode}", "messages": [
                {"role": "user", "content": "Time?"},
                {"role": "assistant", "content": None, "tool_calls": [call("now", {})]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}], "tools": [NO_PARAMS],
             "thinking": thinking},
            {"name": f"developer_{mode}", "messages": [system, {"role": "developer", "content": "Be brief."}],
             "tools": [WEATHER], "thinking": thinking},
        ]
    out += [
        # Thinking mode needs reasoning (or calls) on an assistant message after the last user one.
        {"name": "answer_without_reasoning_thinking", "messages": [
            user, {"role": "assistant", "content": "4"}], "tools": None, "thinking": True},
        {"name": "answer_without_reasoning_chat", "messages": [
            user, {"role": "assistant", "content": "4"}], "tools": None, "thinking": False},
        {"name": "tool_result_without_call", "messages": [
            user, {"role": "assistant", "content": "4"}, {"role": "tool", "content": "x"}],
         "tools": None, "thinking": False},
        {"name": "more_results_than_calls", "messages": [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": None, "tool_calls": [call("now", {})]},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}],
         "tools": None, "thinking": False},
    ]
    return out


def main():
    encoding = load_encoding()
    os.makedirs(OUT, exist_ok=True)
    rendered = []
    for case in cases():
        entry = dict(case)
        try:
            entry["rendered"] = vllm_render(encoding, case["messages"], case["tools"], case["thinking"])
        except (AssertionError, IndexError, KeyError, TypeError) as error:
            entry["error"] = f"{type(error).__name__}: {error}"
        rendered.append(entry)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(rendered, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in rendered)
    print(f"deepseek-v32-encoding: {len(rendered)} cases, {errors} raise")


if __name__ == "__main__":
    main()
