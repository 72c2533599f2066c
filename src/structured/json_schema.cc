#include "structured/json_schema.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "structured/json_lexical.h"
#include "structured/regex.h"

namespace sy::structured {
namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string, std::less<>>& Annotations() {
  static const std::set<std::string, std::less<>> k = {
      "title",    "description", "default",    "examples",         "$comment",
      "readOnly", "writeOnly",   "deprecated", "contentMediaType", "contentEncoding",
      "$schema",  "definitions", "$defs"};
  return k;
}

const std::set<std::string, std::less<>>& Supported() {
  static const std::set<std::string, std::less<>> k = {"type",
                                                       "enum",
                                                       "const",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "additionalItems",
                                                       "prefixItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "multipleOf",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "$id",
                                                       "contains",
                                                       "minProperties",
                                                       "maxProperties",
                                                       "propertyNames"};
  return k;
}

// Keywords not enforced, with the one type they constrain ("" for all types): refused only when
// a value of that type is allowed by the schema.
const std::unordered_map<std::string, std::string>& UnsupportedTyped() {
  static const std::unordered_map<std::string, std::string> k = {
      {"uniqueItems", "array"},
      {"minContains", "array"},
      {"maxContains", "array"},
      {"unevaluatedItems", "array"},
      {"patternProperties", "object"},
      {"dependencies", "object"},
      {"dependentRequired", "object"},
      {"dependentSchemas", "object"},
      {"unevaluatedProperties", "object"},
  };
  return k;
}

bool IsConstraining(const std::string& key) {
  return !Annotations().count(key) && key != "$id";
}

std::string Where(const std::string& path) {
  return path.empty() ? "the root" : "'" + path + "'";
}

// Type bits for oneOf's exclusivity test; integral and non-integral numbers apart.
enum TypeBit : unsigned {
  kNull = 1,
  kBool = 2,
  kInt = 4,
  kFrac = 8,
  kString = 16,
  kArray = 32,
  kObject = 64,
  kAll = 127
};

unsigned BitsOfTypeName(const std::string& t) {
  if (t == "null") return kNull;
  if (t == "boolean") return kBool;
  if (t == "integer") return kInt;
  if (t == "number") return kInt | kFrac;
  if (t == "string") return kString;
  if (t == "array") return kArray;
  if (t == "object") return kObject;
  return 0;
}

unsigned BitsOfValue(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBool;
  if (v.is_number_integer() || v.is_number_unsigned()) return kInt;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return d == std::floor(d) ? kInt : kFrac;  // 1e75 is integral (and fits no int64_t)
  }
  if (v.is_string()) return kString;
  if (v.is_array()) return kArray;
  return kObject;
}

// A schema every value satisfies: true, or an object of annotations only.
bool AlwaysHolds(const Json& schema) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (!schema.is_object()) return false;
  for (const auto& [k, v] : schema.items())
    if (IsConstraining(k)) return false;
  return true;
}

// if/then/else where its effect is known without negating `if`: "then" or "else" without "if",
// and "if" without either, constrain nothing (draft 7); an `if` that always or never holds is
// its branch. Returns the schema without the three keywords (the branch joined by allOf), or an
// error naming the `if` whose negation it would take.
Result<Json> WithoutConditional(const Json& schema, const std::string& path) {
  Json rest = schema;
  rest.erase("if");
  rest.erase("then");
  rest.erase("else");
  if (!schema.contains("if") || (!schema.contains("then") && !schema.contains("else"))) return rest;
  const Json& condition = schema["if"];
  const bool never = condition.is_boolean() && !condition.get<bool>();
  if (!never && !AlwaysHolds(condition)) {
    return Status::Errorf(
        "unsupported keyword 'if' at {} with 'then' or 'else' (only an 'if' that always or "
        "never holds is supported: the other branch would need its negation)",
        Where(path));
  }
  const char* branch = never ? "else" : "then";
  if (!schema.contains(branch)) return rest;
  return Json{{"allOf", Json::array({std::move(rest), schema[branch]})}};
}

// The non-integral numbers, spelled positionally with a last fraction digit that is not 0 (each
// such value's one spelling here, as json_lexical.h fixes one spelling for every number).
Expr NonIntegralNumber() {
  return Seq({Optional(Byte('-')),
              Alt({Byte('0'), Seq({ByteRange('1', '9'), Star(ByteRange('0', '9'))})}), Byte('.'),
              Star(ByteRange('0', '9')), ByteRange('1', '9')});
}

bool DepthWithin(const Json& v, int limit) {
  if (limit < 0) return false;
  if (v.is_array() || v.is_object()) {
    for (const auto& item : v) {
      if (!DepthWithin(item, limit - 1)) return false;
    }
  }
  return true;
}

class SchemaConverter {
 public:
  SchemaConverter(const Json& root, const GrammarLimits& limits) : root_(root), limits_(limits) {}

  Result<Grammar> Run() {
    g_.root = g_.AddRule("root");
    ref_rules_[""] = g_.root;
    SY_ASSIGN_OR_RETURN(Expr body, Convert(root_, "", 0));
    g_.rules[g_.root].body = body;
    return std::move(g_);
  }

  Expr AnyValue() {
    if (any_value_rule_ < 0) {
      any_value_rule_ = g_.AddRule("any_value");
      const Expr value = Ref(any_value_rule_);
      const Expr ws = JsonWhitespace();
      const Expr sep = Seq({ws, Byte(','), ws});
      const Expr member = Seq({JsonString(0, -1), ws, Byte(':'), ws, value});
      const Expr object =
          Seq({Byte('{'), ws,
               Alt({Byte('}'), Seq({member, Star(Seq({sep, member})), ws, Byte('}')})})});
      const Expr array = Seq(
          {Byte('['), ws, Alt({Byte(']'), Seq({value, Star(Seq({sep, value})), ws, Byte(']')})})});
      g_.rules[any_value_rule_].body = Alt({object, array, JsonString(0, -1), JsonNumber(),
                                            Literal("true"), Literal("false"), Literal("null")});
    }
    return Ref(any_value_rule_);
  }

 private:
  Result<Expr> Convert(const Json& schema, const std::string& path, int depth) {
    if (depth > limits_.max_nesting) {
      return Status::Errorf("the schema nests more than {} subschemas deep at {}",
                            limits_.max_nesting, Where(path));
    }
    if (schema.is_boolean()) return schema.get<bool>() ? AnyValue() : Nothing();
    if (!schema.is_object()) {
      return Status::Errorf("the schema at {} is not an object or a boolean", Where(path));
    }
    if (schema.contains("if") || schema.contains("then") || schema.contains("else")) {
      SY_ASSIGN_OR_RETURN(Json plain, WithoutConditional(schema, path));
      return Convert(plain, path, depth + 1);
    }
    if (schema.contains("not")) return ConvertNot(schema, path, depth);
    SY_RETURN_IF_ERROR(CheckKeywords(schema, path));
    if (schema.contains("$ref")) {
      for (const auto& [k, v] : schema.items()) {
        if (k != "$ref" && IsConstraining(k)) {
          return Status::Errorf("'$ref' with the sibling keyword '{}' at {} is not supported", k,
                                Where(path));
        }
      }
      return RefRule(schema["$ref"], path, depth);
    }
    if (schema.contains("allOf")) {
      Json merged = Json::object();
      Json rest = schema;
      rest.erase("allOf");
      SY_RETURN_IF_ERROR(MergeInto(&merged, rest, path, depth));
      const Json& all = schema["allOf"];
      if (!all.is_array() || all.empty()) {
        return Status::Errorf("'allOf' at {} is not a non-empty array", Where(path));
      }
      for (size_t i = 0; i < all.size(); ++i) {
        SY_RETURN_IF_ERROR(MergeInto(&merged, all[i], path + "/allOf/" + std::to_string(i), depth));
      }
      return Convert(merged, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      const Json& branches = schema[key];
      if (!branches.is_array() || branches.empty()) {
        return Status::Errorf("'{}' at {} is not a non-empty array", key, Where(path));
      }
      Json rest = schema;
      rest.erase(key);
      bool has_siblings = false;
      for (const auto& [k, v] : rest.items())
        has_siblings |= IsConstraining(k);
      std::vector<Json> merged;
      for (size_t i = 0; i < branches.size(); ++i) {
        if (!has_siblings) {
          merged.push_back(branches[i]);
          continue;
        }
        Json m = Json::object();
        const std::string bpath = path + "/" + key + "/" + std::to_string(i);
        SY_RETURN_IF_ERROR(MergeInto(&m, rest, path, depth));
        SY_RETURN_IF_ERROR(MergeInto(&m, branches[i], bpath, depth));
        merged.push_back(std::move(m));
      }
      if (std::string_view(key) == "oneOf") {
        SY_RETURN_IF_ERROR(CheckExclusive(merged, path, depth));
      }
      std::vector<Expr> alts;
      for (size_t i = 0; i < merged.size(); ++i) {
        SY_ASSIGN_OR_RETURN(
            Expr e, Convert(merged[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
        alts.push_back(e);
      }
      return Alt(std::move(alts));
    }
    SY_ASSIGN_OR_RETURN(std::vector<std::string> types, TypesOf(schema, path));
    if (schema.contains("enum") || schema.contains("const"))
      return ConvertEnum(schema, types, path);
    std::vector<Expr> alts;
    for (const auto& t : types) {
      if (t == "null") {
        alts.push_back(Literal("null"));
      } else if (t == "boolean") {
        alts.push_back(Alt({Literal("true"), Literal("false")}));
      } else if (t == "string") {
        SY_ASSIGN_OR_RETURN(Expr e, ConvertString(schema, path));
        alts.push_back(e);
      } else if (t == "number" || t == "integer") {
        SY_ASSIGN_OR_RETURN(Expr e, ConvertNumber(schema, path, t == "integer"));
        alts.push_back(e);
      } else if (t == "object") {
        SY_ASSIGN_OR_RETURN(Expr e, ConvertObject(schema, path, depth));
        alts.push_back(e);
      } else if (t == "array") {
        SY_ASSIGN_OR_RETURN(Expr e, ConvertArray(schema, path, depth));
        alts.push_back(e);
      }
    }
    return Alt(std::move(alts));
  }

  // `not` where its complement is exact: not false (no constraint), not of a schema every value
  // satisfies (nothing is valid: a property that must be absent), and not of a schema that only
  // names types (the other types; excluding "integer" from the numbers leaves the non-integral
  // ones). Anything else is refused by name.
  Result<Expr> ConvertNot(const Json& schema, const std::string& path, int depth) {
    const Json& negated = schema["not"];
    Json rest = schema;
    rest.erase("not");
    if (negated.is_boolean() && !negated.get<bool>()) return Convert(rest, path, depth + 1);
    if (AlwaysHolds(negated)) return Nothing();
    bool types_only = negated.is_object() && negated.contains("type");
    if (types_only) {
      for (const auto& [k, v] : negated.items())
        types_only = types_only && (k == "type" || !IsConstraining(k));
    }
    if (!types_only) {
      return Status::Errorf(
          "unsupported keyword 'not' at {} (only 'not' of a boolean, of {{}}, or of a schema "
          "that only names types is supported)",
          Where(path));
    }
    SY_ASSIGN_OR_RETURN(std::vector<std::string> excluded, TypesOf(negated, path + "/not"));
    SY_ASSIGN_OR_RETURN(std::vector<std::string> allowed, TypesOf(rest, path));
    unsigned bits = 0;
    for (const auto& t : allowed)
      bits |= BitsOfTypeName(t);
    for (const auto& t : excluded)
      bits &= ~BitsOfTypeName(t);
    Json types = Json::array();
    for (const char* t : {"null", "boolean", "string", "array", "object"})
      if (bits & BitsOfTypeName(t)) types.push_back(t);
    if ((bits & kInt) && (bits & kFrac)) types.push_back("number");
    if ((bits & kInt) && !(bits & kFrac)) types.push_back("integer");
    std::vector<Expr> alts;
    if (!types.empty()) {
      rest["type"] = types;
      SY_ASSIGN_OR_RETURN(Expr e, Convert(rest, path, depth + 1));
      alts.push_back(e);
    }
    if ((bits & kFrac) && !(bits & kInt)) {
      for (const auto& [k, v] : rest.items()) {
        if (k != "type" && IsConstraining(k))
          return Status::Errorf(
              "unsupported keyword 'not' at {}: excluding the integers from numbers is "
              "supported only without other keywords beside it (here '{}')",
              Where(path), k);
      }
      alts.push_back(NonIntegralNumber());
    }
    return Alt(std::move(alts));
  }

  Status CheckKeywords(const Json& schema, const std::string& path) {
    std::vector<std::string> types;
    for (const auto& [k, v] : schema.items()) {
      if (Annotations().count(k) || Supported().count(k)) {
        if (k == "$id" && !path.empty()) {
          return Status::Errorf("'$id' in a subschema (at {}) is not supported", Where(path));
        }
        continue;
      }
      auto typed = UnsupportedTyped().find(k);
      if (typed != UnsupportedTyped().end()) {
        if (k == "uniqueItems" && v.is_boolean() && !v.get<bool>()) continue;
        if (types.empty()) {
          auto t = TypesOf(schema, path);
          if (!t.ok()) return t.status();
          types = *t;
        }
        const bool applies = std::any_of(types.begin(), types.end(), [&](const std::string& t) {
          return t == typed->second || (typed->second == "number" && t == "integer");
        });
        if (!applies && !schema.contains("$ref") && !schema.contains("allOf") &&
            !schema.contains("anyOf") && !schema.contains("oneOf")) {
          continue;  // constrains only values the schema already excludes
        }
      }
      return Status::Errorf("unsupported keyword '{}' at {}", k, Where(path));
    }
    return Status::Ok();
  }

  Result<std::vector<std::string>> TypesOf(const Json& schema, const std::string& path) {
    if (!schema.contains("type")) {
      return std::vector<std::string>{"null", "boolean", "object", "array", "number", "string"};
    }
    const Json& t = schema["type"];
    std::vector<std::string> types;
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& x : t) {
        if (!x.is_string()) return Status::Errorf("'type' at {} lists a non-string", Where(path));
        types.push_back(x.get<std::string>());
      }
    } else {
      return Status::Errorf("'type' at {} is not a string or an array", Where(path));
    }
    for (const auto& x : types) {
      if (!BitsOfTypeName(x)) {
        return Status::Errorf("'type' at {} names an unknown type '{}'", Where(path), x);
      }
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    if (has_number) std::erase(types, "integer");  // numbers include the integers
    std::sort(types.begin(), types.end());
    types.erase(std::unique(types.begin(), types.end()), types.end());
    return types;
  }

  Result<const Json*> ResolvePointer(const Json& ref, const std::string& path,
                                     std::string* pointer_out) {
    if (!ref.is_string()) return Status::Errorf("'$ref' at {} is not a string", Where(path));
    const std::string& s = ref.get_ref<const std::string&>();
    if (s.empty() || s[0] != '#') {
      return Status::Errorf(
          "remote '$ref' \"{}\" at {} is not supported (only \"#...\" "
          "pointers into the same schema)",
          s, Where(path));
    }
    std::string pointer;
    for (size_t i = 1; i < s.size(); ++i) {  // percent-decoding of the URI fragment
      if (s[i] == '%' && i + 2 < s.size() && isxdigit(s[i + 1]) && isxdigit(s[i + 2])) {
        pointer.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
        i += 2;
      } else {
        pointer.push_back(s[i]);
      }
    }
    if (!pointer.empty() && pointer[0] != '/') {
      return Status::Errorf(
          "'$ref' \"{}\" at {} names an anchor; only JSON pointers are "
          "supported",
          s, Where(path));
    }
    const Json* node = &root_;
    size_t pos = 0;
    while (pos < pointer.size()) {
      size_t next = pointer.find('/', pos + 1);
      if (next == std::string::npos) next = pointer.size();
      std::string token = pointer.substr(pos + 1, next - pos - 1);
      for (size_t i = 0; i + 1 < token.size(); ++i) {
        if (token[i] == '~' && token[i + 1] == '1')
          token.replace(i, 2, "/");
        else if (token[i] == '~' && token[i + 1] == '0')
          token.replace(i, 2, "~");
      }
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos && token.size() < 10 &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return Status::Errorf("'$ref' \"{}\" at {} points to nothing", s, Where(path));
      }
      pos = next;
    }
    *pointer_out = pointer;
    return node;
  }

  Result<Expr> RefRule(const Json& ref, const std::string& path, int depth) {
    std::string pointer;
    SY_ASSIGN_OR_RETURN(const Json* target, ResolvePointer(ref, path, &pointer));
    if (auto it = ref_rules_.find(pointer); it != ref_rules_.end()) return Ref(it->second);
    const int id = g_.AddRule("#" + pointer);
    ref_rules_[pointer] = id;
    SY_ASSIGN_OR_RETURN(Expr body, Convert(*target, pointer, depth + 1));
    g_.rules[id].body = body;
    return Ref(id);
  }

  // Follows a schema that is only a $ref (plus annotations) to its target.
  Result<const Json*> Follow(const Json& schema, const std::string& path, int depth) {
    const Json* s = &schema;
    for (int hops = 0; s->is_object() && s->contains("$ref"); ++hops) {
      if (hops > limits_.max_nesting) {
        return Status::Errorf("'$ref' chain at {} does not end", Where(path));
      }
      for (const auto& [k, v] : s->items()) {
        if (k != "$ref" && IsConstraining(k)) {
          return Status::Errorf("'$ref' with the sibling keyword '{}' at {} is not supported", k,
                                Where(path));
        }
      }
      std::string pointer;
      SY_ASSIGN_OR_RETURN(s, ResolvePointer((*s)["$ref"], path, &pointer));
    }
    return s;
  }

  Status MergeInto(Json* acc, const Json& branch_in, const std::string& path, int depth) {
    if (depth > limits_.max_nesting) {
      return Status::Errorf("'allOf' nests too deeply at {}", Where(path));
    }
    SY_ASSIGN_OR_RETURN(const Json* branch_ptr, Follow(branch_in, path, depth));
    Json unconditional;
    if (branch_ptr->is_object() && (branch_ptr->contains("if") || branch_ptr->contains("then") ||
                                    branch_ptr->contains("else"))) {
      SY_ASSIGN_OR_RETURN(unconditional, WithoutConditional(*branch_ptr, path));
      branch_ptr = &unconditional;
    }
    const Json& branch = *branch_ptr;
    if (acc->is_boolean()) return Status::Ok();  // already false: nothing is valid
    if (branch.is_boolean()) {
      if (!branch.get<bool>()) *acc = false;
      return Status::Ok();
    }
    if (!branch.is_object()) {
      return Status::Errorf("the schema at {} is not an object or a boolean", Where(path));
    }
    SY_RETURN_IF_ERROR(CheckKeywords(branch, path));
    auto conflict = [&](const std::string& k) {
      return Status::Errorf("'allOf' at {} combines two different '{}' (not supported)",
                            Where(path), k);
    };
    for (const auto& [k, v] : branch.items()) {
      if (!IsConstraining(k)) continue;
      if (k == "allOf") {
        if (!v.is_array()) return Status::Errorf("'allOf' at {} is not an array", Where(path));
        for (const auto& sub : v)
          SY_RETURN_IF_ERROR(MergeInto(acc, sub, path, depth + 1));
        if (acc->is_boolean()) return Status::Ok();
        continue;
      }
      if (!acc->contains(k)) {
        if (k == "properties" && acc->contains("additionalProperties") &&
            (*acc)["additionalProperties"] != Json(true)) {
          for (const auto& [name, sub] : v.items()) {
            if (!acc->contains("properties") || !(*acc)["properties"].contains(name)) {
              return conflict("additionalProperties");
            }
          }
        }
        if (k == "additionalProperties" && v != Json(true) && acc->contains("properties")) {
          for (const auto& [name, sub] : (*acc)["properties"].items()) {
            if (!branch.contains("properties") || !branch["properties"].contains(name)) {
              return conflict("additionalProperties");
            }
          }
        }
        (*acc)[k] = v;
        continue;
      }
      Json& a = (*acc)[k];
      if (a == v) continue;
      if (k == "properties") {
        if (!v.is_object()) return conflict(k);
        for (const auto& [name, sub] : v.items()) {
          if (a.contains(name)) {
            a[name] = Json{{"allOf", Json::array({a[name], sub})}};
          } else {
            if (acc->contains("additionalProperties") &&
                (*acc)["additionalProperties"] != Json(true)) {
              return conflict("additionalProperties");
            }
            a[name] = sub;
          }
        }
      } else if (k == "required") {
        if (!v.is_array() || !a.is_array()) return conflict(k);
        for (const auto& name : v) {
          if (std::find(a.begin(), a.end(), name) == a.end()) a.push_back(name);
        }
      } else if (k == "type") {
        std::set<std::string> x, y;
        for (const Json* src : std::array<const Json*, 2>{&a, &v}) {
          auto& dst = src == &a ? x : y;
          if (src->is_string())
            dst.insert(src->get<std::string>());
          else if (src->is_array())
            for (const auto& t : *src)
              if (t.is_string()) dst.insert(t.get<std::string>());
        }
        Json out = Json::array();
        for (const auto& t : x) {
          if (y.count(t))
            out.push_back(t);
          else if (t == "number" && y.count("integer"))
            out.push_back("integer");
          else if (t == "integer" && y.count("number"))
            out.push_back("integer");
        }
        a = out;
      } else if (k == "enum" || k == "const") {
        return conflict(k);
      } else if (k == "minLength" || k == "minItems" || k == "maxLength" || k == "maxItems") {
        if (!a.is_number() || !v.is_number()) return conflict(k);
        const bool take_max = k.rfind("min", 0) == 0;
        if ((v.get<double>() > a.get<double>()) == take_max) a = v;
      } else if (k == "minimum" || k == "exclusiveMinimum" || k == "maximum" ||
                 k == "exclusiveMaximum") {
        auto da = Decimal::FromJson(a);
        auto dv = Decimal::FromJson(v);
        if (!da.ok() || !dv.ok()) return conflict(k);
        const bool take_max = k == "minimum" || k == "exclusiveMinimum";
        if ((Compare(*dv, *da) > 0) == take_max) a = v;
      } else if (k == "items" && a.is_object() && v.is_object()) {
        a = Json{{"allOf", Json::array({a, v})}};
      } else if (k == "additionalProperties" && a.is_object() && v.is_object()) {
        a = Json{{"allOf", Json::array({a, v})}};
      } else if (k == "additionalProperties" && (a.is_boolean() || v.is_boolean())) {
        if (a == Json(true))
          a = v;
        else if (v == Json(true))
          continue;
        else if (a == Json(false) || v == Json(false))
          a = false;
        else
          return conflict(k);
      } else if (k == "anyOf" && a.is_array() && v.is_array() && a.size() * v.size() <= 64) {
        Json product = Json::array();
        for (const auto& x : a) {
          for (const auto& y : v)
            product.push_back(Json{{"allOf", Json::array({x, y})}});
        }
        a = product;
      } else {
        return conflict(k);
      }
    }
    return Status::Ok();
  }

  Result<unsigned> TypeBits(const Json& schema_in, const std::string& path, int depth) {
    if (depth > limits_.max_nesting) return kAll;
    SY_ASSIGN_OR_RETURN(const Json* s, Follow(schema_in, path, depth));
    if (s->is_boolean()) return s->get<bool>() ? kAll : 0u;
    if (!s->is_object()) return kAll;
    unsigned bits = kAll;
    if (s->contains("type")) {
      bits = 0;
      const Json& t = (*s)["type"];
      if (t.is_string()) bits = BitsOfTypeName(t.get<std::string>());
      if (t.is_array()) {
        for (const auto& x : t) {
          if (x.is_string()) bits |= BitsOfTypeName(x.get<std::string>());
        }
      }
    }
    if (s->contains("const")) bits &= BitsOfValue((*s)["const"]);
    if (s->contains("enum") && (*s)["enum"].is_array()) {
      unsigned e = 0;
      for (const auto& v : (*s)["enum"])
        e |= BitsOfValue(v);
      bits &= e;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (s->contains(key) && (*s)[key].is_array()) {
        unsigned u = 0;
        for (const auto& b : (*s)[key]) {
          SY_ASSIGN_OR_RETURN(unsigned x, TypeBits(b, path, depth + 1));
          u |= x;
        }
        bits &= u;
      }
    }
    if (s->contains("allOf") && (*s)["allOf"].is_array()) {
      for (const auto& b : (*s)["allOf"]) {
        SY_ASSIGN_OR_RETURN(unsigned x, TypeBits(b, path, depth + 1));
        bits &= x;
      }
    }
    return bits;
  }

  // The canonical spellings a schema is limited to by const/enum, or nullopt when it is not.
  std::optional<std::set<std::string>> Constants(const Json& s) {
    if (!s.is_object()) return std::nullopt;
    std::optional<std::set<std::string>> out;
    if (s.contains("const")) out = std::set<std::string>{CanonicalJson(s["const"])};
    if (s.contains("enum") && s["enum"].is_array()) {
      std::set<std::string> e;
      for (const auto& v : s["enum"])
        e.insert(CanonicalJson(v));
      if (out) {
        std::set<std::string> both;
        for (const auto& x : e)
          if (out->count(x)) both.insert(x);
        out = both;
      } else {
        out = e;
      }
    }
    return out;
  }

  static bool Disjoint(const std::vector<std::set<std::string>>& sets) {
    std::set<std::string> seen;
    for (const auto& s : sets) {
      for (const auto& x : s) {
        if (!seen.insert(x).second) return false;
      }
    }
    return true;
  }

  Status CheckExclusive(const std::vector<Json>& branches, const std::string& path, int depth) {
    std::vector<unsigned> bits;
    bool types_disjoint = true;
    for (const auto& b : branches) {
      SY_ASSIGN_OR_RETURN(unsigned x, TypeBits(b, path, depth + 1));
      for (unsigned y : bits)
        types_disjoint &= (x & y) == 0;
      bits.push_back(x);
    }
    if (types_disjoint) return Status::Ok();
    // Every branch a set of constants, pairwise different.
    std::vector<std::set<std::string>> constants;
    for (const auto& b : branches) {
      SY_ASSIGN_OR_RETURN(const Json* s, Follow(b, path, depth));
      auto c = Constants(*s);
      if (!c) break;
      constants.push_back(*c);
    }
    if (constants.size() == branches.size() && Disjoint(constants)) return Status::Ok();
    // Objects told apart by a property every branch requires, with different constants.
    std::vector<const Json*> objects;
    for (size_t i = 0; i < branches.size(); ++i) {
      SY_ASSIGN_OR_RETURN(const Json* s, Follow(branches[i], path, depth));
      if (bits[i] != kObject || !s->is_object() || !s->contains("properties")) break;
      objects.push_back(s);
    }
    if (objects.size() == branches.size()) {
      for (const auto& [name, unused] : (*objects[0])["properties"].items()) {
        std::vector<std::set<std::string>> tags;
        for (const Json* o : objects) {
          const Json& req = o->contains("required") ? (*o)["required"] : Json::array();
          if (std::find(req.begin(), req.end(), Json(name)) == req.end()) break;
          if (!(*o)["properties"].contains(name)) break;
          auto followed = Follow((*o)["properties"][name], path, depth);
          if (!followed.ok()) break;
          auto c = Constants(**followed);
          if (!c) break;
          tags.push_back(*c);
        }
        if (tags.size() == objects.size() && Disjoint(tags)) return Status::Ok();
      }
    }
    return Status::Errorf(
        "'oneOf' at {} has branches that are not provably exclusive (supported: "
        "branches of different types, of different constants, or objects "
        "with a required property of different constant values)",
        Where(path));
  }

  Result<Expr> ConvertEnum(const Json& schema, const std::vector<std::string>& types,
                           const std::string& path) {
    for (const auto& [k, v] : schema.items()) {
      if (IsConstraining(k) && k != "enum" && k != "const" && k != "type") {
        return Status::Errorf("'enum'/'const' together with '{}' at {} is not supported", k,
                              Where(path));
      }
    }
    unsigned allowed = 0;
    for (const auto& t : types)
      allowed |= BitsOfTypeName(t);
    std::vector<Json> values;
    if (schema.contains("const")) values.push_back(schema["const"]);
    if (schema.contains("enum")) {
      if (!schema["enum"].is_array()) {
        return Status::Errorf("'enum' at {} is not an array", Where(path));
      }
      for (const auto& v : schema["enum"]) {
        if (schema.contains("const") && v != schema["const"]) continue;
        values.push_back(v);
      }
      if (schema.contains("const")) values.erase(values.begin());
    }
    std::set<std::string> seen;
    std::vector<Expr> alts;
    for (const auto& v : values) {
      if (!(BitsOfValue(v) & allowed)) continue;
      std::string text = CanonicalJson(v);
      if (seen.insert(text).second) alts.push_back(Literal(text));
    }
    return Alt(std::move(alts));
  }

  Result<int> NonNegativeInt(const Json& schema, const char* key, int fallback,
                             const std::string& path) {
    if (!schema.contains(key)) return fallback;
    const Json& v = schema[key];
    // Integral by floor, not by a round trip through an integer: 1e75 does not fit one.
    const double d = v.is_number() ? v.get<double>() : -1;
    if (!(d >= 0) || d != std::floor(d)) {
      return Status::Errorf("'{}' at {} is not a non-negative integer", key, Where(path));
    }
    if (d > limits_.max_repeat) {
      return Status::Errorf("'{}' at {} is {}, over the supported {}", key, Where(path), v.dump(),
                            limits_.max_repeat);
    }
    return static_cast<int>(d);
  }

  Result<Expr> ConvertString(const Json& schema, const std::string& path) {
    SY_ASSIGN_OR_RETURN(int min, NonNegativeInt(schema, "minLength", 0, path));
    SY_ASSIGN_OR_RETURN(int max, NonNegativeInt(schema, "maxLength", -1, path));
    const bool has_length = min > 0 || max >= 0;
    std::vector<std::string> used;
    if (schema.contains("pattern")) used.push_back("pattern");
    if (schema.contains("format")) used.push_back("format");
    if (has_length) used.push_back(min > 0 ? "minLength" : "maxLength");
    if (used.size() > 1) {
      return Status::Errorf("'{}' together with '{}' at {} is not supported", used[0], used[1],
                            Where(path));
    }
    if (schema.contains("pattern")) {
      const Json& p = schema["pattern"];
      if (!p.is_string()) return Status::Errorf("'pattern' at {} is not a string", Where(path));
      auto body = ParseRegex(p.get<std::string>(), JsonChars, /*search=*/true, limits_);
      if (!body.ok()) {
        return body.status().WithContext(fmt::format("'pattern' at {}", Where(path)));
      }
      return Seq({Byte('"'), *body, Byte('"')});
    }
    if (schema.contains("format")) {
      const Json& f = schema["format"];
      if (!f.is_string()) return Status::Errorf("'format' at {} is not a string", Where(path));
      auto regex = FormatRegex(f.get<std::string>());
      if (!regex) {
        return Status::Errorf("unsupported format '{}' at {}", f.get<std::string>(), Where(path));
      }
      SY_ASSIGN_OR_RETURN(Expr body, ParseRegex(*regex, JsonChars, /*search=*/false, limits_));
      return Seq({Byte('"'), body, Byte('"')});
    }
    return JsonString(min, max);
  }

  Result<Expr> ConvertNumber(const Json& schema, const std::string& path, bool integer_only) {
    std::optional<NumberBound> lo, hi;
    auto bound = [&](const char* key, bool inclusive, bool lower) -> Status {
      if (!schema.contains(key)) return Status::Ok();
      const Json& v = schema[key];
      if (!v.is_number()) {
        return Status::Errorf(
            "'{}' at {} is not a number (draft 4's boolean form is not "
            "supported)",
            key, Where(path));
      }
      auto d = Decimal::FromJson(v);
      if (!d.ok()) return d.status().WithContext(fmt::format("'{}' at {}", key, Where(path)));
      std::optional<NumberBound>& slot = lower ? lo : hi;
      const int c = slot ? Compare(*d, slot->value) : 0;
      if (!slot || (lower ? c > 0 : c < 0) || (c == 0 && !inclusive)) {
        slot = NumberBound{*d, inclusive};
      }
      return Status::Ok();
    };
    SY_RETURN_IF_ERROR(bound("minimum", true, true));
    SY_RETURN_IF_ERROR(bound("exclusiveMinimum", false, true));
    SY_RETURN_IF_ERROR(bound("maximum", true, false));
    SY_RETURN_IF_ERROR(bound("exclusiveMaximum", false, false));
    if (schema.contains("multipleOf")) {
      if (lo || hi) {
        return Status::Errorf(
            "unsupported keyword 'multipleOf' at {} together with a minimum or maximum",
            Where(path));
      }
      return MultiplesOf(schema["multipleOf"], path, integer_only);
    }
    return JsonNumberInRange(lo, hi, integer_only);
  }

  // The multiples of m = p / 10^s (p an integer, s its fraction digits), spelled positionally
  // with at most s fraction digits (each such value's spelling here; no exponent): a
  // digit-by-digit automaton over the remainder mod p of the digits read, x·10^s ≡ 0 (mod p) at
  // the end. The integer part's remainders are rules (one per remainder: the digit loop), the
  // fraction's at most s digits expressions.
  Result<Expr> MultiplesOf(const Json& m, const std::string& path, bool integer_only) {
    constexpr int64_t kMaxModulus = 1000;
    auto d = m.is_number() ? Decimal::FromJson(m) : Result<Decimal>(Status::Error(""));
    if (!d.ok() || d->negative || d->IsZero()) {
      return Status::Errorf("'multipleOf' at {} is not a number greater than 0", Where(path));
    }
    const std::string digits = d->integer + d->fraction;
    const int s = static_cast<int>(d->fraction.size());
    int64_t p = 0;
    for (char c : digits) {
      p = p * 10 + (c - '0');
      if (p > kMaxModulus) {
        return Status::Errorf(
            "unsupported keyword 'multipleOf' at {}: {} has more than {} as its digits (the "
            "automaton tracks the remainder)",
            Where(path), d->ToString(), kMaxModulus);
      }
    }
    // x·10^(s-f) mod p for a remainder r of the digits read with f fraction digits.
    auto complete = [&](int64_t r, int f) {
      for (int i = f; i < s; ++i)
        r = r * 10 % p;
      return r == 0;
    };
    auto by_digit = [&](int64_t r, const std::function<Expr(int64_t)>& next) {
      std::map<int64_t, ByteSet> to;
      for (int digit = 0; digit <= 9; ++digit)
        to[(r * 10 + digit) % p].set('0' + digit);
      std::vector<Expr> alts;
      for (const auto& [target, set] : to)
        alts.push_back(Seq({Bytes(set), next(target)}));
      return Alt(std::move(alts));
    };
    // after[f][r]: f fraction digits read, remainder r (f = 0: the integer part has ended).
    std::vector<std::vector<Expr>> after(s + 1, std::vector<Expr>(p));
    for (int f = s; f >= 0; --f) {
      for (int64_t r = 0; r < p; ++r) {
        std::vector<Expr> alts;
        if (complete(r, f)) alts.push_back(Epsilon());
        if (f < s && !integer_only) {
          Expr digit = by_digit(r, [&](int64_t t) { return after[f + 1][t]; });
          alts.push_back(f == 0 ? Seq({Byte('.'), digit}) : digit);
        }
        after[f][r] = Alt(std::move(alts));
      }
    }
    const int first = g_.AddRule("multiple_of");
    std::vector<int> integer(p);
    integer[0] = first;
    for (int64_t r = 1; r < p; ++r)
      integer[r] = g_.AddRule("multiple_of");
    for (int64_t r = 0; r < p; ++r) {
      g_.rules[integer[r]].body =
          Alt({after[0][r], by_digit(r, [&](int64_t t) { return Ref(integer[t]); })});
    }
    std::map<int64_t, ByteSet> leading;
    for (int digit = 1; digit <= 9; ++digit)
      leading[digit % p].set('0' + digit);
    std::vector<Expr> starts = {Seq({Byte('0'), after[0][0]})};
    for (const auto& [target, set] : leading)
      starts.push_back(Seq({Bytes(set), Ref(integer[target])}));
    return Seq({Optional(Byte('-')), Alt(std::move(starts))});
  }

  Result<Expr> ConvertObject(const Json& schema, const std::string& path, int depth) {
    struct Member {
      std::string name;
      Expr value;
      bool required;
    };
    std::vector<Member> members;
    std::vector<std::string> required;
    if (schema.contains("required")) {
      const Json& r = schema["required"];
      if (!r.is_array()) return Status::Errorf("'required' at {} is not an array", Where(path));
      for (const auto& x : r) {
        if (!x.is_string())
          return Status::Errorf("'required' at {} lists a non-string", Where(path));
        if (std::find(required.begin(), required.end(), x.get<std::string>()) == required.end()) {
          required.push_back(x.get<std::string>());
        }
      }
    }
    auto is_required = [&](const std::string& name) {
      return std::find(required.begin(), required.end(), name) != required.end();
    };
    if (schema.contains("properties")) {
      const Json& props = schema["properties"];
      if (!props.is_object()) {
        return Status::Errorf("'properties' at {} is not an object", Where(path));
      }
      for (const auto& [name, sub] : props.items()) {
        SY_ASSIGN_OR_RETURN(Expr value, Convert(sub, path + "/properties/" + name, depth + 1));
        members.push_back({name, value, is_required(name)});
      }
    }
    Expr additional_value = Nothing();
    const Json* ap =
        schema.contains("additionalProperties") ? &schema["additionalProperties"] : nullptr;
    if (!ap || *ap != Json(false)) {
      if (ap) {
        SY_ASSIGN_OR_RETURN(additional_value,
                            Convert(*ap, path + "/additionalProperties", depth + 1));
      } else {
        additional_value = AnyValue();
      }
    }
    for (const auto& name : required) {
      if (std::none_of(members.begin(), members.end(),
                       [&](const Member& m) { return m.name == name; })) {
        // Required but not declared: its value is whatever additionalProperties allows.
        members.push_back({name, additional_value, true});
      }
    }
    std::vector<std::string> names;
    for (const auto& m : members)
      names.push_back(m.name);
    const Expr ws = JsonWhitespace();
    const Expr sep = Seq({ws, Byte(','), ws});
    const Expr colon = Seq({ws, Byte(':'), ws});
    // Member counts and name constraints, exact when no property is declared (every member is
    // then an "additional" one).
    for (const char* key : {"minProperties", "maxProperties", "propertyNames"}) {
      if (schema.contains(key) && !members.empty()) {
        return Status::Errorf(
            "'{}' together with declared or required properties at {} is not "
            "supported",
            key, Where(path));
      }
    }
    if (members.empty() && (schema.contains("minProperties") || schema.contains("maxProperties") ||
                            schema.contains("propertyNames"))) {
      SY_ASSIGN_OR_RETURN(int min_props, NonNegativeInt(schema, "minProperties", 0, path));
      SY_ASSIGN_OR_RETURN(int max_props, NonNegativeInt(schema, "maxProperties", -1, path));
      Expr key = JsonString(0, -1);
      if (schema.contains("propertyNames")) {
        const Json& pn = schema["propertyNames"];
        const std::string pn_path = path + "/propertyNames";
        if (pn.is_boolean()) {
          if (!pn.get<bool>()) key = Nothing();
        } else if (pn.is_object()) {
          for (const auto& [k, v] : pn.items()) {
            if (IsConstraining(k) && k != "minLength" && k != "maxLength" && k != "pattern" &&
                k != "format" && !(k == "type" && v == Json("string"))) {
              return Status::Errorf(
                  "'propertyNames' with '{}' at {} is not supported (only "
                  "string keywords)",
                  k, Where(path));
            }
          }
          SY_RETURN_IF_ERROR(CheckKeywords(pn, pn_path));
          SY_ASSIGN_OR_RETURN(key, ConvertString(pn, pn_path));
        } else {
          return Status::Errorf("'propertyNames' at {} is not a schema", Where(path));
        }
      }
      const Expr member = Seq({key, colon, additional_value});
      const Expr rest = Repeat(Seq({sep, member}), std::max(0, min_props - 1),
                               max_props < 0 ? -1 : max_props - 1);
      const Expr some = max_props == 0 ? Nothing() : Seq({member, rest, ws, Byte('}')});
      return Seq({Byte('{'), ws, Alt({some, min_props == 0 ? Byte('}') : Nothing()})});
    }
    const Expr extra = Seq({JsonStringExcept(names), colon, additional_value});
    const size_t n = members.size();
    std::vector<Expr> after(n + 1), first(n + 1);
    after[n] = Star(Seq({sep, extra}));
    first[n] = Seq({extra, after[n]});
    for (size_t i = n; i-- > 0;) {
      const Expr m = Seq({Literal(JsonStringLiteral(members[i].name)), colon, members[i].value});
      if (members[i].required) {
        after[i] = Seq({sep, m, after[i + 1]});
        first[i] = Seq({m, after[i + 1]});
      } else {
        after[i] = Seq({Optional(Seq({sep, m})), after[i + 1]});
        first[i] = Alt({Seq({m, after[i + 1]}), first[i + 1]});
      }
    }
    const bool can_be_empty =
        std::none_of(members.begin(), members.end(), [](const Member& m) { return m.required; });
    return Seq({Byte('{'), ws,
                Alt({Seq({first[0], ws, Byte('}')}), can_be_empty ? Byte('}') : Nothing()})});
  }

  Result<Expr> ConvertArray(const Json& schema, const std::string& path, int depth) {
    std::vector<Expr> tuple;
    Expr additional;
    auto convert_tuple = [&](const Json& list, const std::string& key) -> Status {
      if (!list.is_array()) return Status::Errorf("'{}' at {} is not an array", key, Where(path));
      for (size_t i = 0; i < list.size(); ++i) {
        SY_ASSIGN_OR_RETURN(
            Expr e, Convert(list[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
        tuple.push_back(e);
      }
      return Status::Ok();
    };
    auto convert_rest = [&](const char* key) -> Status {
      if (!schema.contains(key)) {
        additional = AnyValue();
        return Status::Ok();
      }
      auto e = Convert(schema[key], path + "/" + key, depth + 1);
      if (!e.ok()) return e.status();
      additional = *e;
      return Status::Ok();
    };
    if (schema.contains("prefixItems")) {
      if (schema.contains("items") && schema["items"].is_array()) {
        return Status::Errorf("'prefixItems' with an array 'items' at {}", Where(path));
      }
      if (schema.contains("additionalItems")) {
        return Status::Errorf("'additionalItems' with 'prefixItems' at {} is not supported",
                              Where(path));
      }
      SY_RETURN_IF_ERROR(convert_tuple(schema["prefixItems"], "prefixItems"));
      SY_RETURN_IF_ERROR(convert_rest("items"));
    } else if (schema.contains("items") && schema["items"].is_array()) {
      SY_RETURN_IF_ERROR(convert_tuple(schema["items"], "items"));
      SY_RETURN_IF_ERROR(convert_rest("additionalItems"));
    } else {
      SY_RETURN_IF_ERROR(convert_rest("items"));  // additionalItems has no effect here
    }
    SY_ASSIGN_OR_RETURN(int min, NonNegativeInt(schema, "minItems", 0, path));
    SY_ASSIGN_OR_RETURN(int max, NonNegativeInt(schema, "maxItems", -1, path));
    const int k = static_cast<int>(tuple.size());
    const Expr ws = JsonWhitespace();
    const Expr sep = Seq({ws, Byte(','), ws});
    if (schema.contains("contains")) {
      // Exact when every element is otherwise unconstrained: any elements around one that
      // matches.
      const bool free_items = !schema.contains("items") || schema["items"] == Json(true);
      if (k > 0 || !free_items || max >= 0 || min > 1) {
        return Status::Errorf(
            "'contains' together with 'items', 'prefixItems', 'maxItems' or "
            "'minItems' above 1 at {} is not supported",
            Where(path));
      }
      SY_ASSIGN_OR_RETURN(Expr wanted, Convert(schema["contains"], path + "/contains", depth + 1));
      const Expr any = AnyValue();
      return Seq(
          {Byte('['), ws, Star(Seq({any, sep})), wanted, Star(Seq({sep, any})), ws, Byte(']')});
    }
    auto item = [&](int i) { return i < k ? tuple[i] : additional; };
    // tail(i): the elements from index i on, at least one element already written.
    std::vector<Expr> tail(k + 2);
    const int last = std::max(k, 1);
    {
      const int i = last;
      if (max >= 0 && i >= max) {
        tail[i] = min <= i ? Epsilon() : Nothing();
      } else {
        tail[i] = Repeat(Seq({sep, additional}), std::max(0, min - i), max < 0 ? -1 : max - i);
      }
    }
    for (int i = last - 1; i >= 1; --i) {
      if (max >= 0 && i >= max) {
        tail[i] = min <= i ? Epsilon() : Nothing();
        continue;
      }
      const Expr e = Seq({sep, item(i), tail[i + 1]});
      tail[i] = i >= min ? Optional(e) : e;
    }
    const Expr non_empty = max == 0 ? Nothing() : Seq({item(0), tail[1]});
    return Seq(
        {Byte('['), ws, Alt({Seq({non_empty, ws, Byte(']')}), min == 0 ? Byte(']') : Nothing()})});
  }

  const Json& root_;
  const GrammarLimits& limits_;
  Grammar g_;
  std::unordered_map<std::string, int> ref_rules_;
  int any_value_rule_ = -1;
};

}  // namespace

Result<Grammar> JsonSchemaGrammar(std::string_view schema_json, const GrammarLimits& limits) {
  if (schema_json.size() > limits.max_source_bytes) {
    return Status::Errorf("the schema is {} bytes, over the limit of {}", schema_json.size(),
                          limits.max_source_bytes);
  }
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const Json::exception& e) {
    return Status::Errorf("the schema is not valid JSON: {}", e.what());
  }
  if (!DepthWithin(schema, 4 * limits.max_nesting)) {
    return Status::Errorf("the schema nests deeper than {} levels", 4 * limits.max_nesting);
  }
  SchemaConverter converter(schema, limits);
  return converter.Run();
}

Grammar AnyJsonObjectGrammar() {
  const Json root = Json{{"type", "object"}};
  const GrammarLimits limits;
  SchemaConverter converter(root, limits);
  return std::move(converter.Run()).value();
}

}  // namespace sy::structured
