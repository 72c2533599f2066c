// libFuzzer target for the text interface. The first byte picks what the rest is:
//   0: a tokenizer.json — loading must fail with a message or give a tokenizer that encodes;
//   1: text for the default model's tokenizer — valid UTF-8 must encode and decode back to the
//      same bytes (byte-level BPE loses nothing), invalid UTF-8 must be refused;
//   2: token ids (little-endian int32) to decode — out-of-range ids refused, never read;
//   3: a JSON message list for each chat template — rendered or refused, never a crash (also
//      with the same JSON given as the request's tools);
//   4 (first byte 4 mod 8): a tiktoken.model — refused with a message, or a tokenizer with Kimi
//      K2's pattern whose ids decode back to the text wherever the vocabulary has every byte.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const sy::Tokenizer& DefaultTokenizer() {
  static const sy::Tokenizer tokenizer = [] {
    auto t = sy::Tokenizer::Load(SY_FUZZ_TOKENIZER);
    if (!t.ok()) std::abort();
    return std::move(t).value();
  }();
  return tokenizer;
}

std::string ReadTemplate(const char* stem) {
  std::ifstream in(std::string(SY_FUZZ_TEMPLATES) + "/" + stem + ".jinja", std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8 == 4 ? 4 : data[0] % 4) {
    case 4: {
      auto ranks = sy::ParseTiktokenRanks(rest, "fuzz");
      if (!ranks.ok() || ranks->size() > 4096) break;
      auto model = sy::BpeModel::FromRanks(*ranks);
      if (!model.ok()) break;
      bool all_bytes = true;
      for (int b = 0; b < 256; ++b)
        all_bytes = all_bytes && model->token_to_id().count(
                                     sy::ByteLevelAlphabet::Get().Encode(std::string(1, char(b))));
      auto pre = sy::PreTokenizer::Tiktoken(std::string(sy::kKimiK2Pattern), 400000, 25000);
      if (!pre.ok()) std::abort();
      auto t =
          sy::Tokenizer::FromParts("fuzz", std::move(pre).value(), std::move(model).value(), {});
      if (!t.ok()) break;
      const std::string text = "Fuzz 中文 it's  123456\n\n x";
      auto ids = t->Encode(text);
      if (!ids.ok()) std::abort();
      auto back = t->Decode(ids.value());
      if (all_bytes && (!back.ok() || back.value() != text)) std::abort();
      break;
    }
    case 0: {
      auto t = sy::Tokenizer::FromJson(rest, "fuzz");
      if (t.ok()) {
        auto ids = t->Encode("fuzz <x> 123 日本");
        if (ids.ok()) (void)t->Decode(ids.value());
      }
      break;
    }
    case 1: {
      const sy::Tokenizer& t = DefaultTokenizer();
      auto ids = t.Encode(rest);
      const bool valid = sy::FindInvalidUtf8(rest) == std::string_view::npos;
      if (ids.ok() != valid) std::abort();
      if (valid) {
        auto text = t.Decode(ids.value());
        if (!text.ok() || text.value() != rest) std::abort();
      }
      break;
    }
    case 2: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      const sy::Tokenizer& t = DefaultTokenizer();
      auto text = t.Decode(ids, data[0] & 4);
      bool in_range = true;
      for (int32_t id : ids)
        in_range = in_range && id >= 0 && id < t.vocab_size();
      if (text.ok() != in_range) std::abort();
      if (text.ok() && sy::FindInvalidUtf8(text.value()) != std::string_view::npos) std::abort();
      break;
    }
    case 3: {
      static const char* kStems[] = {"deepseek-v3", "deepseek-r1", "deepseek-v3-0324",
                                     "deepseek-v3.1"};
      nlohmann::ordered_json messages = nlohmann::ordered_json::parse(rest, nullptr, false);
      if (messages.is_discarded()) break;
      for (const char* stem : kStems) {
        static std::map<std::string, std::string> cache;
        std::string& text = cache[stem];
        if (text.empty()) text = ReadTemplate(stem);
        auto chat = sy::ChatTemplate::Recognize(text, "<｜begin▁of▁sentence｜>");
        if (!chat.ok()) std::abort();
        sy::ChatOptions options;
        options.thinking = data[0] & 4;
        options.add_generation_prompt = data[0] & 8;
        (void)chat->Render(messages, options);
        // The same JSON as the request's tools (any JSON: the block writes what it is given).
        options.tools = &messages;
        (void)chat->Render(messages, options);
      }
      {  // DeepSeek-V3.2's encoding (no template text)
        const sy::ChatTemplate v32 =
            sy::ChatTemplate::DeepSeekV32({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"});
        sy::ChatOptions options;
        options.thinking = data[0] & 4;
        (void)v32.Render(messages, options);
        options.tools = &messages;
        (void)v32.Render(messages, options);
      }
      break;
    }
  }
  return 0;
}
