// Grammar-engine timings (not a test): compile time, and the time FillNextTokenMask takes along
// random walks through real-world-like schemas, first pass (mask tables made on first use) and
// warm, on the given tokenizers. Usage: structured_mask_bench TOKENIZER.json...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include "structured/compiler.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"
using namespace sy::structured;
using Clock = std::chrono::steady_clock;
static double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
Vocabulary Load(const std::string& path) {
  auto t = sy::Tokenizer::Load(path);
  Vocabulary v;
  for (int32_t id = 0; id < t->vocab_size(); ++id) {
    v.token_bytes.emplace_back(t->TokenBytes(id));
    v.special.push_back(t->IsSpecial(id));
  }
  v.eos_ids.push_back(*t->TokenToId("<｜end▁of▁sentence｜>"));
  return v;
}
int main(int argc, char** argv) {
  const char* schemas[][2] = {
      {"function call",
       R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},"include_hourly":{"type":"boolean"}},"required":["location","unit"],"additionalProperties":false})"},
      {"nested config",
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":32},"server":{"type":"object","properties":{"host":{"type":"string","format":"ipv4"},"port":{"type":"integer","minimum":1,"maximum":65535},"tls":{"type":"object","properties":{"enabled":{"type":"boolean"},"cert":{"type":"string"}},"required":["enabled"]}},"required":["host","port"]},"workers":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"weight":{"type":"number","minimum":0,"maximum":1},"tags":{"type":"array","items":{"type":"string"},"maxItems":4}},"required":["id"]},"maxItems":8},"created":{"type":"string","format":"date-time"}},"required":["name","server"]})"},
      {"json_object", ""},
  };
  for (int arg = 1; arg < argc; ++arg) {
    const char* path = argv[arg];
    Vocabulary vocab = Load(path);
    auto t0 = Clock::now();
    GrammarCompiler compiler(std::move(vocab));
    auto t1 = Clock::now();
    std::printf("vocabulary %d (%s): byte trie built in %.0f ms\n", compiler.vocabulary().size(),
                path, Us(t0, t1) / 1000);
    for (auto& s : schemas) {
      GrammarSpec spec{
          s[1][0] ? GrammarSpec::Kind::kJsonSchema : GrammarSpec::Kind::kJsonObject, s[1], {}};
      auto c0 = Clock::now();
      auto g = compiler.Compile(spec);
      auto c1 = Clock::now();
      if (!g.ok()) {
        std::printf("%s\n", g.status().message().c_str());
        return 1;
      }
      std::mt19937 rng(1);
      std::vector<uint64_t> mask((compiler.vocabulary().size() + 63) / 64);
      std::vector<double> cold, warm;
      std::vector<int32_t> taken;
      for (int walk = 0; walk < 5; ++walk) {
        GrammarMatcher m(*g);
        std::vector<int32_t> walk_tokens;
        for (int step = 0; step < 80 && !m.IsTerminated(); ++step) {
          auto a = Clock::now();
          m.FillNextTokenMask(mask);
          auto b = Clock::now();
          cold.push_back(Us(a, b));
          std::vector<int32_t> allowed, structural;
          for (int32_t id = 0; id < compiler.vocabulary().size(); ++id)
            if ((mask[id >> 6] >> (id & 63)) & 1) {
              allowed.push_back(id);
              const auto& tb = compiler.vocabulary().token_bytes[id];
              if (tb.size() <= 4 && tb.find_first_of("\"{}[],:0123456789") != std::string::npos)
                structural.push_back(id);
            }
          double r = std::uniform_real_distribution<double>(0, 1)(rng);
          int32_t next = (!structural.empty() && r < 0.7) ? structural[rng() % structural.size()]
                                                          : allowed[rng() % allowed.size()];
          if (m.IsComplete() && r < 0.15) next = compiler.vocabulary().eos_ids[0];
          if (!m.AcceptToken(next).ok()) {
            std::printf("accept failed\n");
            return 1;
          }
          walk_tokens.push_back(next);
        }
        GrammarMatcher replay(*g);
        for (int32_t id : walk_tokens) {
          auto a = Clock::now();
          replay.FillNextTokenMask(mask);
          auto b = Clock::now();
          warm.push_back(Us(a, b));
          (void)replay.AcceptToken(id);
        }
      }
      auto mean = [](const std::vector<double>& v) {
        double s = 0;
        for (double x : v)
          s += x;
        return s / v.size();
      };
      auto pct = [](std::vector<double> v, double p) {
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, size_t(p * v.size()))];
      };
      std::printf(
          "  %-14s compile %.1f ms, %zu DFA states; first pass %.0f us/mask (tables made on first "
          "use: %zu); warm %.1f us mean, %.1f us p50, %.1f us p99 over %zu masks\n",
          s[0], Us(c0, c1) / 1000, (*g)->automaton().states.size(), mean(cold),
          (*g)->cached_entries(), mean(warm), pct(warm, 0.5), pct(warm, 0.99), warm.size());
    }
  }
}
