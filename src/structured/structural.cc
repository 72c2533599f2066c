#include "structured/structural.h"

#include <nlohmann/json.hpp>

#include "structured/json_schema.h"
#include "structured/regex.h"

namespace sy::structured {
namespace {

using json = nlohmann::json;

class Builder {
 public:
  Builder(Grammar& grammar, const GrammarLimits& limits) : grammar_(grammar), limits_(limits) {}

  Result<Expr> Build(const json& node, const std::string& where, int depth) {
    if (depth > limits_.max_nesting)
      return Status::Errorf("{}: nested deeper than {}", where, limits_.max_nesting);
    if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
      return Status::Errorf("{}: must be an object with a string \"type\"", where);
    const std::string type = node["type"].get<std::string>();
    auto field = [&](const char* key) -> const json* {
      auto it = node.find(key);
      return it == node.end() ? nullptr : &*it;
    };
    if (type == "text") {
      const json* text = field("text");
      if (!text || !text->is_string())
        return Status::Errorf("{}: \"text\" must be a string", where);
      return Literal(text->get<std::string>());
    }
    if (type == "token") {
      const json* token = field("token");
      if (!token || !token->is_string() || token->get<std::string>().empty())
        return Status::Errorf("{}: \"token\" must be a non-empty string", where);
      return SpecialToken(token->get<std::string>());
    }
    if (type == "json_schema") {
      const json* schema = field("schema");
      if (!schema) return Status::Errorf("{}: \"schema\" is missing", where);
      auto sub = JsonSchemaGrammar(schema->dump(), limits_);
      if (!sub.ok()) return sub.status().WithContext(where);
      const int root = ImportGrammar(grammar_, *sub, fmt::format("s{}.", schemas_++));
      return Ref(root);
    }
    if (type == "regex") {
      const json* pattern = field("pattern");
      if (!pattern || !pattern->is_string())
        return Status::Errorf("{}: \"pattern\" must be a string", where);
      auto sub = RegexGrammar(pattern->get<std::string>(), limits_);
      if (!sub.ok()) return sub.status().WithContext(where);
      const int root = ImportGrammar(grammar_, *sub, fmt::format("r{}.", regexes_++));
      return Ref(root);
    }
    if (type == "sequence" || type == "alternatives") {
      const json* elements = field("elements");
      if (!elements || !elements->is_array())
        return Status::Errorf("{}: \"elements\" must be a list", where);
      std::vector<Expr> items;
      for (size_t i = 0; i < elements->size(); ++i) {
        SY_ASSIGN_OR_RETURN(
            Expr e, Build((*elements)[i], fmt::format("{}.elements[{}]", where, i), depth + 1));
        items.push_back(std::move(e));
      }
      if (type == "alternatives" && items.empty())
        return Status::Errorf("{}: \"alternatives\" needs at least one element", where);
      return type == "sequence" ? Seq(std::move(items)) : Alt(std::move(items));
    }
    if (type == "repeat") {
      const json* element = field("element");
      if (!element) return Status::Errorf("{}: \"element\" is missing", where);
      SY_ASSIGN_OR_RETURN(Expr e, Build(*element, where + ".element", depth + 1));
      int64_t min = 0, max = -1;
      if (const json* m = field("min")) {
        if (!m->is_number_integer() || m->get<int64_t>() < 0 ||
            m->get<int64_t>() > limits_.max_repeat)
          return Status::Errorf("{}: \"min\" must be an integer in [0, {}]", where,
                                limits_.max_repeat);
        min = m->get<int64_t>();
      }
      if (const json* m = field("max")) {
        if (!m->is_number_integer() || m->get<int64_t>() < -1 ||
            m->get<int64_t>() > limits_.max_repeat ||
            (m->get<int64_t>() >= 0 && m->get<int64_t>() < min))
          return Status::Errorf("{}: \"max\" must be -1 or an integer in [min, {}]", where,
                                limits_.max_repeat);
        max = m->get<int64_t>();
      }
      if (max == 0) return Epsilon();
      Expr separator = Epsilon();
      if (const json* sep = field("separator")) {
        SY_ASSIGN_OR_RETURN(separator, Build(*sep, where + ".separator", depth + 1));
      }
      // element (separator element){min-1, max-1}, optional as a whole when min is 0
      Expr rest = Repeat(Seq({separator, e}), min > 0 ? static_cast<int>(min - 1) : 0,
                         max < 0 ? -1 : static_cast<int>(max - 1));
      Expr some = Seq({e, rest});
      return min == 0 ? Optional(some) : some;
    }
    return Status::Errorf("{}: unknown type \"{}\"", where, type);
  }

 private:
  Grammar& grammar_;
  const GrammarLimits& limits_;
  int schemas_ = 0;
  int regexes_ = 0;
};

}  // namespace

Result<Grammar> StructuralGrammar(std::string_view spec_json, const GrammarLimits& limits) {
  json spec = json::parse(spec_json, nullptr, false);
  if (spec.is_discarded()) return Status::Error("the structural format is not valid JSON");
  Grammar grammar;
  const int root = grammar.AddRule("root");
  Builder builder(grammar, limits);
  SY_ASSIGN_OR_RETURN(Expr body, builder.Build(spec, "format", 0));
  grammar.rules[root].body = std::move(body);
  grammar.root = root;
  SY_RETURN_IF_ERROR(grammar.Validate());
  return grammar;
}

}  // namespace sy::structured
