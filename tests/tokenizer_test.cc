// The tokenizer against Hugging Face `tokenizers` (ids and decoded text on a committed corpus,
// DeepSeek-V3's and V4's tokenizer.json) and the chat templates against transformers'
// apply_chat_template (jinja2). Fixtures: tests/fixtures/tokenizer, made by
// tools/tokenizer/make_tokenizer_fixtures.sh.
#include <gtest/gtest.h>

#include <filesystem>

#include <fstream>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/text_codec.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace sy {
namespace {

using json = nlohmann::json;

std::string TokenizerFixtures() {
  return std::string(testing::kFixturesDir) + "/tokenizer";
}

const Tokenizer& LoadOnce(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) {
    auto t = Tokenizer::Load(TokenizerFixtures() + "/" + name);
    EXPECT_TRUE(t.ok()) << t.status().message();
    slot = std::make_unique<Tokenizer>(std::move(t).value());
  }
  return *slot;
}

std::string Printable(const std::string& text) {
  return text.size() > 120 ? text.substr(0, 120) + "…" : text;
}

class CorpusTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CorpusTest, IdsAndDecodingMatchHuggingFace) {
  const Tokenizer& tokenizer = LoadOnce(GetParam());
  const auto corpus = testing::ReadJsonLines(TokenizerFixtures() + "/corpus.jsonl");
  const auto expected =
      testing::ReadJsonLines(TokenizerFixtures() + "/" + GetParam() + "/expected.jsonl");
  ASSERT_EQ(corpus.size(), expected.size());
  ASSERT_GE(corpus.size(), 100u);
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string name = corpus[i]["name"];
    ASSERT_EQ(name, expected[i]["name"].get<std::string>());
    const std::string text = corpus[i]["text"];
    auto ids = tokenizer.Encode(text);
    ASSERT_TRUE(ids.ok()) << name << ": " << ids.status().message();
    const auto want = expected[i]["ids"].get<std::vector<int32_t>>();
    if (ids.value() != want) {
      ++mismatches;
      size_t at = 0;
      while (at < want.size() && at < ids->size() && want[at] == (*ids)[at])
        ++at;
      ADD_FAILURE() << name << " (" << Printable(text) << "): ids differ at position " << at
                    << " of " << want.size() << " expected / " << ids->size() << " got";
    }
    auto decoded = tokenizer.Decode(want);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(decoded.value(), expected[i]["decoded"].get<std::string>()) << name;
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(DeepSeek, CorpusTest, ::testing::Values("deepseek-v3", "deepseek-v4"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(TokenizerTest, SpecialTokensInsideTextAreSingleIds) {
  const Tokenizer& tokenizer = LoadOnce("deepseek-v3");
  auto ids = tokenizer.Encode("<｜begin▁of▁sentence｜>Hi<｜User｜><｜end▁of▁sentence｜>");
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 4u);
  EXPECT_EQ(ids->front(), 0);
  EXPECT_EQ(ids->back(), 1);
  EXPECT_EQ((*ids)[ids->size() - 2], *tokenizer.TokenToId("<｜User｜>"));
  EXPECT_TRUE(tokenizer.IsSpecial(0));
  // V3 marks the role tokens as added but not special: skipping specials keeps them.
  EXPECT_FALSE(tokenizer.IsSpecial(*tokenizer.TokenToId("<｜User｜>")));
  auto skipped = tokenizer.Decode(*ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(skipped.value(), "Hi<｜User｜>");
}

TEST(TokenizerTest, BadInputIsAnErrorNamingIt) {
  const Tokenizer& tokenizer = LoadOnce("deepseek-v3");
  auto bad = tokenizer.Encode(std::string("ok \xC3\x28 then", 10));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("byte offset 3"), std::string::npos)
      << bad.status().message();
  std::vector<int32_t> ids = {5, static_cast<int32_t>(tokenizer.vocab_size()), 7};
  auto decoded = tokenizer.Decode(ids);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("position 1"), std::string::npos);
}

TEST(TokenizerTest, DecodingSplitCharactersGivesReplacementCharacters) {
  const Tokenizer& tokenizer = LoadOnce("deepseek-v3");
  auto ids = tokenizer.Encode("🦙");
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 1u);  // a rare emoji spans several byte tokens
  auto first = tokenizer.Decode(std::span(ids->data(), 1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first.value().find("\xEF\xBF\xBD"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix(tokenizer.TokenBytes((*ids)[0])), 0u);
}

// A small tokenizer.json built in the test: every byte a token, a few merges.
std::string TinyTokenizerJson(const std::string& pre_tokenizer, const std::string& extra = "") {
  json vocab = json::object();
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(alphabet.CodePointOf(static_cast<uint8_t>(b)), &symbol);
    vocab[symbol] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["aa"] = 258;
  json root = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}},
                                    {{"id", 301}, {"content", "<xy>"}, {"special", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", json::parse(pre_tokenizer)},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"a b", json::array({"ab", "c"}), "a a"})}}}};
  std::string text = root.dump();
  if (!extra.empty()) text = extra;
  return text;
}

std::vector<int32_t> EncodeOrDie(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? ids.value() : std::vector<int32_t>{};
}

TEST(TokenizerTest, MergesByRankLeftmostFirstInBothMergePaths) {
  auto t = Tokenizer::FromJson(TinyTokenizerJson("null"), "tiny");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(EncodeOrDie(*t, "abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(EncodeOrDie(*t, "aaa"), (std::vector<int32_t>{258, 'a'}));
  // Added tokens: leftmost, then longest.
  EXPECT_EQ(EncodeOrDie(*t, "c<xy><x>"), (std::vector<int32_t>{'c', 301, 300}));
  // A piece longer than the rescanning limit takes the heap path: same answer.
  std::string long_text;
  std::vector<int32_t> want;
  for (int i = 0; i < 40; ++i) {
    long_text += "abcaaa";
    want.insert(want.end(), {257, 258, 'a'});
  }
  EXPECT_EQ(EncodeOrDie(*t, long_text), want);
}

TEST(TokenizerTest, SplitBehaviorsFollowTokenizers) {
  auto split = [](const std::string& behavior, bool invert, const std::string& text) {
    auto pre = PreTokenizer::FromJson(json{{"type", "Split"},
                                           {"pattern", {{"Regex", "-+"}}},
                                           {"behavior", behavior},
                                           {"invert", invert}});
    EXPECT_TRUE(pre.ok()) << pre.status().message();
    std::string buffer = text;
    std::vector<TextPiece> pieces;
    EXPECT_TRUE((*pre)->Split(&buffer, &pieces).ok());
    std::vector<std::string> out;
    for (auto p : pieces)
      out.push_back(buffer.substr(p.begin, p.end - p.begin));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Isolated", false, "a-b--c-"), (V{"a", "-", "b", "--", "c", "-"}));
  EXPECT_EQ(split("Removed", false, "a-b--c-"), (V{"a", "b", "c"}));
  EXPECT_EQ(split("MergedWithPrevious", false, "-a-b--c"), (V{"-", "a-", "b--", "c"}));
  EXPECT_EQ(split("MergedWithNext", false, "-a-b--c-"), (V{"-a", "-b", "--c", "-"}));
  EXPECT_EQ(split("Removed", true, "a-b--c"), (V{"-", "--"}));
}

TEST(TokenizerTest, OnigurumaEscapesKeepTheirMeaning) {
  auto translated = OnigurumaToPcre2("\\s+(?!\\S)|[^\\s\\p{L}]");
  ASSERT_TRUE(translated.ok());
  // NEL (U+0085) is whitespace to Oniguruma, not to PCRE2's own \s.
  EXPECT_NE(translated->find("\\x{85}"), std::string::npos);
  EXPECT_FALSE(OnigurumaToPcre2("[\\S]").ok());
  auto pre = PreTokenizer::FromJson(
      json{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}});
  ASSERT_TRUE(pre.ok());
  std::string text =
      "a\xC2\x85"
      "b\xE3\x80\x80"
      "c";
  std::vector<TextPiece> pieces;
  ASSERT_TRUE((*pre)->Split(&text, &pieces).ok());
  EXPECT_EQ(pieces.size(), 3u);
}

TEST(TokenizerTest, UnsupportedFilesAreClearErrors) {
  auto expect_error = [](const std::string& text, const std::string& fragment) {
    auto t = Tokenizer::FromJson(text, "tokenizer.json");
    ASSERT_FALSE(t.ok()) << "accepted: " << text.substr(0, 80);
    EXPECT_NE(t.status().message().find(fragment), std::string::npos) << t.status().message();
  };
  expect_error("{not json", "not valid JSON");
  json base = json::parse(TinyTokenizerJson("null"));
  json unigram = base;
  unigram["model"]["type"] = "Unigram";
  expect_error(unigram.dump(), "Unigram");
  json metaspace = base;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(metaspace.dump(), "Metaspace");
  json nfc = base;
  nfc["normalizer"] = {{"type", "NFC"}};
  expect_error(nfc.dump(), "NFC");
  json bad_merge = base;
  bad_merge["model"]["merges"].push_back("zz qq");
  expect_error(bad_merge.dump(), "merges[3]");
  json bad_regex = base;
  bad_regex["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(bad_regex.dump(), "pre_tokenizer");
  json wrong_type = base;  // found by the fuzzer: a flag of the wrong type threw
  wrong_type["added_tokens"][0]["special"] = "yes";
  expect_error(wrong_type.dump(), "malformed");
  json huge_id = base;  // found by the fuzzer: a table sized by a corrupt id ran out of memory
  huge_id["added_tokens"][0]["id"] = 2000000000;
  expect_error(huge_id.dump(), "added_tokens[0]");
  json sparse = base;
  sparse["model"]["vocab"]["zz"] = 100000000;
  expect_error(sparse.dump(), "ids must be");
  auto missing = Tokenizer::Load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent"), std::string::npos);
}

TEST(Utf8Test, LossyDecodingReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("a\xF0\x9F\x98"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xFF"), 3u);
  EXPECT_EQ(FindInvalidUtf8("ok\xF5"), 2u);
}

// ---- chat templates ----

std::string TemplateText(const std::string& stem) {
  return testing::ReadFile(TokenizerFixtures() + "/templates/" + stem + ".jinja");
}

class ChatTemplateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateTest, RendersLikeTransformers) {
  const std::string stem = GetParam();
  auto chat = ChatTemplate::Recognize(TemplateText(stem), "<｜begin▁of▁sentence｜>");
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_EQ(chat->name(), stem);
  const json cases =
      json::parse(testing::ReadFile(TokenizerFixtures() + "/chat/conversations.json"));
  const json expected =
      json::parse(testing::ReadFile(TokenizerFixtures() + "/chat/" + stem + ".expected.json"));
  ASSERT_EQ(cases.size(), expected.size());
  ASSERT_GE(cases.size(), 20u);
  const Tokenizer& tokenizer = LoadOnce("deepseek-v3");
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i]["name"];
    ASSERT_EQ(name, expected[i]["name"].get<std::string>());
    ChatOptions options;
    options.add_generation_prompt = cases[i].value("add_generation_prompt", true);
    const json extra = cases[i].value("extra", json::object());
    // The template reads `thinking`, or `enable_thinking` when `thinking` is not given.
    options.thinking = extra.value("thinking", extra.value("enable_thinking", false));
    options.continue_final_message = extra.value("continue_final_message", false);
    auto rendered = chat->Render(cases[i]["messages"], options);
    if (expected[i].contains("error")) {
      EXPECT_FALSE(rendered.ok()) << name << ": jinja2 raised " << expected[i]["error"]
                                  << " but switchyard rendered " << rendered.value();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status().message();
    EXPECT_EQ(rendered.value(), expected[i]["rendered"].get<std::string>()) << name;
    auto ids = tokenizer.Encode(rendered.value());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(ids.value(), expected[i]["ids"].get<std::vector<int32_t>>()) << name;
  }
}

// DeepSeek-V3.2's encoding (no template: DeepSeek's encoding_dsv32.py, as vLLM drives it) on
// committed conversations rendered by that Python (tools/deepseek_v32/make_encoding_fixtures.py):
// chat and thinking modes, tools, DSML calls with every kind of value, tool results, dropped
// reasoning, a developer turn, and the conversations the encoding refuses.
TEST(ChatTemplateTest, DeepSeekV32EncodingMatchesDeepSeeksPython) {
  using ordered = nlohmann::ordered_json;  // the tools' and arguments' keys in their order
  const ordered cases = ordered::parse(
      testing::ReadFile(std::string(testing::kFixturesDir) + "/deepseek-v32-encoding/cases.json"));
  ASSERT_GE(cases.size(), 20u);
  const ChatTemplate chat =
      ChatTemplate::DeepSeekV32({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"});
  EXPECT_EQ(chat.kind(), ChatTemplateKind::kDeepSeekV3_2);
  int errors = 0;
  for (const ordered& c : cases) {
    const std::string name = c["name"];
    ChatOptions options;
    options.thinking = c["thinking"].get<bool>();
    if (!c["tools"].is_null()) options.tools = &c["tools"];
    auto rendered = chat.Render(c["messages"], options);
    if (c.contains("error")) {
      ++errors;
      EXPECT_FALSE(rendered.ok()) << name << ": the encoding raised " << c["error"]
                                  << " but switchyard rendered " << rendered.value();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status().message();
    EXPECT_EQ(rendered.value(), c["rendered"].get<std::string>()) << name;
  }
  EXPECT_EQ(errors, 3);
}

// A deepseek_v32 checkpoint whose tokenizer has no template (V3.2's release) gets the encoding; a
// template it has wins; another model type without one has none (an error when a chat comes).
TEST(ChatTemplateTest, DeepSeekV32CheckpointsWithoutATemplateGetTheEncoding) {
  const std::string source = std::string(SY_SOURCE_DIR) + "/models/default";
  nlohmann::ordered_json tokenizer_config =
      nlohmann::ordered_json::parse(testing::ReadFile(source + "/tokenizer_config.json"));
  const std::string with_template = tokenizer_config.dump();
  tokenizer_config.erase("chat_template");
  for (const auto& [model_type, keep_template, expected] :
       std::vector<std::tuple<std::string, bool, std::string>>{
           {"deepseek_v32", false, "deepseek-v3.2 (encoding_dsv32)"},
           {"deepseek_v32", true, "deepseek-v3"},  // the default model's template
           {"deepseek_v3", false, ""}}) {
    const std::string dir =
        testing::TempDirectory("v32_codec_" + model_type + (keep_template ? "_t" : ""));
    std::filesystem::copy_file(source + "/tokenizer.json", dir + "/tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    testing::WriteFile(dir + "/tokenizer_config.json",
                       keep_template ? with_template : tokenizer_config.dump());
    testing::WriteFile(dir + "/config.json", "{\"model_type\": \"" + model_type + "\"}");
    auto codec = TextCodec::Load(dir);
    ASSERT_TRUE(codec.ok()) << codec.status().message();
    if (expected.empty()) {
      EXPECT_FALSE(codec->chat.has_value()) << model_type;
      continue;
    }
    ASSERT_TRUE(codec->chat.has_value()) << model_type;
    EXPECT_EQ(codec->chat->name(), expected) << model_type << " " << keep_template;
  }
}

INSTANTIATE_TEST_SUITE_P(DeepSeek, ChatTemplateTest,
                         ::testing::Values("deepseek-v3", "deepseek-r1", "deepseek-v3-0324",
                                           "deepseek-v3.1"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-' || c == '.') c = '_';
                           return name;
                         });

// The official templates never render `tools`; switchyard appends vLLM's tool-template block for
// the variant to the system prompt and changes nothing else.
TEST(ChatTemplateTest, ToolsAreAppendedToTheSystemPrompt) {
  // The server hands the block vLLM's shape of each tool (chat_output::ToolsForTemplate); the
  // block writes it in the order given, as transformers' tojson (sort_keys=False) does.
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "description": null,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
          "required": ["city"]}}}])");
  const json messages = json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"}])");
  const std::string bos = "<｜begin▁of▁sentence｜>";
  // Keys in the order given (the client's), not sorted.
  const std::string spelled =
      R"({"type": "function", "function": {"name": "get_weather", "description": null, )"
      R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}, )"
      R"("required": ["city"]}}})";
  for (const auto& [stem, header] :
       std::vector<std::pair<std::string, std::string>>{{"deepseek-v3", "\n\n# Tools\n\n"},
                                                        {"deepseek-v3-0324", "\n\n# Tools\n\n"},
                                                        {"deepseek-r1", "\n\nYou are a helpful"},
                                                        {"deepseek-v3.1", "\n\n## Tools\n"}}) {
    auto chat = ChatTemplate::Recognize(TemplateText(stem), bos);
    ASSERT_TRUE(chat.ok());
    ChatOptions plain;
    ChatOptions with = plain;
    with.tools = &tools;
    const std::string without = chat->Render(messages, plain).value();
    const std::string rendered = chat->Render(messages, with).value();
    const std::string prefix = bos + "Be brief.";
    ASSERT_TRUE(rendered.starts_with(prefix + header)) << stem << ": " << rendered;
    EXPECT_TRUE(rendered.ends_with(without.substr(prefix.size()))) << stem << ": " << rendered;
    EXPECT_NE(rendered.find(spelled), std::string::npos) << stem << ": " << rendered;
    const nlohmann::ordered_json none = nlohmann::ordered_json::array();
    with.tools = &none;
    EXPECT_EQ(chat->Render(messages, with).value(), without) << stem;
  }
}

TEST(ChatTemplateTest, UnknownTemplatesAreRefusedByName) {
  auto chat = ChatTemplate::Recognize("{{ messages[0]['content'] }}", "<s>");
  ASSERT_FALSE(chat.ok());
  EXPECT_NE(chat.status().message().find("not recognised"), std::string::npos);
  EXPECT_NE(chat.status().message().find("deepseek-v3"), std::string::npos);
  // One byte changed is another template.
  std::string text = TemplateText("deepseek-v3");
  text.back() = ' ';
  EXPECT_FALSE(ChatTemplate::Recognize(text, "<s>").ok());
  EXPECT_FALSE(ChatTemplate::Recognize("", "<s>").ok());
}

TEST(ChatTemplateTest, ConfigFromTheCheckpointDirectory) {
  auto config = LoadTokenizerConfig(TokenizerFixtures() + "/deepseek-v3");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->bos_token, "<｜begin▁of▁sentence｜>");
  auto chat = ChatTemplate::Recognize(config->chat_template, config->bos_token);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_EQ(chat->kind(), ChatTemplateKind::kDeepSeekV3);
  auto rendered = chat->Render(json::parse(R"([{"role":"system","content":"S"},
      {"role":"user","content":"U1"},{"role":"assistant","content":"A1"},
      {"role":"user","content":"U2"}])"),
                               ChatOptions{});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(rendered.value(),
            "<｜begin▁of▁sentence｜>S<｜User｜>U1<｜Assistant｜>A1<｜end▁of▁sentence｜><｜User｜>U2"
            "<｜Assistant｜>");
  auto bad = chat->Render(json::parse(R"([{"role":"user","content":null}])"), ChatOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[0]"), std::string::npos);
}

// Where transformers keeps a checkpoint's templates: tokenizer_config.json's "chat_template" (a
// string, or named templates), replaced by chat_template.jinja and
// additional_chat_templates/NAME.jinja where those are there.
TEST(ChatTemplateTest, TemplatesBesideTheConfigAsTransformersReadsThem) {
  const std::string dir = testing::TempDirectory("chat_template_files");
  auto write = [&](const std::string& name, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(dir + "/" + name).parent_path());
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
  };
  write("tokenizer_config.json",
        R"({"bos_token": "<s>", "chat_template": [{"name": "default", "template": "D"},
            {"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]})");
  auto config = LoadTokenizerConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->chat_template, "D");
  EXPECT_EQ(config->tool_use_chat_template, "T");
  write("chat_template.jinja", "J");
  config = LoadTokenizerConfig(dir);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->chat_template, "J");
  EXPECT_EQ(config->tool_use_chat_template, "");  // the files replace the config's templates
  EXPECT_EQ(config->source, dir + "/chat_template.jinja");
  write("additional_chat_templates/tool_use.jinja", "JT");
  config = LoadTokenizerConfig(dir);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->chat_template, "J");
  EXPECT_EQ(config->tool_use_chat_template, "JT");
  EXPECT_EQ(config->bos_token, "<s>");  // the rest of the config still read
}

}  // namespace
}  // namespace sy
