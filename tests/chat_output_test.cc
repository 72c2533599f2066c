// The chat output parsers (src/chat_output): DeepSeek's tool-call formats and the reasoning split,
// whole and streamed in every split of the text; and the grammars that force tool calls, masked
// over the default model's and DeepSeek-V3's vocabularies (where the format's tokens are special
// and where they are not): the exact token where a format token belongs, masks equal to every
// token's spellings run byte by byte, and random walks that end in calls the parser reads back.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "chat_output/chat_output.h"
#include "chat_output/tool_choice.h"
#include "structured/compiler.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

namespace sy::chat_output {
namespace {

using json = nlohmann::ordered_json;

const std::string kV3Two =
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    "```json\n{\"city\": "
    "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "get_time\n```json\n{\"zone\": \"CET\",\n \"fmt\": "
    "\"```\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
const std::string kV31Two =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"<\"}"
    "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>";

// Kimi K2's: space around ids and arguments, an id without "functions.", content first.
const std::string kKimiTwo =
    "Checking.<|tool_calls_section_begin|> <|tool_call_begin|> functions.get_weather:0 "
    "<|tool_call_argument_begin|> {\"city\": \"<Paris>\"} \n<|tool_call_end|>"
    "<|tool_call_begin|>get_time:12<|tool_call_argument_begin|>{}<|tool_call_end|>"
    "<|tool_calls_section_end|>";

// DeepSeek-V3.2's DSML, as its encoding writes calls: a string value as text ('<', quotes and
// newlines in it as they are), others as JSON; a call without parameters.
const std::string kDsmlTwo =
    "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris <\"FR\">\nü</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, 2.5], \"b\": null}"
    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>";

// What a client rebuilds from streamed deltas.
struct Assembled {
  std::string reasoning, content;
  std::map<int, ToolCall> calls;
};

void Add(const OutputDelta& d, Assembled* a) {
  a->reasoning += d.reasoning;
  a->content += d.content;
  for (const auto& t : d.tool_calls) {
    ToolCall& c = a->calls[t.index];
    if (t.id) {
      EXPECT_TRUE(c.id.empty()) << "a second first delta for call " << t.index;
      c.id = *t.id;
      c.name = t.name.value_or("");
    } else {
      EXPECT_FALSE(c.id.empty()) << "arguments before the call's first delta";
    }
    c.arguments += t.arguments;
  }
}

// `budget_cut`: the output ended on its token budget (finish_reason "length").
Assembled Stream(const ChatOutputOptions& options, const std::string& text,
                 const std::vector<size_t>& cuts, bool budget_cut = false) {
  ChatOutputParser parser(options);
  Assembled a;
  size_t at = 0;
  for (size_t cut : cuts) {
    Add(parser.Feed(std::string_view(text).substr(at, cut - at)), &a);
    at = cut;
  }
  Add(parser.Feed(std::string_view(text).substr(at)), &a);
  Add(parser.Finish(budget_cut), &a);
  return a;
}

void ExpectSame(const Assembled& a, const Assembled& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (const auto& [i, c] : a.calls) {
    EXPECT_EQ(c.name, b.calls.at(i).name) << what;
    EXPECT_EQ(c.arguments, b.calls.at(i).arguments) << what;
  }
}

// Every split into two, three random ones per length, and byte by byte give the same deltas in
// total as one chunk; for a well-formed output that equals the whole-output message.
void CheckSplits(const ChatOutputOptions& options, const std::string& text,
                 bool budget_cut = false) {
  const Assembled whole = Stream(options, text, {}, budget_cut);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    ExpectSame(Stream(options, text, {cut}, budget_cut), whole, "cut at " + std::to_string(cut));
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i)
    bytes.push_back(i);
  ExpectSame(Stream(options, text, bytes, budget_cut), whole, "byte by byte");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 5 == 0) cuts.push_back(i);
    ExpectSame(Stream(options, text, cuts, budget_cut), whole,
               "random cuts " + std::to_string(trial));
  }
  const ChatMessage m = ParseChatOutput(options, text, budget_cut);
  ChatOutputParser probe(options);
  probe.Feed(text);
  probe.Finish(budget_cut);
  if (probe.CalledTools() || options.reasoning) {
    EXPECT_EQ(m.reasoning.value_or(""), whole.reasoning);
    if (!m.tool_calls.empty()) {
      EXPECT_EQ(m.content.value_or(""), whole.content);
      ASSERT_EQ(m.tool_calls.size(), whole.calls.size());
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        EXPECT_EQ(m.tool_calls[i].name, whole.calls.at(static_cast<int>(i)).name);
        EXPECT_EQ(m.tool_calls[i].arguments, whole.calls.at(static_cast<int>(i)).arguments);
      }
    }
  }
}

TEST(ToolParser, DeepSeekV3WholeOutput) {
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV3, kV3Two);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content.value_or(""), "Let me check.");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{\"zone\": \"CET\",\n \"fmt\": \"```\"}");
  EXPECT_TRUE(p.calls[0].id.starts_with("call_"));
  EXPECT_EQ(p.calls[0].id.size(), 29u);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
}

TEST(ToolParser, DeepSeekV31WholeOutput) {
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV31, kV31Two);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_FALSE(p.content.has_value());
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"<\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
}

TEST(ToolParser, KimiK2WholeOutput) {
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kKimiK2, kKimiTwo);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content.value_or(""), "Checking.");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].id, "functions.get_weather:0");  // the model's id, as vLLM returns it
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"<Paris>\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].id, "get_time:12");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  ChatOutputOptions kimi;
  kimi.tool_format = ToolCallFormat::kKimiK2;
  CheckSplits(kimi, kKimiTwo);
  CheckSplits(kimi, "no calls <|tool_calls_sect here");
  EXPECT_EQ(ToolCallFormatByName("kimi_k2"), ToolCallFormat::kKimiK2);
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kKimiK2), "kimi_k2");
}

TEST(ToolParser, DeepSeekV32Dsml) {
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV32, kDsmlTwo);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content.value_or(""), "Checking.");  // the blank line before the calls dropped
  EXPECT_EQ(p.calls[0].name, "get_weather");
  // DeepSeek's decode_dsml_to_arguments: {"KEY": VALUE} with Python's separators.
  EXPECT_EQ(p.calls[0].arguments,
            "{\"city\": \"Paris <\\\"FR\\\">\\nü\", \"days\": 3, \"opts\": {\"a\": [1, 2.5], "
            "\"b\": null}}");
  EXPECT_EQ(json::parse(p.calls[0].arguments)["city"], "Paris <\"FR\">\nü");
  EXPECT_TRUE(p.calls[0].id.starts_with("call_"));
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  ChatOutputOptions dsml;
  dsml.tool_format = ToolCallFormat::kDeepSeekV32;
  CheckSplits(dsml, kDsmlTwo);
  CheckSplits(dsml, "no calls \n <｜DSML｜functi here\n\n");
  // Only a blank line before the calls: no content.
  EXPECT_FALSE(ParseToolCalls(ToolCallFormat::kDeepSeekV32, kDsmlTwo.substr(9)).content);
  EXPECT_EQ(ToolCallFormatByName("deepseek_v32"), ToolCallFormat::kDeepSeekV32);
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kDeepSeekV32), "deepseek_v32");

  const std::string begin = "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n";
  const std::string malformed[] = {
      // a string flag that is neither true nor false
      begin +
          "<｜DSML｜parameter name=\"a\" string=\"yes\">1</｜DSML｜parameter>\n"
          "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
      // a non-string value that is not JSON
      begin +
          "<｜DSML｜parameter name=\"a\" string=\"false\">one</｜DSML｜parameter>\n"
          "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
      // text where a parameter should begin
      begin +
          "so <｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n"
          "</｜DSML｜invoke>",
      // a parameter without a name
      begin +
          "<｜DSML｜parameter name=\"\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>",
      // unterminated
      begin + "<｜DSML｜parameter name=\"a\" string=\"true\">x",
  };
  for (const std::string& text : malformed) {
    const ChatMessage m = ParseChatOutput(dsml, text);
    EXPECT_TRUE(m.tool_calls.empty()) << text;
    EXPECT_EQ(m.content.value_or(""), text);
    CheckSplits(dsml, text);
  }
  // Cut by the budget inside a string value: the arguments written so far.
  const std::string cut = begin + "<｜DSML｜parameter name=\"a\" string=\"true\">x\"y";
  const ChatMessage m = ParseChatOutput(dsml, cut, true);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"x\\\"y");
  CheckSplits(dsml, cut, true);
}

TEST(ToolParser, KimiK2MalformedAndCut) {
  ChatOutputOptions kimi;
  kimi.tool_format = ToolCallFormat::kKimiK2;
  const std::string malformed[] = {
      // an id without its index
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      // an index that is not a number
      "<|tool_calls_section_begin|><|tool_call_begin|>f:x<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      // arguments that are not JSON
      "<|tool_calls_section_begin|><|tool_call_begin|>f:0<|tool_call_argument_begin|>{a}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      // text where a call should begin
      "<|tool_calls_section_begin|>so<|tool_call_begin|>f:0<|tool_call_argument_begin|>{}"
      "<|tool_call_end|>",
      // unterminated
      "<|tool_calls_section_begin|><|tool_call_begin|>f:0<|tool_call_argument_begin|>{\"a\": ",
  };
  for (const std::string& text : malformed) {
    const ChatMessage m = ParseChatOutput(kimi, text);
    EXPECT_TRUE(m.tool_calls.empty()) << text;
    EXPECT_EQ(m.content.value_or(""), text);
    CheckSplits(kimi, text);
  }
  // Cut by the budget: the call with the arguments written so far (trailing space held back).
  const std::string cut =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:3<|tool_call_argument_begin|>"
      "{\"a\": 1 ";
  const ChatMessage m = ParseChatOutput(kimi, cut, true);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": 1");
  EXPECT_EQ(m.tool_calls[0].id, "functions.f:3");
  CheckSplits(kimi, cut, true);
}

TEST(ToolParser, NoCallsIsContent) {
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV3, "Just <｜tool text.");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content.value_or(""), "Just <｜tool text.");
}

TEST(ToolParser, MalformedOutputIsAllContent) {
  const std::string cases[] = {
      // unterminated call (the model stopped there: a stop string, end-of-sequence)
      "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1",
      // arguments that are not JSON
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{a: 1}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      // text where a call should begin
      "<｜tool▁calls▁begin｜>oops<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      // a header that never ends
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f",
      // the list opened and nothing in it
      "<｜tool▁calls▁begin｜>",
  };
  for (const std::string& text : cases) {
    const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV3, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content.value_or(""), text);
    ChatOutputOptions options;
    options.tool_format = ToolCallFormat::kDeepSeekV3;
    const ChatMessage m = ParseChatOutput(options, text);
    EXPECT_TRUE(m.tool_calls.empty());
    EXPECT_EQ(m.content.value_or(""), text);
    CheckSplits(options, text);  // streamed: the same in every split
  }
  const std::string v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": tru";
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kDeepSeekV31, v31).calls.empty());
}

// Cut by its token budget, an unfinished call is a call: the arguments written before the cut
// (what the stream sent), a header that was not whole dropped; text where a call should begin is
// still malformed.
TEST(ToolParser, AnOutputCutByItsBudgetKeepsItsCalls) {
  ChatOutputOptions v3;
  v3.tool_format = ToolCallFormat::kDeepSeekV3;
  const std::string mid_arguments =
      "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1";
  ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kDeepSeekV3, mid_arguments, true);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content.value_or(""), "x");
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1");
  EXPECT_TRUE(p.calls[0].id.starts_with("call_"));
  ChatMessage m = ParseChatOutput(v3, mid_arguments, true);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content.value_or(""), "x");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": 1");
  CheckSplits(v3, mid_arguments, true);
  // Not cut (the model stopped there on its own): malformed, all content.
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kDeepSeekV3, mid_arguments).calls.empty());

  const size_t second = kV3Two.find("get_time");
  // Cut in the second call's name, in its type's separator, in the marker that begins it.
  const size_t call_begin = kV3Two.find("<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time");
  for (const size_t end : {second + 3, second - 5, call_begin + 4}) {
    const std::string text = kV3Two.substr(0, end);
    m = ParseChatOutput(v3, text, true);
    ASSERT_EQ(m.tool_calls.size(), 1u) << text;
    EXPECT_EQ(m.tool_calls[0].name, "get_weather");
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(m.content.value_or(""), "Let me check.");
    CheckSplits(v3, text, true);
  }
  // The list opened and nothing in it yet.
  m = ParseChatOutput(v3, "Hi<｜tool▁calls▁begin｜><｜tool▁ca", true);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content.value_or(""), "Hi");
  // Text where a call should begin: malformed, cut or not.
  const std::string junk = "<｜tool▁calls▁begin｜>oops, no call";
  m = ParseChatOutput(v3, junk, true);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content.value_or(""), junk);
  CheckSplits(v3, junk, true);

  const std::string v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": tru";
  p = ParseToolCalls(ToolCallFormat::kDeepSeekV31, v31, true);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": tru");
  ChatOutputOptions v31_options;
  v31_options.tool_format = ToolCallFormat::kDeepSeekV31;
  CheckSplits(v31_options, v31, true);
}

TEST(ToolParser, StreamedEqualsWholeInEverySplit) {
  ChatOutputOptions v3;
  v3.tool_format = ToolCallFormat::kDeepSeekV3;
  CheckSplits(v3, kV3Two);
  ChatOutputOptions v31;
  v31.tool_format = ToolCallFormat::kDeepSeekV31;
  CheckSplits(v31, kV31Two);
  CheckSplits(v31, "plain answer with < and <｜ in it");
}

TEST(ToolParser, StreamingShapeIsVllms) {
  // The first delta of a call has id, name; later ones only arguments.
  ToolCallParser parser(ToolCallFormat::kDeepSeekV31);
  OutputDelta d1, d2, d3;
  parser.Feed("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>", &d1);
  ASSERT_EQ(d1.tool_calls.size(), 1u);
  EXPECT_TRUE(d1.tool_calls[0].id.has_value());
  EXPECT_EQ(d1.tool_calls[0].name.value_or(""), "get_weather");
  EXPECT_EQ(d1.tool_calls[0].arguments, "");
  parser.Feed("{\"city\": ", &d2);
  ASSERT_EQ(d2.tool_calls.size(), 1u);
  EXPECT_FALSE(d2.tool_calls[0].id.has_value());
  EXPECT_EQ(d2.tool_calls[0].arguments, "{\"city\": ");
  parser.Feed("\"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", &d3);
  parser.Finish(&d3);
  EXPECT_EQ(d3.tool_calls.at(0).arguments, "\"Rome\"}");
  EXPECT_FALSE(parser.malformed());
}

TEST(ToolParser, ParallelFalseKeepsTheFirstCall) {
  ChatOutputOptions options;
  options.tool_format = ToolCallFormat::kDeepSeekV3;
  options.max_calls = 1;
  const ChatMessage m = ParseChatOutput(options, kV3Two);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Stream(options, kV3Two, {40, 90}).calls.size(), 1u);
}

TEST(ReasoningParser, SplitsThinkBlock) {
  ChatOutputOptions r1;
  r1.reasoning = true;
  r1.starts_in_reasoning = true;
  ChatMessage m = ParseChatOutput(r1, "Let me think.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(m.reasoning.value_or("?"), "Let me think.\n");
  EXPECT_EQ(m.content.value_or("?"), "\n\nThe answer is 4.");
  CheckSplits(r1, "Let me think.\n</think>\n\nThe answer is 4.");
  m = ParseChatOutput(r1, "<think>old style</think>yes");  // a leading <think> is dropped
  EXPECT_EQ(m.reasoning.value_or("?"), "old style");
  EXPECT_EQ(m.content.value_or("?"), "yes");
  CheckSplits(r1, "<think>old style</think>yes");
  m = ParseChatOutput(r1, "never closes </thin");  // all reasoning (max_tokens)
  EXPECT_EQ(m.reasoning.value_or("?"), "never closes </thin");
  EXPECT_FALSE(m.content.has_value());
  CheckSplits(r1, "never closes </thin");
  ChatOutputOptions off = r1;
  off.starts_in_reasoning = false;  // V3.1 without thinking: all content
  m = ParseChatOutput(off, "answer </think> text");
  EXPECT_FALSE(m.reasoning.has_value());
  EXPECT_EQ(m.content.value_or("?"), "answer </think> text");
}

TEST(ReasoningParser, ThenToolCalls) {
  ChatOutputOptions options;
  options.reasoning = true;
  options.starts_in_reasoning = true;
  options.tool_format = ToolCallFormat::kDeepSeekV31;
  const std::string text = "I should look it up.</think>" + kV31Two;
  const ChatMessage m = ParseChatOutput(options, text);
  EXPECT_EQ(m.reasoning.value_or("?"), "I should look it up.");
  EXPECT_FALSE(m.content.has_value());
  EXPECT_EQ(m.tool_calls.size(), 2u);
  CheckSplits(options, text);
}

// K2-Thinking: "<think>" written by the model, the reasoning ended by "</think>" or by the call
// list itself, which stays with the answer.
TEST(ReasoningParser, KimiK2EndsAtThinkEndOrAtTheCalls) {
  ChatOutputOptions options;
  options.reasoning = true;
  options.reasoning_format = ReasoningFormat::kKimiK2;
  options.starts_in_reasoning = true;
  options.tool_format = ToolCallFormat::kKimiK2;
  const std::string direct = "<think>Need the weather." + kKimiTwo;
  ChatMessage m = ParseChatOutput(options, direct);
  EXPECT_EQ(m.reasoning.value_or("?"), "Need the weather.Checking.");
  EXPECT_FALSE(m.content.has_value());
  EXPECT_EQ(m.tool_calls.size(), 2u);
  CheckSplits(options, direct);
  const std::string closed = "<think>Easy.</think>It is 4.";
  m = ParseChatOutput(options, closed);
  EXPECT_EQ(m.reasoning.value_or("?"), "Easy.");
  EXPECT_EQ(m.content.value_or("?"), "It is 4.");
  CheckSplits(options, closed);
  EXPECT_EQ(FindReasoningEnd(ReasoningFormat::kKimiK2, "ab<|tool_calls_section_begin|>x"),
            std::make_pair(size_t{2}, size_t{2}));
  EXPECT_EQ(FindReasoningEnd(ReasoningFormat::kDeepSeekR1, "ab<|tool_calls_section_begin|>x"),
            std::make_pair(std::string::npos, std::string::npos));
  EXPECT_EQ(FindReasoningEnd(ReasoningFormat::kKimiK2, "ab</think>x").second, 10u);
}

// ---- the forcing grammars ----

structured::Vocabulary LoadVocabulary(const std::string& path) {
  auto tokenizer = Tokenizer::Load(path);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  structured::Vocabulary vocab;
  if (!tokenizer.ok()) return vocab;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    vocab.token_bytes.emplace_back(tokenizer->TokenBytes(id));
    vocab.special.push_back(tokenizer->IsSpecial(id) ? 1 : 0);
  }
  for (const AddedToken& t : tokenizer->added_tokens())
    vocab.named_tokens.emplace_back(t.content, t.id);
  auto eos = tokenizer->TokenToId("<｜end▁of▁sentence｜>");
  if (!eos) eos = tokenizer->TokenToId("<|im_end|>");  // Kimi K2's end of turn
  EXPECT_TRUE(eos.has_value());
  vocab.eos_ids.push_back(eos.value_or(0));
  return vocab;
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                   "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": false}}}
])");

std::vector<int32_t> Allowed(structured::GrammarMatcher& m, int32_t vocab_size) {
  std::vector<uint64_t> mask((vocab_size + 63) / 64);
  m.FillNextTokenMask(mask);
  std::vector<int32_t> out;
  for (int32_t id = 0; id < vocab_size; ++id)
    if ((mask[id >> 6] >> (id & 63)) & 1) out.push_back(id);
  return out;
}

// Random walks through the forced-call grammar (mostly short tokens so strings end); every
// finished walk's text is read back by the parser into calls of the tools with JSON arguments
// holding the required keys.
void WalkForcedCalls(const std::string& tokenizer_path, ToolCallFormat format, int brute_steps,
                     const json& tools = kTools) {
  structured::GrammarCompiler compiler(LoadVocabulary(tokenizer_path));
  const structured::Vocabulary& vocab = compiler.vocabulary();
  auto read = ReadToolRequest(&tools, nullptr, nullptr, format, false);
  ASSERT_TRUE(read.error.has_value());  // auto without --enable-auto-tool-choice
  const json required = "required";
  read = ReadToolRequest(&tools, &required, nullptr, format, false);
  ASSERT_FALSE(read.error) << read.error->message;
  ASSERT_TRUE(read.request && read.request->grammar);
  auto grammar = compiler.Compile(*read.request->grammar);
  ASSERT_TRUE(grammar.ok()) << grammar.status().message();
  // DSML's markers are text, not tokens.
  const std::optional<int32_t> calls_begin = vocab.NamedToken(CallsBeginMarker(format));
  ASSERT_EQ(calls_begin.has_value(), format != ToolCallFormat::kDeepSeekV32);
  std::mt19937 rng(3);
  int finished = 0;
  for (int walk = 0; walk < 12; ++walk) {
    structured::GrammarMatcher m(*grammar);
    // The first token can only be the one calls-begin token, never its text in pieces.
    if (calls_begin) EXPECT_EQ(Allowed(m, vocab.size()), std::vector<int32_t>{*calls_begin});
    std::string text;
    for (int step = 0; step < 400 && !m.IsTerminated(); ++step) {
      std::vector<int32_t> allowed = Allowed(m, vocab.size());
      ASSERT_FALSE(allowed.empty()) << "dead end after: " << text;
      if (step < brute_steps) {  // the mask against every token's spellings run byte by byte
        std::vector<int32_t> expected;
        for (int32_t id = 0; id < vocab.size(); ++id) {
          bool ok = false;
          if (id == vocab.eos_ids[0]) {
            ok = m.IsComplete();
          } else {
            for (std::string_view spelling : vocab.Spellings(id))
              ok = ok || m.CanAcceptBytes(spelling);
          }
          if (ok) expected.push_back(id);
        }
        ASSERT_EQ(allowed, expected) << "step " << step << " after: " << text;
      }
      std::vector<int32_t> short_ones;
      for (int32_t id : allowed)
        if (vocab.token_bytes[id].size() <= 2 || !vocab.IsText(id)) short_ones.push_back(id);
      const auto& pool = !short_ones.empty() && rng() % 4 != 0 ? short_ones : allowed;
      const int32_t next = pool[rng() % pool.size()];
      ASSERT_TRUE(m.AcceptToken(next).ok());
      if (next != vocab.eos_ids[0]) text += vocab.token_bytes[next];
    }
    if (!m.IsTerminated()) continue;
    ++finished;
    const ParsedToolCalls p = ParseToolCalls(format, text);
    ASSERT_FALSE(p.calls.empty()) << text;
    EXPECT_FALSE(p.content.has_value()) << text;
    for (const ToolCall& call : p.calls) {
      const json args = json::parse(call.arguments, nullptr, false);
      ASSERT_TRUE(args.is_object()) << call.arguments;
      if (call.name == "get_weather") {
        ASSERT_TRUE(args["city"].is_string()) << call.arguments;
        const std::string city = args["city"].get<std::string>();
        const auto code_points = std::count_if(city.begin(), city.end(), [](char c) {
          return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
        });
        EXPECT_LE(code_points, 12) << call.arguments;
        EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit");
        EXPECT_EQ(args.size(), 2u);
      } else if (call.name == "note") {  // DSML: a plain-text string, or a JSON one
        EXPECT_TRUE(args["text"].is_string()) << call.arguments;
        EXPECT_TRUE(args.size() == 1 || (args.size() == 2 && args["pinned"].is_boolean()))
            << call.arguments;
      } else {
        ASSERT_EQ(call.name, "add");
        EXPECT_TRUE(args["a"].is_number_integer() && args["a"] >= 0 && args["a"] <= 99);
        EXPECT_TRUE(args["b"].is_number_integer() && args["b"] >= 0 && args["b"] <= 99);
      }
    }
  }
  EXPECT_GT(finished, 0);
}

TEST(ForcedToolCalls, DefaultTokenizerV3) {
  WalkForcedCalls(std::string(SY_SOURCE_DIR) + "/configs/tokenizer/default/tokenizer.json",
                  ToolCallFormat::kDeepSeekV3, 400);
}
TEST(ForcedToolCalls, DefaultTokenizerV31) {
  WalkForcedCalls(std::string(SY_SOURCE_DIR) + "/configs/tokenizer/default/tokenizer.json",
                  ToolCallFormat::kDeepSeekV31, 400);
}
TEST(ForcedToolCalls, DeepSeekTokenizerV3) {  // the format's tokens are not special there
  WalkForcedCalls(std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3/tokenizer.json",
                  ToolCallFormat::kDeepSeekV3, 6);
}

// Kimi K2's format over a tiktoken vocabulary with Kimi's special tokens (tests/fixtures/tiktoken).
TEST(ForcedToolCalls, KimiK2Tokenizer) {
  WalkForcedCalls(std::string(SY_FIXTURES_DIR) + "/tiktoken", ToolCallFormat::kKimiK2, 6);
}

// DeepSeek-V3.2's DSML over DeepSeek-V3's vocabulary (V3.2's is the same): parameters as text
// or JSON, a required one and an optional one.
TEST(ForcedToolCalls, DeepSeekV32Dsml) {
  json tools = kTools;
  tools.push_back(json::parse(R"({"type": "function", "function": {"name": "note", "parameters":
      {"type": "object", "properties": {"text": {"type": "string", "description": "the note"},
       "pinned": {"type": "boolean"}}, "required": ["text"]}}})"));
  WalkForcedCalls(std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3/tokenizer.json",
                  ToolCallFormat::kDeepSeekV32, 6, tools);
}

TEST(ForcedToolCalls, NamedFunctionAndGateAfterThink) {
  structured::GrammarCompiler compiler(
      LoadVocabulary(std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3/tokenizer.json"));
  const structured::Vocabulary& vocab = compiler.vocabulary();
  const json named = {{"type", "function"}, {"function", {{"name", "add"}}}};
  const json no = false;
  auto read = ReadToolRequest(&kTools, &named, &no, ToolCallFormat::kDeepSeekV31, false);
  ASSERT_FALSE(read.error) << read.error->message;
  auto grammar = compiler.Compile(*read.request->grammar);
  ASSERT_TRUE(grammar.ok()) << grammar.status().message();
  const int32_t think_end = *vocab.NamedToken(kThinkEnd);
  structured::GrammarMatcher m(*grammar, think_end);
  // Before </think>: every token but end-of-sequence.
  std::vector<int32_t> allowed = Allowed(m, vocab.size());
  EXPECT_EQ(static_cast<int32_t>(allowed.size()), vocab.size() - 1);
  EXPECT_FALSE(m.AcceptToken(vocab.eos_ids[0]).ok());
  const std::string forced = "Hmm" + std::string(kThinkEnd) + std::string(kCallsBegin) +
                             std::string(kCallBegin) + "add" + std::string(kToolSep) +
                             "{\"a\": 2, \"b\": 40}" + std::string(kCallEnd) +
                             std::string(kCallsEnd);
  auto tokenizer =
      Tokenizer::Load(std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  auto ids = tokenizer->Encode(forced);
  ASSERT_TRUE(ids.ok());
  for (int32_t id : *ids) {
    if (id == think_end) EXPECT_TRUE(m.IsFree());
    ASSERT_TRUE(m.AcceptToken(id).ok()) << id << " '" << vocab.token_bytes[id] << "'";
    if (id == think_end) {  // then exactly the one token that opens the calls
      EXPECT_FALSE(m.IsFree());
      EXPECT_EQ(Allowed(m, vocab.size()), std::vector<int32_t>{*vocab.NamedToken(kCallsBegin)});
    }
  }
  EXPECT_TRUE(m.IsComplete());
  // parallel_tool_calls false: after one call only the closing token.
  EXPECT_EQ(Allowed(m, vocab.size()), std::vector<int32_t>{vocab.eos_ids[0]});
  EXPECT_TRUE(m.Rollback(1).ok());
  EXPECT_EQ(Allowed(m, vocab.size()), std::vector<int32_t>{*vocab.NamedToken(kCallsEnd)});
  // The calls-begin text spelled in pieces is not the token.
  structured::GrammarMatcher fresh(*grammar);
  EXPECT_FALSE(fresh.AcceptToken(*tokenizer->TokenToId("<")).ok());
}

// tool_choice "auto" with a JSON answer format: one grammar that takes the answer's JSON or
// calls of the tools (their arguments following the schemas), nothing else; other answer formats,
// forced calls and tool schemas the compiler refuses keep the answer's format alone.
TEST(ToolRequest, AnswerOrCallsTakesEitherAndNothingElse) {
  using structured::GrammarSpec;
  const json automatic = "auto";
  const json no = false;
  auto read = ReadToolRequest(&kTools, &automatic, &no, ToolCallFormat::kDeepSeekV3, true);
  ASSERT_FALSE(read.error) << read.error->message;
  ASSERT_FALSE(read.request->grammar);  // auto alone leaves the model free
  const GrammarSpec answer{GrammarSpec::Kind::kJsonSchema,
                           R"({"type": "object", "properties": {"sky": {"enum": ["sunny"]}},
                               "required": ["sky"], "additionalProperties": false})"};
  auto either = AnswerOrCalls(ToolCallFormat::kDeepSeekV3, *read.request, answer);
  ASSERT_TRUE(either.has_value());
  EXPECT_EQ(either->kind, GrammarSpec::Kind::kStructural);
  const std::string path = std::string(SY_SOURCE_DIR) + "/configs/tokenizer/default/tokenizer.json";
  structured::GrammarCompiler compiler(LoadVocabulary(path));
  auto tokenizer = Tokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok());
  auto compiled = compiler.Compile(*either);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  auto accepts = [&](const std::string& text) {
    structured::GrammarMatcher m(*compiled);
    auto ids = tokenizer->Encode(text);
    if (!ids.ok()) return false;
    for (int32_t id : *ids)
      if (!m.AcceptToken(id).ok()) return false;
    return m.IsComplete();
  };
  const std::string one_call = std::string(kCallBegin) + "function" + std::string(kToolSep) +
                               "add\n```json\n{\"a\": 2, \"b\": 40}\n```" + std::string(kCallEnd);
  const std::string call = std::string(kCallsBegin) + one_call + std::string(kCallsEnd);
  EXPECT_TRUE(accepts(R"({"sky": "sunny"})"));
  EXPECT_TRUE(accepts(call));
  EXPECT_FALSE(accepts(R"({"sky": "rainy"})"));  // the answer's schema holds
  EXPECT_FALSE(accepts("It is sunny."));
  EXPECT_FALSE(accepts(R"({"sky": "sunny"})" + call));
  // parallel_tool_calls false: one call.
  EXPECT_FALSE(
      accepts(std::string(kCallsBegin) + one_call + "\n" + one_call + std::string(kCallsEnd)));
  std::string bad_arguments = call;  // the tool's schema holds: b is at most 99
  bad_arguments.replace(bad_arguments.find("40"), 2, "400");
  EXPECT_FALSE(accepts(bad_arguments));

  const GrammarSpec object{GrammarSpec::Kind::kJsonObject, ""};
  auto any_object = AnswerOrCalls(ToolCallFormat::kDeepSeekV3, *read.request, object);
  ASSERT_TRUE(any_object.has_value());
  compiled = compiler.Compile(*any_object);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  EXPECT_TRUE(accepts(R"({"anything": [1, 2]})"));
  EXPECT_TRUE(accepts(call));
  EXPECT_FALSE(accepts("[1, 2]"));

  EXPECT_FALSE(AnswerOrCalls(ToolCallFormat::kDeepSeekV3, *read.request,
                             GrammarSpec{GrammarSpec::Kind::kRegex, "[a-z]+"}));
  const json required = "required";
  auto forced = ReadToolRequest(&kTools, &required, &no, ToolCallFormat::kDeepSeekV3, true);
  ASSERT_FALSE(forced.error) << forced.error->message;
  EXPECT_FALSE(AnswerOrCalls(ToolCallFormat::kDeepSeekV3, *forced.request, answer));
  // A tool schema the compiler refuses ("not"): auto never required it to compile.
  const json odd = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"x": {"not": {"minLength": 3}}}}}}])");
  auto odd_read = ReadToolRequest(&odd, &automatic, &no, ToolCallFormat::kDeepSeekV3, true);
  ASSERT_FALSE(odd_read.error) << odd_read.error->message;
  EXPECT_FALSE(AnswerOrCalls(ToolCallFormat::kDeepSeekV3, *odd_read.request, answer));
}

// The tools as vLLM hands them to the chat template: its pydantic models' field order (type,
// function: name, description, parameters), absent ones null, extra fields after them, and every
// schema in the client's key order.
TEST(ToolRequest, ToolsForTemplateTakeVllmsShape) {
  const json tools = json::parse(R"([{"function": {"parameters": {"type": "object",
      "required": ["b"], "properties": {"b": {}, "a": {}}}, "strict": true, "name": "f"},
      "type": "function", "x": 1}, {"type": "function", "function": {"name": "g",
      "description": "G"}}])");
  EXPECT_EQ(ToolsForTemplate(tools).dump(),
            R"([{"type":"function","function":{"name":"f","description":null,"parameters":)"
            R"({"type":"object","required":["b"],"properties":{"b":{},"a":{}}},"strict":true},)"
            R"("x":1},{"type":"function","function":{"name":"g","description":"G",)"
            R"("parameters":null}}])");
}

// Kimi's tokenizer class hands its template the tools with every object's keys sorted.
TEST(ToolRequest, ToolsForTemplateSortedForKimi) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "required": ["b"], "properties": {"b": {}, "a": {"z": 1,
      "y": [{"d": 0, "c": 1}]}}}}}])");
  EXPECT_EQ(ToolsForTemplate(tools, true).dump(),
            R"([{"function":{"description":null,"name":"f","parameters":{"properties":)"
            R"({"a":{"y":[{"c":1,"d":0}],"z":1},"b":{}},"required":["b"],"type":"object"}},)"
            R"("type":"function"}])");
}

TEST(ToolRequest, BadToolsNameTheField) {
  auto error = [](const json& tools, const json& choice) {
    auto read = ReadToolRequest(&tools, choice.is_null() ? nullptr : &choice, nullptr,
                                ToolCallFormat::kDeepSeekV3, true);
    return read.error ? read.error->param + ": " + read.error->message : std::string("ok");
  };
  EXPECT_EQ(error(kTools, "auto"), "ok");
  EXPECT_EQ(error(kTools, nullptr), "ok");
  EXPECT_TRUE(error(json::array(), "required").starts_with("tool_choice: needs tools"));
  EXPECT_TRUE(error(kTools, json{{"type", "function"}, {"function", {{"name", "nope"}}}})
                  .starts_with("tool_choice: names function \"nope\""));
  EXPECT_TRUE(error(kTools, "sometimes").starts_with("tool_choice: must be"));
  json bad = kTools;
  bad[1]["function"]["parameters"]["properties"]["a"] = {{"not", {{"minLength", 3}}}};
  EXPECT_EQ(error(bad, "auto"), "ok");  // auto does not compile the schemas
  const std::string refused = error(bad, "required");
  EXPECT_TRUE(refused.starts_with("tools[1].function.parameters: ")) << refused;
  EXPECT_NE(refused.find("not"), std::string::npos) << refused;
  bad = kTools;
  bad[0]["function"]["name"] = "has space";
  EXPECT_TRUE(error(bad, "auto").starts_with("tools[0].function.name"));
  bad = kTools;
  bad[0]["type"] = "retrieval";
  EXPECT_TRUE(error(bad, "auto").starts_with("tools[0].type"));
  bad = kTools;
  bad[1]["function"]["name"] = "get_weather";
  EXPECT_TRUE(
      error(bad, "auto").starts_with("tools[1].function.name: \"get_weather\" is given twice"));
  EXPECT_TRUE(error(json{{"a", 1}}, "auto").starts_with("tools: must be a list"));
}

}  // namespace
}  // namespace sy::chat_output
