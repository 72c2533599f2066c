// The Jinja interpreter (src/jinja) against Jinja2 itself: tests/fixtures/jinja/expected.json
// holds what transformers' renderer (Jinja2 3.1.6) wrote for each language snippet and for each
// committed chat template over each conversation (tools/tokenizer/gen_jinja_fixtures.py). Where
// Jinja2 failed, the interpreter must fail too; where a template raised, with the same message.
// The DeepSeek templates are also rendered natively: both renderings must agree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "jinja/template.h"
#include "test_support.h"
#include "tokenizer/chat_template.h"

namespace sy {
namespace {

using json = nlohmann::ordered_json;

std::string JinjaFixtures() {
  return std::string(testing::kFixturesDir) + "/jinja";
}

const json& Expected() {
  static const json* expected =
      new json(json::parse(testing::ReadFile(JinjaFixtures() + "/expected.json")));
  return *expected;
}

// The shared DeepSeek conversation set and the interpreter's own, in the generator's order.
const json& Conversations() {
  static const json* all = [] {
    auto* out = new json(json::parse(testing::ReadFile(std::string(testing::kFixturesDir) +
                                                       "/tokenizer/chat/conversations.json")));
    for (auto& c : json::parse(testing::ReadFile(JinjaFixtures() + "/conversations.json")))
      out->push_back(c);
    return out;
  }();
  return *all;
}

// strftime_now's instant in the fixtures: 2026-01-15 09:30:00.
jinja::Limits FixedClock() {
  jinja::Limits limits;
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 0;
  t.tm_mday = 15;
  t.tm_hour = 9;
  t.tm_min = 30;
  t.tm_wday = 4;  // a Thursday
  t.tm_yday = 14;
  limits.fixed_time = t;
  return limits;
}

// Where two renderings part, with a little context: chat prompts are long.
std::string Difference(const std::string& got, const std::string& want) {
  size_t at = 0;
  while (at < got.size() && at < want.size() && got[at] == want[at])
    ++at;
  const size_t from = at > 40 ? at - 40 : 0;
  return fmt::format("differs at byte {} of {} (want {}):\n  got:  {}\n  want: {}", at, got.size(),
                     want.size(), json(got.substr(from, 100)).dump(),
                     json(want.substr(from, 100)).dump());
}

std::vector<std::string> SnippetNames() {
  std::vector<std::string> names;
  for (const auto& s : Expected()["snippets"])
    names.push_back(s["name"].get<std::string>());
  return names;
}

class JinjaSnippet : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaSnippet, RendersAsJinja2) {
  const json* snippet = nullptr;
  for (const auto& s : Expected()["snippets"])
    if (s["name"] == GetParam()) snippet = &s;
  ASSERT_NE(snippet, nullptr);
  const std::string source = (*snippet)["template"].get<std::string>();
  auto parsed = jinja::Template::Parse(source);
  Result<std::string> rendered =
      parsed.ok() ? parsed->Render(jinja::Value::FromJson((*snippet)["context"]), FixedClock())
                  : Result<std::string>(parsed.status());
  SCOPED_TRACE("template: " + source);
  if (snippet->contains("rendered")) {
    ASSERT_TRUE(rendered.ok()) << rendered.status().message();
    const std::string want = (*snippet)["rendered"].get<std::string>();
    EXPECT_TRUE(*rendered == want) << Difference(*rendered, want);
  } else {
    const std::string error = (*snippet)["error"].get<std::string>();
    ASSERT_FALSE(rendered.ok()) << "Jinja2 failed (" << error
                                << ") but this rendered: " << rendered.value();
    // raise_exception's message is the template's own and reaches the user unchanged.
    if (error.rfind("TemplateError: ", 0) == 0) {
      EXPECT_EQ(rendered.status().message(), error.substr(15));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, JinjaSnippet, ::testing::ValuesIn(SnippetNames()),
                         [](const auto& info) { return info.param; });

std::vector<std::string> TemplateNames() {
  std::vector<std::string> names;
  for (const auto& t : Expected()["templates"])
    names.push_back(t["template"].get<std::string>());
  return names;
}

std::string TestName(std::string path) {
  for (char& c : path)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return path;
}

ChatOptions OptionsFor(const json& conversation, json* kwargs) {
  ChatOptions options;
  options.add_generation_prompt = conversation["add_generation_prompt"].get<bool>();
  *kwargs = conversation.value("extra", json::object());
  if (kwargs->contains("continue_final_message")) {
    options.continue_final_message = (*kwargs)["continue_final_message"].get<bool>();
    kwargs->erase("continue_final_message");
  }
  for (const char* key : {"thinking", "enable_thinking"})
    if (kwargs->contains(key)) options.thinking = (*kwargs)[key].get<bool>();
  options.template_kwargs = kwargs;
  static const std::tm clock = *FixedClock().fixed_time;
  options.fixed_time = &clock;
  return options;
}

class JinjaChatTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaChatTemplate, RendersEveryConversationAsTransformers) {
  const json* expected = nullptr;
  for (const auto& t : Expected()["templates"])
    if (t["template"] == GetParam()) expected = &t;
  ASSERT_NE(expected, nullptr);
  const std::string text = testing::ReadFile(std::string(testing::kFixturesDir) + "/" + GetParam());
  const SpecialTokens tokens{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"};
  auto chat = ChatTemplate::Interpret(text, tokens);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  auto native = ChatTemplate::Recognize(text, tokens.bos_token);
  const json& conversations = Conversations();
  ASSERT_EQ(conversations.size(), (*expected)["results"].size());
  int rendered_count = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    const json& conversation = conversations[i];
    const json& result = (*expected)["results"][i];
    ASSERT_EQ(result["conversation"], conversation["name"]);
    SCOPED_TRACE("conversation " + conversation["name"].get<std::string>());
    json kwargs;
    ChatOptions options = OptionsFor(conversation, &kwargs);
    json tools = conversation.value("tools", json());
    if (!tools.is_null()) options.tools = &tools;
    auto rendered = chat->Render(conversation["messages"], options);
    if (result.contains("rendered")) {
      ASSERT_TRUE(rendered.ok()) << rendered.status().message();
      const std::string want = result["rendered"].get<std::string>();
      EXPECT_TRUE(*rendered == want) << Difference(*rendered, want);
      ++rendered_count;
      // The native rendering of a recognised template agrees (tools aside: natively they are
      // appended as vLLM's DeepSeek tool templates do, and the official templates ignore them).
      if (native.ok() && tools.is_null()) {
        auto natively = native->Render(conversation["messages"], options);
        ASSERT_TRUE(natively.ok()) << natively.status().message();
        EXPECT_TRUE(*natively == *rendered) << "native: " << Difference(*natively, *rendered);
      }
    } else {
      const std::string error = result["error"].get<std::string>();
      EXPECT_FALSE(rendered.ok()) << "transformers failed (" << error
                                  << ") but this rendered: " << rendered.value().substr(0, 200);
      if (!rendered.ok() && error.rfind("TemplateError: ", 0) == 0) {
        EXPECT_EQ(rendered.status().message(), "chat template: " + error.substr(15));
      }
    }
  }
  EXPECT_GT(rendered_count, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, JinjaChatTemplate, ::testing::ValuesIn(TemplateNames()),
                         [](const auto& info) { return TestName(info.param); });

// A request may send its own template: whatever it does, rendering ends with an error, not a
// hang, a crash or unbounded memory.
TEST(JinjaLimits, HostileTemplatesEndInErrors) {
  jinja::Limits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  const json context = json::object();
  struct Case {
    const char* template_text;
    const char* message_part;
  };
  for (const Case& c : std::vector<Case>{
           {"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "steps"},
           {"{{ 'x' * 100000000 }}", "bytes"},
           {"{% set ns = namespace(s='abcdefgh') %}{% for i in range(30) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "bytes"},
           {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest deeper"},
           {"{{ range(1000000) }}", "Range too big"},
           {"{{ 9223372036854775807 + 1 }}", "overflow"},
           {"{{ 2 ** 64 }}", "overflow"},
           // A namespace made to contain itself: printing, comparing or serializing it ends.
           {"{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}", "contain themselves"},
           {"{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns.a | tojson }}",
            "not JSON serializable"},
           // Lists nested by a loop, one level an iteration.
           {"{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = [ns.l] %}"
            "{% endfor %}{{ ns.l }}",
            "nest deeper"},
       }) {
    SCOPED_TRACE(c.template_text);
    auto parsed = jinja::Template::Parse(c.template_text);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    auto rendered = parsed->Render(jinja::Value::FromJson(context), limits);
    ASSERT_FALSE(rendered.ok());
    EXPECT_NE(rendered.status().message().find(c.message_part), std::string::npos)
        << rendered.status().message();
  }
  // Nesting deep enough to overflow a recursive parser's stack is refused while parsing.
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  auto parsed = jinja::Template::Parse(deep);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("nests too deeply"), std::string::npos);
  std::string deep_blocks;
  for (int i = 0; i < 5000; ++i)
    deep_blocks += "{% if true %}";
  EXPECT_FALSE(jinja::Template::Parse(deep_blocks).ok());
}

// Request JSON nested past what a template's values may hold is an error naming it, not a
// stack overflow.
TEST(JinjaLimits, DeepRequestJsonIsRefused) {
  std::string deep = "\"x\"";
  for (int i = 0; i < 5000; ++i)
    deep = "[" + deep + "]";
  json messages =
      json::array({{{"role", "user"}, {"content", "hi"}, {"extra", json::parse(deep)}}});
  auto chat = ChatTemplate::Interpret("{% for m in messages %}{{ m.content }}{% endfor %}",
                                      SpecialTokens{"<s>", "</s>"});
  ASSERT_TRUE(chat.ok());
  auto rendered = chat->Render(messages, ChatOptions{});
  ASSERT_FALSE(rendered.ok());
  EXPECT_NE(rendered.status().message().find("nest deeper than 512"), std::string::npos)
      << rendered.status().message();
}

TEST(ChatTemplateCache, KeepsTheMostRecentlyUsed) {
  ChatTemplateCache cache(2);
  const SpecialTokens tokens{"<s>", "</s>"};
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto render = [&](const std::string& text) {
    auto chat = cache.Interpret(text, tokens);
    EXPECT_TRUE(chat.ok()) << chat.status().message();
    return chat.ok() ? chat->Render(messages, ChatOptions{}).value() : std::string();
  };
  EXPECT_EQ(render("A{{ messages[0].content }}"), "Ahi");
  EXPECT_EQ(render("B{{ bos_token }}"), "B<s>");
  EXPECT_EQ(render("A{{ messages[0].content }}"), "Ahi");  // a hit
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(render("C"), "C");  // evicts B, the least recently used
  EXPECT_EQ(render("B{{ bos_token }}"), "B<s>");
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(render("C"), "C");
  EXPECT_EQ(cache.hits(), 2);
  // Other special tokens are another entry; a template that does not parse is not kept.
  auto other = cache.Interpret("B{{ bos_token }}", SpecialTokens{"<bos>", "</s>"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->Render(messages, ChatOptions{}).value(), "B<bos>");
  EXPECT_FALSE(cache.Interpret("{% if %}", tokens).ok());
  EXPECT_FALSE(cache.Interpret("{% if %}", tokens).ok());
  EXPECT_EQ(cache.hits(), 2);
}

TEST(JinjaErrors, NameTheLine) {
  auto parsed = jinja::Template::Parse("line one\n{% if x %}\n{{ x | nope }}\n{% endif %}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "line 3: No filter named 'nope'.");
  parsed = jinja::Template::Parse("a\nb\n{{ missing.attr }}");
  ASSERT_TRUE(parsed.ok());
  auto rendered = parsed->Render(jinja::Value::FromJson(json::object()));
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(), "line 3: 'missing' is undefined");
  EXPECT_FALSE(jinja::Template::Parse("\xff\xfe{{ x }}").ok());
}

TEST(JinjaContentFormat, DetectsTemplatesThatLoopOverContent) {
  const SpecialTokens tokens{"<s>", "</s>"};
  auto parts = ChatTemplate::Interpret(
      "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
      tokens);
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->takes_content_parts());
  auto text = ChatTemplate::Interpret("{% for m in messages %}{{ m.content }}{% endfor %}", tokens);
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->takes_content_parts());
}

// A template that is not DeepSeek's loads (interpreted) where it used to be refused, and the
// request's chat_template_kwargs reach it as variables.
TEST(JinjaChatTemplateLoad, AnyTemplateLoadsAndSeesKwargs) {
  const SpecialTokens tokens{"<s>", "</s>"};
  auto chat = ChatTemplate::Load(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% if style is defined %} ({{ style }}){% endif "
      "%}{% endif %}",
      tokens);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_EQ(chat->kind(), ChatTemplateKind::kJinja);
  json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  ChatOptions options;
  json kwargs = {{"style", "brief"}, {"messages", "ignored: the conversation is not replaced"}};
  options.template_kwargs = &kwargs;
  auto rendered = chat->Render(messages, options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().message();
  EXPECT_EQ(*rendered, "<s>[user] hi\n[assistant] (brief)");
  auto broken = ChatTemplate::Load("{% for m in messages %}", tokens);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("chat template: line 1"), std::string::npos);
}

}  // namespace
}  // namespace sy
