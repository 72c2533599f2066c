#!/usr/bin/env python3
"""Reference renderings for switchyard's Jinja interpreter (src/jinja), made by Jinja2 itself.

Every output comes from transformers' own renderer (render_jinja_template: the sandboxed
environment with trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception and
strftime_now, and continue_final_message) with the pinned versions of requirements.txt. The
clock strftime_now reads is fixed at 2026-01-15 09:30:00 so the files do not change by date;
tests/jinja_test.cc fixes its clock to the same instant.

Writes tests/fixtures/jinja/:
  conversations.json   chat cases beyond tests/fixtures/tokenizer/chat/conversations.json
                       (tools, system prompts, assistant histories)
  expected.json        {"templates": [{"template", "results": [{"conversation", "rendered" |
                       "error"}]}], "snippets": [{"name", "template", "context", "rendered" |
                       "error"}]}
Run through make_jinja_fixtures.sh.
"""
import datetime as real_datetime
import json
import pathlib
import sys

import transformers.utils.chat_template_utils as ctu
from transformers.utils.chat_template_utils import render_jinja_template

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "jinja"
TEMPLATE_DIRS = [OUT / "templates", REPO / "tests" / "fixtures" / "tokenizer" / "templates"]
SHARED_CONVERSATIONS = REPO / "tests" / "fixtures" / "tokenizer" / "chat" / "conversations.json"

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
FIXED_NOW = real_datetime.datetime(2026, 1, 15, 9, 30, 0)


class FixedClock(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = FixedClock  # strftime_now reads the module's datetime.now()

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                       "required": ["q"]},
    },
}


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def S(text):
    return {"role": "system", "content": text}


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def jinja_conversations():
    """Cases the DeepSeek-only conversation set lacks: tools given to the template, tool-call
    arguments as objects (as vLLM passes them), long histories, non-ASCII."""
    cases = []

    def add(name, messages, add_generation_prompt=True, tools=None, extra=None):
        cases.append({"name": name, "messages": messages,
                      "add_generation_prompt": add_generation_prompt,
                      "tools": tools, "extra": extra or {}})

    add("tools_offered", [S("You are helpful."), U("Weather in Paris?")],
        tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tools_offered_no_system", [U("Weather in Paris?")], tools=[WEATHER_TOOL])
    add("tool_round_object_arguments",
        [U("Weather in Paris?"),
         {"role": "assistant", "content": None,
          "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"}, "call_1")]},
         {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}],
        tools=[WEATHER_TOOL])
    add("tool_round_two_calls",
        [S("Use tools."), U("Weather in Paris and Rome?"),
         {"role": "assistant", "content": "",
          "tool_calls": [call("get_weather", {"city": "Paris"}, "call_1"),
                         call("get_weather", {"city": "Rome"}, "call_2")]},
         {"role": "tool", "tool_call_id": "call_1", "content": "18"},
         {"role": "tool", "tool_call_id": "call_2", "content": "24"},
         A("Paris 18, Rome 24."), U("Thanks!")],
        tools=[WEATHER_TOOL])
    add("long_history",
        [S("Be terse.")] + [m for i in range(6) for m in (U(f"Question {i}?"), A(f"Answer {i}."))]
        + [U("Last one?")])
    add("non_ascii", [U("Привет, 世界! Ça va? 🙂 \u2028 tab\tquote\" back\\slash")])
    add("reasoning_history",
        [U("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "Adding."},
         U("3+3?")])
    add("thinking_off", [U("Hi")], extra={"enable_thinking": False, "thinking": False})
    add("thinking_on", [U("Hi")], extra={"enable_thinking": True, "thinking": True})
    add("continue_plain", [U("Say hello"), A("Hello")], add_generation_prompt=False,
        extra={"continue_final_message": True})
    return cases


SNIPPETS = [
    # Output, literals, Python's str()
    ("literals", "{{ 1 }}|{{ -2 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.1 + 0.2 }}"
                 "|{{ 'a' 'b' }}|{{ none }}|{{ true }}|{{ False }}|{{ [1, 'x', none] }}"
                 "|{{ {'k': [1.0, true]} }}|{{ (1,) }}|{{ () }}|{{ 1_000 }}", {}),
    ("string_escapes", r"""{{ 'a\nb\t\'c\'\\d\x41\u00e9\U0001F600\q' }}|{{ "it's" }}""", {}),
    ("repr_quotes", """{{ ["it's", 'say "hi"', "both ' and \\"", 'tab\\t', 'é', '\\x01'] }}""", {}),
    ("undefined_prints_empty", "[{{ missing }}][{{ d.missing }}][{{ d['missing'] }}]", {"d": {}}),
    ("undefined_attribute_error", "{{ missing.x }}", {}),
    ("undefined_arithmetic_error", "{{ missing + 1 }}", {}),
    # Arithmetic
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"
                   " {{ 2 ** -1 }} {{ -2 ** 2 }} {{ 1 + 2.5 }} {{ 'ab' * 3 }} {{ 3 * 'x' }}"
                   " {{ [1] * 3 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }} {{ 7.5 // 2 }}"
                   " {{ -7.5 % 2 }} {{ true + 1 }}", {}),
    ("division_by_zero", "{{ 1 / 0 }}", {}),
    ("str_plus_int_error", "{{ 'a' + 1 }}", {}),
    ("percent_format", "{{ '%s is %d (%r)' % ('x', 3.9, 'y') }}|{{ '%s%%' % 5 }}", {}),
    # Comparisons and logic
    ("comparisons", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }}"
                    " {{ [1, 2] < [1, 3] }} {{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }}"
                    " {{ 'z' not in d }} {{ not 1 == 2 }} {{ none == none }} {{ (1, 2) == [1, 2] }}",
     {"d": {"k": 1}}),
    ("ordering_error", "{{ 1 < 'a' }}", {}),
    ("and_or_values", "{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}", {}),
    ("conditional", "{{ 'y' if x else 'n' }}|{{ 'y' if not x }}|{{ 1 if 0 else 2 if 1 else 3 }}",
     {"x": 0}),
    ("test_argument_quirk", "{{ x is defined if true else 2 }}", {"x": 1}),
    # Subscripts, attributes, slices
    ("subscripts", "{{ d.a }} {{ d['a'] }} {{ l[0] }} {{ l[-1] }} {{ l[5] }} {{ s[1] }} {{ s[-1] }}"
                   " {{ l.0 }} {{ d.items()|list }} {{ d.get('zz', 'dflt') }} {{ d.get('a') }}"
                   " {{ d['items'] }}",
     {"d": {"a": 1, "items": "shadowed"}, "l": [10, 20, 30], "s": "héllo"}),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ s[1:3] }} {{ s[::-1] }}"
               " {{ l[-100:100] }} {{ l[5:] }} {{ s[:] }} {{ l[3:0:-1] }}",
     {"l": [1, 2, 3, 4, 5], "s": "héllo"}),
    ("slice_step_zero", "{{ [1, 2][::0] }}", {}),
    ("attribute_of_none_is_undefined", "[{{ x.y }}]", {"x": None}),
    # Statements and scoping
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two"
                     "{% else %}many{% endif %};{% endfor %}", {}),
    ("for_loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                           "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                           "[{{ loop.previtem }}|{{ loop.nextitem }}]{{ loop.cycle('o', 'e') }};"
                           "{% endfor %}", {}),
    ("for_else_and_filter", "{% for x in [] %}x{% else %}empty{% endfor %}|"
                            "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} "
                            "{% endfor %}", {}),
    ("for_unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
                      "{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}"
                      "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_set_scoping", "{% set count = 0 %}{% for i in range(3) %}{% set count = count + 1 %}"
                        "{{ count }}{% endfor %}{{ count }}", {}),
    ("namespace_counter", "{% set ns = namespace(count=0, seen=false) %}{% for i in range(4) %}"
                          "{% set ns.count = ns.count + i %}{% endfor %}{{ ns.count }} {{ ns.seen }}"
                          " {{ ns }}", {}),
    ("if_set_leaks", "{% if true %}{% set x = 5 %}{% endif %}{{ x }}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                       "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("tuple_set", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, %}{{ t }}", {}),
    ("block_set", "{% set x %}  Hello {{ name }}  {% endset %}[{{ x }}]"
                  "{% set y | upper %}abc{% endset %}{{ y }}", {"name": "W"}),
    ("macro", "{% macro f(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}"
              "{{ f(1) }}{{ f(1, 3) }}{{ f(1, c='q') }}{{ f() }}", {}),
    ("macro_sees_top_level", "{% set g = 'G' %}{% macro f() %}{{ g }}{{ x }}{% endmacro %}"
                             "{% for x in [1] %}{{ f() }}{% endfor %}", {}),
    ("macro_recursion", "{% macro walk(v) %}{% if v is mapping %}{% for k, x in v.items() %}"
                        "{{ k }}:{{ walk(x) }};{% endfor %}{% elif v is iterable and v is not string %}"
                        "[{% for x in v %}{{ walk(x) }}{% endfor %}]{% else %}{{ v }}{% endif %}"
                        "{% endmacro %}{{ walk(d) }}",
     {"d": {"a": [1, {"b": "c"}], "e": None}}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}", {}),
    ("raw_block", "{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("generation_tag", "{% generation %}assistant text{% endgeneration %}", {}),
    ("comment", "a{# a comment #}b", {}),
    # Whitespace control (trim_blocks, lstrip_blocks, -, +)
    ("trim_blocks", "{% if true %}\nline\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "start\n    {% if true %}\n    body\n    {% endif %}\nend", {}),
    ("lstrip_not_midline", "{{ 1 }}  {% if true %}x{% endif %}", {}),
    ("minus_modifiers", "a  {{- ' b ' -}}  c\n  {%- if true -%}\n  d  {%- endif %}", {}),
    ("plus_modifier", "  {%+ if true %}x{% endif %}", {}),
    ("comment_trim", "a\n  {# c #}\nb", {}),
    ("crlf_source", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("trailing_newline_dropped", "x\n", {}),
    ("two_trailing_newlines", "x\n\n", {}),
    ("var_tag_no_trim", "{{ 'a' }}\nb", {}),
    # Filters
    ("filters_strings", "{{ ' a b '|trim }}|{{ 'xax'|trim('x') }}|{{ 'aBc'|upper }}{{ 'aBc'|lower }}"
                        "|{{ 'hello world-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ 'abc'|reverse }}"
                        "|{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '', 1) }}"
                        "|{{ '<a href=\"x\">&'|e }}|{{ 'x'|center(6) }}|{{ 'one two  three'|wordcount }}"
                        "|{{ 3|string }}{{ none|string }}|{{ 'abc'|length }}{{ 'héllo'|count }}", {}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}"
                      "|{{ 'a\\n\\nb'|indent(width='> ', blank=true) }}", {}),
    ("filter_default", "{{ missing|default('d') }}|{{ none|default('d') }}|{{ ''|default('d', true) }}"
                       "|{{ missing|d }}|{{ 0|default(5, boolean=true) }}", {}),
    ("filters_sequences", "{{ l|first }} {{ l|last }} {{ l|length }} {{ l|sum }} {{ l|max }} {{ l|min }}"
                          " {{ l|sort }} {{ l|sort(reverse=true) }} {{ l|unique|list }} {{ l|reverse|list }}"
                          " {{ l|join('-') }} {{ l|list }} {{ []|first }} {{ l|batch(2)|list }}",
     {"l": [3, 1, 2, 3]}),
    ("filters_case_insensitive", "{{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|unique|list }}"
                                 " {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ ['b', 'A']|max }}", {}),
    ("filters_attributes", "{{ m|map(attribute='role')|join(',') }}|{{ m|selectattr('role', 'equalto', 'user')|list }}"
                           "|{{ m|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}"
                           "|{{ m|selectattr('extra')|list|length }}|{{ m|map(attribute='extra', default='-')|list }}"
                           "|{{ m|sort(attribute='content')|map(attribute='content')|first }}"
                           "|{{ m|map(attribute='nested.x')|list }}|{{ m|sum(attribute='n') }}",
     {"m": [{"role": "user", "content": "b", "n": 1, "nested": {"x": 7}},
            {"role": "assistant", "content": "a", "extra": True, "n": 2}]}),
    ("filters_select", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 0, none, 'a']|select|list }}"
                       " {{ [1, 2, 3]|reject('greaterthan', 1)|list }} {{ ['1', 2]|map('string')|list }}"
                       " {{ [1.5, 2.5]|map('round')|list }} {{ ['a', 'b']|map('upper')|join }}", {}),
    ("filter_items_dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }}"
                              " {{ missing|items|list }}", {"d": {"b": 1, "a": 2}}),
    ("filters_numbers", "{{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(5) }}"
                        " {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'x'|float }} {{ -3|abs }}"
                        " {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 7|round }}"
                        " {{ 2.1|round(method='ceil') }} {{ 2.9|round(0, 'floor') }}", {}),
    ("filter_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}"
                      "|{{ d|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}"
                      "|{{ [1.0, 1e100, none, true]|tojson }}|{{ []|tojson(indent=2) }}|{{ {}|tojson }}",
     {"d": {"a": 1, "b": [1, 2.5, None, True, "x'y"], "c": {}}, "s": "é\n\"\\\u0001😀"}),
    ("filter_tojson_undefined_error", "{{ missing|tojson }}", {}),
    ("filter_format", "{{ '%s-%s'|format(1, 'a') }}", {}),
    ("filter_attr", "{{ d|attr('items')|string|length > 0 }}[{{ d|attr('a') }}]", {"d": {"a": 1}}),
    ("unknown_filter_error", "{{ 1|no_such_filter }}", {}),
    ("unknown_test_error", "{{ 1 is no_such_test }}", {}),
    # Tests
    ("tests", "{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1 is integer }}{{ 1.0 is float }}"
              "{{ 's' is string }}{{ d is mapping }}{{ l is sequence }}{{ s is sequence }}{{ d is sequence }}"
              "{{ l is iterable }}{{ missing is iterable }}{{ none is none }}{{ missing is undefined }}"
              "{{ x is defined }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}"
              "{{ false is false }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}"
              "{{ 2 is in [1, 2] }}{{ 'a' is in 'cat' }}{{ 'ab' is lower }}{{ 'AB' is upper }}"
              "{{ '1' is lower }}{{ 3 is gt 2 }}{{ 3 is ge 3 }}{{ 2 is lt 3 }}{{ 3 is le 2 }}{{ 1 is eq 1 }}"
              "{{ 1 is ne 1 }}{{ none is sameas none }}{{ l is sameas l }}{{ range is callable }}"
              "{{ 'upper' is filter }}{{ 'odd' is test }}{{ d is not mapping }}{{ x is not none }}",
     {"d": {}, "l": [1], "s": "abc", "x": 1}),
    # String methods
    ("str_methods", "{{ ' a b '.strip() }}|{{ 'xax'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}"
                    "|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}"
                    "|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '  x  y  '.split(none, 1) }}|{{ 'abc'.startswith('ab') }}"
                    "|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'abc'.upper() }}|{{ 'ABC'.lower() }}|{{ 'hi there'.title() }}"
                    "|{{ 'aXbXc'.replace('X', '-') }}|{{ 'héllo'.find('l') }}|{{ 'abc'.find('z') }}"
                    "|{{ 'abcabc'.rfind('b') }}|{{ 'aaa'.count('a') }}|{{ '-'.join(['a', 'b']) }}"
                    "|{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{0}'.format('r') }}|{{ '{n}!'.format(n=3) }}"
                    "|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ '123'.isdigit() }}|{{ 'ab'.isalpha() }}"
                    "|{{ ' '.isspace() }}|{{ 'Ab'.isupper() }}|{{ 'prefix_x'.removeprefix('prefix_') }}"
                    "|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'hello'.capitalize() }}", {}),
    ("str_method_chain", "{{ '<think>x</think>answer'.split('</think>')[-1].strip() }}", {}),
    ("dict_methods", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('x') }}", {"d": {"a": 1}}),
    ("list_append_unsafe", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("list_methods", "{{ [1, 2, 2].count(2) }} {{ ['a', 'b'].index('b') }}", {}),
    # Globals
    ("globals", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }}"
                " {{ dict(a=1, b=2) }} {{ namespace(x=1).x }} {{ strftime_now('%Y-%m-%d %H:%M %b %A') }}"
                "{% set j = joiner('+') %} {% for x in 'ab' %}{{ j() }}{{ x }}{% endfor %}", {}),
    ("range_too_big", "{{ range(200000)|length }}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}", {}),
    ("call_non_callable", "{{ 'x'() }}", {}),
    # Syntax errors
    ("syntax_unclosed_if", "{% if true %}x", {}),
    ("syntax_unclosed_tag", "{{ x", {}),
    ("syntax_unknown_tag", "{% include 'x.html' %}", {}),
    ("syntax_bad_token", "{{ x $ y }}", {}),
    ("syntax_unclosed_string", "{{ 'abc }}", {}),
    ("syntax_nested_braces", "{{ {'a': {'b': 1}} }}", {}),
    ("syntax_break_outside_loop", "{% break %}", {}),
    ("syntax_missing_tag_name", "{% %}", {}),
    # Chat-template idioms
    ("messages_idioms", "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
                        "{% set msgs = messages[1:] %}{% else %}{% set sys = 'default' %}{% set msgs = messages %}"
                        "{% endif %}{{ bos_token }}{{ sys }}{% for m in msgs %}<{{ m.role }}>{{ m['content'] | trim }}"
                        "{% if not loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
     {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": " hi "},
                   {"role": "assistant", "content": "yo"}], "bos_token": "<s>", "add_generation_prompt": True}),
    ("content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
                      "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
                      "{% endif %}{% endfor %}",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                                 {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": "c"}]}),
]


def render_snippet(template, context):
    try:
        compiled = ctu._compile_jinja_template(template)
        return {"rendered": compiled.render(**context)}
    except Exception as e:  # noqa: BLE001 - any failure is the expected answer
        return {"error": f"{type(e).__name__}: {e}"}


def render_conversation(template, case):
    extra = dict(case["extra"])
    continue_final = extra.pop("continue_final_message", False)
    if continue_final and case["add_generation_prompt"]:
        # apply_chat_template's own check, before it calls render_jinja_template.
        return {"error": "ValueError: continue_final_message and add_generation_prompt are not "
                         "compatible."}
    try:
        rendered, _ = render_jinja_template(
            conversations=[case["messages"]], tools=case.get("tools"), documents=None,
            chat_template=template, continue_final_message=continue_final,
            add_generation_prompt=case["add_generation_prompt"],
            bos_token=BOS, eos_token=EOS, **extra)
        return {"rendered": rendered[0]}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    conversations = json.loads(SHARED_CONVERSATIONS.read_text(encoding="utf-8"))
    for case in conversations:
        case.setdefault("tools", None)
    own = jinja_conversations()
    (OUT / "conversations.json").write_text(
        json.dumps(own, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    everything = conversations + own

    templates = []
    for directory in TEMPLATE_DIRS:
        for path in sorted(directory.glob("*.jinja")):
            text = path.read_bytes().decode("utf-8")
            results = [{"conversation": c["name"], **render_conversation(text, c)}
                       for c in everything]
            templates.append({"template": str(path.relative_to(REPO / "tests" / "fixtures")),
                              "results": results})
            errors = sum("error" in r for r in results)
            print(f"{path.name}: {len(results) - errors} rendered, {errors} errors",
                  file=sys.stderr)

    snippets = []
    for name, template, context in SNIPPETS:
        snippets.append({"name": name, "template": template, "context": context,
                         **render_snippet(template, context)})
    (OUT / "expected.json").write_text(
        json.dumps({"templates": templates, "snippets": snippets}, ensure_ascii=False, indent=1)
        + "\n", encoding="utf-8")
    print(f"{len(templates)} templates x {len(everything)} conversations; {len(snippets)} snippets",
          file=sys.stderr)


if __name__ == "__main__":
    main()
