// The official JSON Schema Test Suite (Debian's json-schema-test-suite, draft 7): for every
// schema the engine accepts, each valid instance is in the grammar's language and each invalid
// one is not — fed byte by byte, and (valid ones) as the default tokenizer's tokens, each of
// which the token mask must allow. Refused schemas are listed with their error, which names the
// keyword; the share accepted is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "structured/compiler.h"
#include "structured/json_lexical.h"
#include "structured/matcher.h"
#include "test_vocabulary.h"

namespace sy::structured {
namespace {

using Json = nlohmann::ordered_json;
constexpr size_t kMaxSpellings = 2000;

// Every compact canonical spelling of `v`, object members in every order (capped).
std::vector<std::string> Spellings(const Json& v) {
  if (v.is_array()) {
    std::vector<std::string> out = {"["};
    for (size_t i = 0; i < v.size(); ++i) {
      std::vector<std::string> next;
      for (const auto& item : Spellings(v[i])) {
        for (const auto& prefix : out) {
          if (next.size() < kMaxSpellings) next.push_back(prefix + (i ? "," : "") + item);
        }
      }
      out = std::move(next);
    }
    for (auto& s : out)
      s += "]";
    return out;
  }
  if (v.is_object()) {
    std::vector<std::string> keys;
    for (const auto& [k, unused] : v.items())
      keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    std::vector<std::string> out;
    do {
      std::vector<std::string> partial = {"{"};
      for (size_t i = 0; i < keys.size(); ++i) {
        std::vector<std::string> next;
        for (const auto& value : Spellings(v[keys[i]])) {
          for (const auto& prefix : partial) {
            if (next.size() < kMaxSpellings) {
              next.push_back(prefix + (i ? "," : "") + JsonStringLiteral(keys[i]) + ":" + value);
            }
          }
        }
        partial = std::move(next);
      }
      for (auto& s : partial) {
        if (out.size() < kMaxSpellings) out.push_back(s + "}");
      }
    } while (std::next_permutation(keys.begin(), keys.end()) && out.size() < kMaxSpellings);
    return out;
  }
  return {CanonicalJson(v)};
}

bool AcceptsByteByByte(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  for (char c : s) {
    if (!m.AcceptBytes(std::string(1, c)).ok()) return false;
  }
  return m.IsComplete();
}

TEST(JsonSchemaTestSuite, Draft7) {
  const std::filesystem::path dir = "/usr/share/json-schema-test-suite/tests/draft7";
  if (!std::filesystem::exists(dir)) {
    GTEST_SKIP() << dir << " is missing: apt-get install json-schema-test-suite";
  }
  auto tokenizer = Tokenizer::Load(DefaultTokenizerPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  GrammarCompiler compiler(LoadVocabulary(DefaultTokenizerPath()));
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  int groups = 0, accepted = 0, instances = 0;
  std::map<std::string, int> refused_by_file;
  std::vector<uint64_t> mask((compiler.vocabulary().size() + 63) / 64);
  for (const auto& file : files) {
    std::ifstream in(file);
    const Json cases = Json::parse(in);
    for (const auto& group : cases) {
      ++groups;
      const std::string where =
          file.filename().string() + ": " + group["description"].get<std::string>();
      auto g =
          compiler.Compile(GrammarSpec{GrammarSpec::Kind::kJsonSchema, group["schema"].dump(), {}});
      if (!g.ok()) {
        ++refused_by_file[file.filename().string()];
        std::printf("refused  %s\n         %s\n", where.c_str(), g.status().message().c_str());
        continue;
      }
      ++accepted;
      for (const auto& test : group["tests"]) {
        ++instances;
        const bool valid = test["valid"].get<bool>();
        const auto spellings = Spellings(test["data"]);
        std::string in_language;
        for (const auto& s : spellings) {
          if (AcceptsByteByByte(*g, s)) {
            in_language = s;
            break;
          }
        }
        EXPECT_EQ(!in_language.empty(), valid)
            << where << " / " << test["description"].get<std::string>() << ": "
            << test["data"].dump()
            << (valid ? " is valid but not in the language"
                      : " is invalid but in the language: " + in_language);
        if (!valid || in_language.empty()) continue;
        // The same text as tokens: every one allowed by the mask, EOS at the end.
        auto ids = tokenizer->Encode(in_language);
        ASSERT_TRUE(ids.ok());
        GrammarMatcher m(*g);
        for (int32_t id : *ids) {
          m.FillNextTokenMask(mask);
          EXPECT_TRUE((mask[id >> 6] >> (id & 63)) & 1)
              << where << ": token " << id << " of " << in_language << " masked";
          ASSERT_TRUE(m.AcceptToken(id).ok()) << where << ": " << in_language;
        }
        m.FillNextTokenMask(mask);
        const int32_t eos = compiler.vocabulary().eos_ids[0];
        EXPECT_TRUE((mask[eos >> 6] >> (eos & 63)) & 1) << where << ": EOS masked at the end";
      }
    }
  }
  std::printf(
      "\nJSON Schema Test Suite draft 7: %d of %d schemas accepted (%.1f%%), %d instances "
      "checked\n",
      accepted, groups, 100.0 * accepted / groups, instances);
  for (const auto& [file, n] : refused_by_file)
    std::printf("  refused in %s: %d\n", file.c_str(), n);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace sy::structured
