// switchyard tokenize: JSON Lines in, JSON Lines out. {"text": ...} → {"ids": [...]} (no special
// tokens added), or with --decode {"ids": [...]} → {"text": ...}. A bad line gets an
// {"error": ...} line in its place (so outputs stay aligned with inputs), a message naming the
// line on stderr, and a non-zero exit once every line is done.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/verbs.h"

namespace sy {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string tokenizer;
  bool decode = false;
  bool skip_special_tokens = false;
};

Result<nlohmann::json> HandleLine(const Tokenizer& tokenizer, const std::string& line,
                                  const TokenizeArgs& args) {
  nlohmann::json request;
  try {
    request = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("not valid JSON ({})", e.what());
  }
  if (!request.is_object()) return Status::Error("expected a JSON object");
  if (!args.decode) {
    auto text = request.find("text");
    if (text == request.end() || !text->is_string())
      return Status::Error("expected {\"text\": \"...\"}");
    SY_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        tokenizer.Encode(text->get_ref<const std::string&>()));
    return nlohmann::json{{"ids", ids}};
  }
  auto ids_value = request.find("ids");
  if (ids_value == request.end() || !ids_value->is_array())
    return Status::Error("expected {\"ids\": [...]}");
  std::vector<int32_t> ids;
  ids.reserve(ids_value->size());
  for (size_t i = 0; i < ids_value->size(); ++i) {
    const auto& id = (*ids_value)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= tokenizer.vocab_size())
      return Status::Errorf("ids[{}] = {} is not a token id in [0, {})", i, id.dump(),
                            tokenizer.vocab_size());
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  SY_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(ids, args.skip_special_tokens));
  return nlohmann::json{{"text", text}};
}

void RunTokenize(const TokenizeArgs& args) {
  const std::string directory =
      args.tokenizer.empty() ? ResolveModelDirectory(args.model) : std::string();
  auto tokenizer = Tokenizer::Load(args.tokenizer.empty() ? directory : args.tokenizer);
  if (!tokenizer.ok()) FailVerb(tokenizer.status().message());
  std::string line;
  int64_t line_number = 0, failures = 0;
  std::ios::sync_with_stdio(false);
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    auto result = HandleLine(tokenizer.value(), line, args);
    if (result.ok()) {
      std::cout << result.value().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << '\n';
    } else {
      ++failures;
      const std::string message =
          fmt::format("line {}: {}", line_number, result.status().message());
      std::fprintf(stderr, "error: %s\n", message.c_str());
      std::cout << nlohmann::json{{"error", message}}.dump(-1, ' ', false,
                                                           nlohmann::json::error_handler_t::replace)
                << '\n';
    }
  }
  std::cout.flush();
  if (failures > 0) throw CLI::RuntimeError(1);
}

}  // namespace

void AddTokenizeVerb(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* verb = app.add_subcommand(
      "tokenize", "Text to token ids (or ids to text with --decode), JSON Lines on stdin/stdout");
  verb->add_option(
      "--model", args->model,
      "Checkpoint directory whose tokenizer to use (default: the default model, models/default)");
  verb->add_option("--tokenizer", args->tokenizer,
                   "A tokenizer.json file, or a directory with one");
  verb->add_flag("--decode", args->decode, "Read {\"ids\": [...]}, write {\"text\": ...}");
  verb->add_flag("--skip-special-tokens", args->skip_special_tokens,
                 "With --decode: leave special tokens out of the text");
  verb->callback([args] { RunTokenize(*args); });
}

}  // namespace sy
