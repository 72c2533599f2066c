// Token masks against a brute-force checker: at every step of random walks through several
// grammars, each vocabulary token's bytes are run through the byte-level matcher from the current
// state; the mask must agree on every token (EOS: allowed iff complete; other special tokens:
// never). On the default model's tokenizer and on DeepSeek-V3's own. Also prints the time per
// mask with warm tables (informational; nothing asserted on time).
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "structured/compiler.h"
#include "structured/matcher.h"
#include "test_vocabulary.h"

namespace sy::structured {
namespace {

struct WalkStats {
  int steps = 0;
  int64_t differences = 0;
  double mask_seconds = 0;
  int timed_masks = 0;
};

bool Bit(const std::vector<uint64_t>& mask, int32_t id) {
  return (mask[id >> 6] >> (id & 63)) & 1;
}

// Random walks; every step's mask is compared with the brute-force one.
void Walk(const GrammarCompiler& compiler, const std::shared_ptr<const CompiledGrammar>& grammar,
          int walks, int max_steps, uint32_t seed, WalkStats* stats) {
  const Vocabulary& vocab = compiler.vocabulary();
  std::mt19937 rng(seed);
  std::vector<uint64_t> mask((vocab.size() + 63) / 64);
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(grammar);
    std::vector<int32_t> taken;
    for (int step = 0; step < max_steps && !m.IsTerminated(); ++step) {
      m.FillNextTokenMask(mask);
      std::vector<int32_t> allowed, structural;
      for (int32_t id = 0; id < vocab.size(); ++id) {
        bool expected;
        if (std::find(vocab.eos_ids.begin(), vocab.eos_ids.end(), id) != vocab.eos_ids.end()) {
          expected = m.IsComplete();
        } else if (vocab.special[id] || vocab.token_bytes[id].empty()) {
          expected = false;
        } else {
          expected = m.CanAcceptBytes(vocab.token_bytes[id]);
        }
        if (expected != Bit(mask, id)) {
          if (++stats->differences <= 10) {
            ADD_FAILURE() << grammar->description() << " step " << step << ": token " << id << " '"
                          << vocab.token_bytes[id] << "' brute force " << expected << ", mask "
                          << !expected;
          }
        }
        if (expected) {
          allowed.push_back(id);
          if (vocab.token_bytes[id].find_first_of("\"{}[],:0123456789") != std::string::npos &&
              vocab.token_bytes[id].size() <= 3) {
            structural.push_back(id);
          }
        }
      }
      ++stats->steps;
      ASSERT_FALSE(allowed.empty()) << grammar->description() << ": a dead end at step " << step;
      // Mostly move on structure so walks reach the grammar's deeper states; end when allowed.
      int32_t next;
      const double r = std::uniform_real_distribution<double>(0, 1)(rng);
      if (m.IsComplete() && r < 0.1) {
        next = vocab.eos_ids[0];
      } else if (!structural.empty() && r < 0.75) {
        next = structural[rng() % structural.size()];
      } else {
        next = allowed[rng() % allowed.size()];
      }
      ASSERT_TRUE(m.AcceptToken(next).ok()) << m.AcceptToken(next).message();
      taken.push_back(next);
      if (step % 7 == 6 && taken.size() >= 2) {  // roll back and retake: same state again
        ASSERT_TRUE(m.Rollback(2).ok());
        ASSERT_TRUE(m.AcceptToken(taken[taken.size() - 2]).ok());
        ASSERT_TRUE(m.AcceptToken(taken.back()).ok());
      }
    }
    // The same walk again with warm tables: the time a mask takes.
    GrammarMatcher replay(grammar);
    for (int32_t id : taken) {
      const auto start = std::chrono::steady_clock::now();
      replay.FillNextTokenMask(mask);
      stats->mask_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++stats->timed_masks;
      ASSERT_TRUE(replay.AcceptToken(id).ok());
    }
  }
}

const char* kPersonSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "score": {"type": "number", "exclusiveMinimum": -1, "maximum": 99.5},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "meta": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
    "kind": {"anyOf": [{"const": "a"}, {"type": "boolean"}]}},
  "required": ["name", "age"], "additionalProperties": false})";

const char* kTreeSchema = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{2,4}$"},
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["id"]}}})";

const char* kArithmetic = R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" expr ")" | "-" factor
)G";

struct Case {
  GrammarSpec spec;
  int walks;
};

std::vector<Case> Cases() {
  using K = GrammarSpec::Kind;
  return {
      {{K::kJsonSchema, kPersonSchema, {}}, 3},
      {{K::kJsonSchema, kTreeSchema, {}}, 3},
      {{K::kJsonObject, "", {}}, 3},
      // not, if and multipleOf's remainder automaton (rules looping per digit).
      {{K::kJsonSchema,
        R"({"type": "array", "items": {"anyOf": [{"multipleOf": 0.75},
          {"not": {"type": ["integer", "object", "array"]}}]}, "if": true,
          "then": {"maxItems": 6}})",
        {}},
       3},
      {{K::kRegex, R"(\(\d{3}\) \d{3}-\d{4}|[A-Z][a-z]+ ?\w*)", {}}, 2},
      {{K::kGbnf, kArithmetic, {}}, 3},
      {{K::kChoice, "", {"positive", "negative", "neutral", "pos"}}, 2},
  };
}

void RunOn(const std::string& tokenizer_path, int max_steps, uint32_t seed) {
  GrammarCompiler compiler(LoadVocabulary(tokenizer_path));
  ASSERT_GT(compiler.vocabulary().size(), 0);
  WalkStats total;
  for (const auto& c : Cases()) {
    auto grammar = compiler.Compile(c.spec);
    ASSERT_TRUE(grammar.ok()) << grammar.status().message();
    WalkStats stats;
    Walk(compiler, *grammar, c.walks, max_steps, seed++, &stats);
    std::printf("%-20s %3d steps, %lld differences, %.1f us per mask (warm), %zu tables\n",
                (*grammar)->description().c_str(), stats.steps,
                static_cast<long long>(stats.differences),
                stats.timed_masks ? 1e6 * stats.mask_seconds / stats.timed_masks : 0.0,
                (*grammar)->cached_entries());
    total.steps += stats.steps;
    total.differences += stats.differences;
  }
  std::printf("vocabulary of %d: %d steps checked, %lld differences\n",
              compiler.vocabulary().size(), total.steps, static_cast<long long>(total.differences));
  EXPECT_EQ(total.differences, 0);
}

TEST(StructuredMasks, MatchBruteForceOnDefaultTokenizer) {
  RunOn(DefaultTokenizerPath(), 60, 1);
}

TEST(StructuredMasks, MatchBruteForceOnDeepSeekTokenizer) {
  RunOn(DeepSeekTokenizerPath(), 12, 100);
}

}  // namespace
}  // namespace sy::structured
