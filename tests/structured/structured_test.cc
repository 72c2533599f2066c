// The grammar engine's front ends and matcher, byte by byte: regular expressions, choices, GBNF,
// JSON Schema keywords, and the errors bad input gets (each naming the problem).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "structured/compiler.h"
#include "structured/json_lexical.h"
#include "structured/matcher.h"

namespace sy::structured {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(GrammarSpec::Kind kind, const std::string& text) {
  auto g = CompileForBytes(GrammarSpec{kind, text, {}});
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : nullptr;
}

// Whether `s` is a whole string of the language (fed byte by byte).
bool Matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  for (char c : s) {
    if (!m.AcceptBytes(std::string(1, c)).ok()) return false;
  }
  return m.IsComplete();
}
// Whether `s` is a prefix of some string of the language.
bool Prefix(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return m.AcceptBytes(s).ok();
}

std::string Error(GrammarSpec::Kind kind, const std::string& text) {
  auto g = CompileForBytes(GrammarSpec{kind, text, {}});
  return g.ok() ? "" : g.status().message();
}

constexpr auto kRegex = GrammarSpec::Kind::kRegex;
constexpr auto kGbnf = GrammarSpec::Kind::kGbnf;
constexpr auto kSchema = GrammarSpec::Kind::kJsonSchema;

// The request path's check: CompileForBytes's verdict, the same when remembered.
TEST(StructuredCheck, RemembersTheVerdictByText) {
  const GrammarSpec good{GrammarSpec::Kind::kJsonSchema, R"({"type": "integer", "maximum": 9})"};
  const GrammarSpec bad{GrammarSpec::Kind::kJsonSchema,
                        R"({"type": "array", "uniqueItems": true})"};
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(CheckCompiles(good).ok());
    const Status s = CheckCompiles(bad);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(), CompileForBytes(bad).status().message());
    EXPECT_NE(s.message().find("uniqueItems"), std::string::npos) << s.message();
  }
}

TEST(StructuredRegex, LiteralsClassesQuantifiers) {
  auto g = Compile(kRegex, R"(^[a-c]+\d{2,3}(x|yz)?\.$)");
  EXPECT_TRUE(Matches(g, "ab12."));
  EXPECT_TRUE(Matches(g, "c999yz."));
  EXPECT_FALSE(Matches(g, "ab1."));
  EXPECT_FALSE(Matches(g, "ab1234."));
  EXPECT_FALSE(Matches(g, "d12."));
  EXPECT_FALSE(Matches(g, "ab12y."));
  EXPECT_TRUE(Prefix(g, "ab12y"));
}

TEST(StructuredRegex, EscapesNegationAndUnicode) {
  auto g = Compile(kRegex, R"([^\s\d]\w*\u00e9\x41[\-a]{2}.)");
  EXPECT_TRUE(Matches(g,
                      "k_9\xC3\xA9"
                      "A-a\xE2\x82\xAC"));  // é, then € as '.'
  EXPECT_FALSE(Matches(g,
                       " x\xC3\xA9"
                       "A--!"));
  EXPECT_FALSE(Matches(g,
                       "kk\xC3\xA9"
                       "A--\n"));  // '.' excludes line terminators
  // A partial UTF-8 sequence is a prefix; an invalid byte is not.
  auto any = Compile(kRegex, "..");
  EXPECT_TRUE(Prefix(any, "\xE2\x82"));
  EXPECT_FALSE(Prefix(any, "\xFF"));
  EXPECT_FALSE(Prefix(any, "\xED\xA0"));  // a surrogate's encoding
}

TEST(StructuredRegex, LazyQuantifiersAndBraces) {
  auto g = Compile(kRegex, "a+?b{1,}?c{,2}");  // "{,2}" is literal text in ECMAScript
  EXPECT_TRUE(Matches(g, "aabbc{,2}"));
  EXPECT_FALSE(Matches(g, "aabbcc"));
}

TEST(StructuredRegex, ErrorsNameTheConstruct) {
  EXPECT_NE(Error(kRegex, R"((a)\1)").find("backreferences"), std::string::npos);
  EXPECT_NE(Error(kRegex, "a(?=b)").find("lookahead"), std::string::npos);
  EXPECT_NE(Error(kRegex, "a(?<!b)").find("lookbehind"), std::string::npos);
  EXPECT_NE(Error(kRegex, R"(\bword)").find("word boundaries"), std::string::npos);
  EXPECT_NE(Error(kRegex, "a^b").find("'^'"), std::string::npos);
  EXPECT_NE(Error(kRegex, "(ab").find("missing ')'"), std::string::npos);
  EXPECT_NE(Error(kRegex, "[ab").find("missing ']'"), std::string::npos);
  EXPECT_NE(Error(kRegex, "*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(Error(kRegex, "a{3,1}").find("n < m"), std::string::npos);
  EXPECT_NE(Error(kRegex, "[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(Error(kRegex, R"(\p{L})").find("property"), std::string::npos);
  EXPECT_NE(Error(kRegex, "a{99999}").find("repetition bound"), std::string::npos);
}

TEST(StructuredRegex, BlowUpIsRefusedInBoundedTime) {
  // (a|b)*a(a|b){n}: the deterministic automaton has 2^n states.
  GrammarLimits limits;
  limits.max_dfa_states = 20000;
  const auto start = std::chrono::steady_clock::now();
  auto g = CompileForBytes(GrammarSpec{kRegex, "(a|b)*a(a|b){40}", {}}, limits);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("max_dfa_states"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(StructuredChoice, ExactlyTheStrings) {
  auto g = CompileForBytes(GrammarSpec{GrammarSpec::Kind::kChoice, "", {"yes", "no", "yesno"}});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "yes"));
  EXPECT_TRUE(Matches(*g, "yesno"));
  EXPECT_TRUE(Matches(*g, "no"));
  EXPECT_FALSE(Matches(*g, "n"));
  EXPECT_FALSE(Matches(*g, "maybe"));
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.AcceptBytes("yes").ok());
  EXPECT_TRUE(m.IsComplete());  // and may continue with "no"
  EXPECT_TRUE(m.CanAcceptBytes("no"));
  EXPECT_FALSE(CompileForBytes(GrammarSpec{GrammarSpec::Kind::kChoice, "", {}}).ok());
}

TEST(StructuredGbnf, ArithmeticWithRecursion) {
  auto g = Compile(kGbnf, R"G(
# arithmetic
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*
factor ::= [0-9]+ | "(" expr ")"   # recursion through parentheses
)G");
  EXPECT_TRUE(Matches(g, "1+2*(3-4)"));
  EXPECT_TRUE(Matches(g, "((((7))))"));
  EXPECT_FALSE(Matches(g, "1+"));
  EXPECT_TRUE(Prefix(g, "1+"));
  EXPECT_FALSE(Matches(g, "(1"));
  EXPECT_FALSE(Prefix(g, "1)"));
}

TEST(StructuredGbnf, MultiLineAlternativesRepetitionAndEscapes) {
  auto g = Compile(kGbnf,
                   "root ::= (\n  \"a\" |\n  [\\x62-\\x63]{2,3}\n) \"\\n\" item?\n"
                   "item ::= [^\\n]{0,2} \"\\u00e9\"\n");
  EXPECT_TRUE(Matches(g, "a\n"));
  EXPECT_TRUE(Matches(g, "bcb\nxy\xC3\xA9"));
  EXPECT_FALSE(Matches(g, "b\n"));
  EXPECT_FALSE(Matches(g, "a\nxyz\xC3\xA9"));
}

TEST(StructuredGbnf, RightRecursionKeepsTheStackFlat) {
  auto g = Compile(kGbnf, "root ::= item (\",\" root)?\nitem ::= [a-z]+\n");
  GrammarMatcher m(g);
  std::string text = "a";
  for (int i = 0; i < 2000; ++i)
    text += ",bc";
  ASSERT_TRUE(m.AcceptBytes(text).ok());
  EXPECT_TRUE(m.IsComplete());
  EXPECT_TRUE(m.CanAcceptBytes(",x"));
  EXPECT_FALSE(m.CanAcceptBytes(",,"));
}

TEST(StructuredGbnf, ErrorsNameTheProblem) {
  EXPECT_NE(Error(kGbnf, "root ::= foo\n").find("'foo' is used but never defined"),
            std::string::npos);
  EXPECT_NE(Error(kGbnf, "start ::= \"a\"\n").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= \"a\nb\"").find("unterminated string"), std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= root \"a\" | \"b\"\n").find("left recursion"),
            std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= a\na ::= b \"x\"\nb ::= \"\" | a\n").find("left recursion"),
            std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= \"a\" )\n").find("line 1"), std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= x\nx ::= \"a\" x\n").find("admits no string"),
            std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= \"a\"\nroot ::= \"b\"\n").find("defined twice"),
            std::string::npos);
  EXPECT_NE(Error(kGbnf, "root ::= <think>\n").find("token references"), std::string::npos);
}

TEST(StructuredGbnf, RecursionBombIsRefusedInBoundedTime) {
  // Each rule uses the next twice: 2^40 bytes once inlined.
  std::string text = "root ::= r0\n";
  for (int i = 0; i < 40; ++i) {
    text += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " r" +
            std::to_string(i + 1) + "\n";
  }
  text += "r40 ::= \"a\"\n";
  const auto start = std::chrono::steady_clock::now();
  const std::string error = Error(kGbnf, text);
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(StructuredJson, ObjectsInSchemaOrderWithOptionalMembers) {
  auto g = Compile(kSchema, R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 3},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": false})");
  EXPECT_TRUE(Matches(g, R"({"name":"bob"})"));
  EXPECT_TRUE(Matches(g, R"({"name": "bob", "age": 42, "tags": ["a", "b"]})"));
  EXPECT_TRUE(Matches(g, "{\n  \"name\": \"x\",\n  \"tags\": []\n}"));
  EXPECT_FALSE(Matches(g, R"({"age":42})"));              // name is required
  EXPECT_FALSE(Matches(g, R"({"name":"bobby"})"));        // maxLength
  EXPECT_FALSE(Matches(g, R"({"name":"b","age":151})"));  // maximum
  EXPECT_FALSE(Matches(g, R"({"name":"b","age":-1})"));   // minimum
  EXPECT_FALSE(Matches(g, R"({"name":"b","x":1})"));      // additionalProperties
  EXPECT_FALSE(Matches(g, R"({"name":"b","tags":["a","a","b"]})"));
  EXPECT_FALSE(Matches(g, R"({"age":1,"name":"b"})"));  // schema order
  EXPECT_FALSE(Matches(g, "{\t\"name\":\"b\"}"));       // whitespace policy
}

TEST(StructuredJson, AdditionalPropertiesNeverRepeatDeclaredNames) {
  auto g = Compile(kSchema, R"({"properties": {"a": {"type": "integer"}},
                                "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(Matches(g, R"({"a":1,"b":"x","ab":"y"})"));
  EXPECT_TRUE(Matches(g, R"({"b":"x"})"));
  EXPECT_FALSE(Matches(g, R"({"a":1,"a":"x"})"));
  EXPECT_FALSE(Matches(g, R"({"b":1})"));
  EXPECT_TRUE(Matches(g, "[1, \"x\", {\"a\": null}]"));  // no type: any other value
}

TEST(StructuredJson, NumberRangesAreExact) {
  auto g = Compile(kSchema, R"({"type": "number", "exclusiveMinimum": -1.5, "maximum": 20.25})");
  for (const char* ok :
       {"-1.4", "-1.49999", "0", "-0.5", "20.25", "20.250", "20.2", "3", "19.99"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"-1.5", "-1.50", "-2", "20.26", "21", "100", "-0", "1e1", "01"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
  auto i = Compile(kSchema, R"({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 1000})");
  EXPECT_TRUE(Matches(i, "2"));
  EXPECT_TRUE(Matches(i, "999"));
  EXPECT_FALSE(Matches(i, "1"));
  EXPECT_FALSE(Matches(i, "1000"));
  EXPECT_FALSE(Matches(i, "2.0"));
}

TEST(StructuredJson, StringsAreCanonical) {
  auto g = Compile(kSchema, R"({"type": "string", "minLength": 2, "maxLength": 2})");
  EXPECT_TRUE(Matches(g, "\"\\\"\xC3\xA9\""));  // an escaped quote and é: two characters
  EXPECT_TRUE(Matches(g, "\"\\u001fa\""));
  EXPECT_FALSE(Matches(g, "\"\\u0041b\""));  // 'A' is written raw
  EXPECT_FALSE(Matches(g, "\"\\/a\""));
  EXPECT_FALSE(Matches(g, "\"a\nb\""));  // raw control character
  auto p = Compile(kSchema, R"({"type": "string", "pattern": "^a\"b$"})");
  EXPECT_TRUE(Matches(p, R"("a\"b")"));
  auto f = Compile(kSchema, R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(Matches(f, R"("2024-02-29")"));
  EXPECT_FALSE(Matches(f, R"("2023-02-29")"));
  EXPECT_FALSE(Matches(f, R"("2100-02-29")"));
  EXPECT_TRUE(Matches(f, R"("2000-02-29")"));
}

TEST(StructuredJson, RecursionThroughRefs) {
  auto g = Compile(kSchema, R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
      "items": {"$ref": "#/$defs/node"}}}, "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(Matches(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(Matches(g, R"({"v":1,"kids":[{"kids":[]}]})"));
}

TEST(StructuredJson, OneOfNeedsExclusiveBranches) {
  auto g = Compile(kSchema, R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})");
  EXPECT_TRUE(Matches(g, "\"a\""));
  EXPECT_TRUE(Matches(g, "3"));
  auto tagged = Compile(kSchema, R"({"oneOf": [
      {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
       "required": ["k"]},
      {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]})");
  EXPECT_TRUE(Matches(tagged, R"({"k":"a","x":1})"));
  EXPECT_NE(Error(kSchema, R"({"oneOf": [{"type": "number"}, {"type": "integer"}]})")
                .find("not provably exclusive"),
            std::string::npos);
}

TEST(StructuredJson, AllOfMerges) {
  auto g = Compile(kSchema, R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
      {"properties": {"a": {"maximum": 5}, "b": {"type": "boolean"}}}]})");
  EXPECT_TRUE(Matches(g, R"({"a":5,"b":true})"));
  EXPECT_FALSE(Matches(g, R"({"a":6})"));
  EXPECT_FALSE(Matches(g, R"({"b":true})"));
}

TEST(StructuredJson, ContainsAndPropertyCountsWhereExact) {
  auto c = Compile(kSchema, R"({"type": "array", "contains": {"type": "integer", "minimum": 5}})");
  EXPECT_TRUE(Matches(c, "[1,\"x\",7,2]"));
  EXPECT_FALSE(Matches(c, "[1,2]"));
  EXPECT_FALSE(Matches(c, "[]"));
  auto p = Compile(kSchema, R"({"type": "object", "minProperties": 1, "maxProperties": 2,
                                "propertyNames": {"maxLength": 2}})");
  EXPECT_TRUE(Matches(p, R"({"ab":1})"));
  EXPECT_TRUE(Matches(p, R"({"a":1,"b":[]})"));
  EXPECT_FALSE(Matches(p, "{}"));
  EXPECT_FALSE(Matches(p, R"({"a":1,"b":2,"c":3})"));
  EXPECT_FALSE(Matches(p, R"({"abc":1})"));
  EXPECT_NE(Error(kSchema, R"({"properties": {"a": {}}, "maxProperties": 1})")
                .find("'maxProperties' together with declared"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "array", "items": {"type": "string"}, "contains": {}})")
                .find("'contains' together with"),
            std::string::npos);
}

// `not` and if/then/else where their meaning is exact without negating a general schema; the
// rest refused by name.
TEST(StructuredJson, NotAndIfWhereExact) {
  auto not_integer = Compile(kSchema, R"({"not": {"type": "integer"}})");
  EXPECT_FALSE(Matches(not_integer, "1"));
  EXPECT_FALSE(Matches(not_integer, "-20"));
  EXPECT_FALSE(Matches(not_integer, "1.0"));  // an integer's value
  EXPECT_TRUE(Matches(not_integer, "1.5"));
  EXPECT_TRUE(Matches(not_integer, "-0.05"));
  EXPECT_TRUE(Matches(not_integer, R"("a")"));
  EXPECT_TRUE(Matches(not_integer, "[1]"));
  auto not_number =
      Compile(kSchema, R"({"type": ["number", "string"], "not": {"type": "number"}})");
  EXPECT_TRUE(Matches(not_number, R"("a")"));
  EXPECT_FALSE(Matches(not_number, "1.5"));
  auto absent = Compile(kSchema, R"({"type": "object", "properties": {"a": {"not": {}}}})");
  EXPECT_TRUE(Matches(absent, R"({"b":1})"));
  EXPECT_FALSE(Matches(absent, R"({"a":1})"));
  auto anything = Compile(kSchema, R"({"type": "integer", "not": false})");
  EXPECT_TRUE(Matches(anything, "7"));
  EXPECT_NE(Error(kSchema, R"({"not": true})").find("admits no string"), std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"if": {"const": 0}, "else": false})").find("'if'"),
            std::string::npos);
  auto bare = Compile(kSchema, R"({"type": "integer", "if": {"const": 0},
                                   "allOf": [{"then": {"const": 1}}, {"else": false}]})");
  EXPECT_TRUE(Matches(bare, "5"));
  auto always = Compile(kSchema, R"({"if": true, "then": {"type": "string"},
                                     "else": {"type": "integer"}})");
  EXPECT_TRUE(Matches(always, R"("x")"));
  EXPECT_FALSE(Matches(always, "1"));
  auto never = Compile(kSchema, R"({"if": false, "then": {"type": "string"},
                                    "else": {"type": "integer"}})");
  EXPECT_TRUE(Matches(never, "1"));
  EXPECT_FALSE(Matches(never, R"("x")"));
  EXPECT_NE(Error(kSchema, R"({"not": {"type": "integer"}, "minimum": 2})").find("'minimum'"),
            std::string::npos);
}

// multipleOf: the multiples spelled positionally (at most the divisor's fraction digits).
TEST(StructuredJson, MultipleOf) {
  auto three = Compile(kSchema, R"({"type": "integer", "multipleOf": 3})");
  for (const char* yes : {"0", "3", "-12", "999999", "123456789012"})
    EXPECT_TRUE(Matches(three, yes)) << yes;
  for (const char* no : {"1", "-13", "1000000", "3.0", "03"})
    EXPECT_FALSE(Matches(three, no)) << no;
  auto quarter = Compile(kSchema, R"({"type": "number", "multipleOf": 0.25})");
  for (const char* yes : {"0", "0.25", "-1.5", "7.75", "3", "2.50"})
    EXPECT_TRUE(Matches(quarter, yes)) << yes;
  for (const char* no : {"0.2", "1.125", "7.7", "1e2"})
    EXPECT_FALSE(Matches(quarter, no)) << no;
  auto by_1_5 = Compile(kSchema, R"({"type": "integer", "multipleOf": 1.5})");  // 3k
  EXPECT_TRUE(Matches(by_1_5, "6"));
  EXPECT_FALSE(Matches(by_1_5, "4"));
  EXPECT_NE(Error(kSchema, R"({"type": "integer", "multipleOf": 2, "maximum": 9})")
                .find("'multipleOf' at the root together with"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"multipleOf": 0.123456789})").find("'multipleOf'"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"multipleOf": 0})").find("greater than 0"), std::string::npos);
}

TEST(StructuredJson, JsonObjectMode) {
  auto g = CompileForBytes(GrammarSpec{GrammarSpec::Kind::kJsonObject, "", {}});
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(Matches(*g, R"({"a": [1, {"b": null}, "x"], "c": -1.5e3})"));
  EXPECT_FALSE(Matches(*g, "[1]"));
  EXPECT_FALSE(Matches(*g, R"({"a": tru})"));
}

TEST(StructuredJson, ErrorsNameTheKeyword) {
  EXPECT_NE(Error(kSchema, R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "object", "properties": {"a": {"not": {"minLength": 3}}}})")
                .find("unsupported keyword 'not' at '/properties/a'"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"$ref": "http://x/y.json"})").find("remote '$ref'"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "string", "format": "hostname"})").find("'hostname'"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "string", "pattern": "(a)\\1"})").find("backreferences"),
            std::string::npos);
  EXPECT_NE(
      Error(kSchema, R"({"type": "integer", "minimum": 5, "maximum": 3})").find("admits no string"),
      std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "object", "required": ["a"],
                               "properties": {"a": false}})")
                .find("admits no string"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, "{\"type\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "strin"})").find("unknown type 'strin'"), std::string::npos);
  // Counts: a fraction or a negative is not one; one too large to fit an integer is over the
  // limit (found by structured_fuzz: the check converted 1e75 to an integer first).
  EXPECT_NE(Error(kSchema, R"({"type": "string", "maxLength": 2.5})").find("non-negative integer"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"type": "array", "minItems": -1})").find("non-negative integer"),
            std::string::npos);
  EXPECT_NE(Error(kSchema, R"({"minItems": 1888888888888888888888888888888888888888888888888})")
                .find("over the supported"),
            std::string::npos);
  // An integral value too large for an integer is still an integer (an enum of one).
  EXPECT_EQ(Error(kSchema, R"({"type": "integer", "enum": [1e75, 0.5]})"), "");
  // Keywords that constrain only types the schema excludes are fine.
  EXPECT_EQ(Error(kSchema, R"({"type": "string", "uniqueItems": true})"), "");
}

TEST(StructuredJson, RecursionBombAndHugeSchemaAreRefusedInBoundedTime) {
  // Each definition uses the next one twice: 2^40 once expanded.
  std::string defs;
  for (int i = 0; i < 40; ++i) {
    defs += "\"d" + std::to_string(i) +
            "\": {\"type\": \"array\", \"prefixItems\": [{\"$ref\": "
            "\"#/$defs/d" +
            std::to_string(i + 1) + "\"}, {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) +
            "\"}], \"items\": false},";
  }
  defs += "\"d40\": {\"type\": \"integer\"}";
  const std::string bomb = "{\"$ref\": \"#/$defs/d0\", \"$defs\": {" + defs + "}}";
  auto start = std::chrono::steady_clock::now();
  std::string error = Error(kSchema, bomb);
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));

  // Over 1 MB of schema: 20000 properties are refused by a limit; 500 properties with long
  // descriptions compile. Both quickly.
  std::string props;
  for (int i = 0; i < 20000; ++i) {
    if (i) props += ",";
    props += "\"property_number_" + std::to_string(i) +
             "\": {\"type\": \"string\", "
             "\"maxLength\": 8}";
  }
  std::string big = "{\"type\": \"object\", \"properties\": {" + props + "}}";
  ASSERT_GT(big.size(), 1u << 20);
  start = std::chrono::steady_clock::now();
  error = Error(kSchema, big);
  EXPECT_NE(error.find("nests more than"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  props.clear();
  for (int i = 0; i < 500; ++i) {
    if (i) props += ",";
    props += "\"p" + std::to_string(i) + "\": {\"type\": \"integer\", \"description\": \"" +
             std::string(2100, 'x') + "\"}";
  }
  big = "{\"type\": \"object\", \"properties\": {" + props + "}}";
  ASSERT_GT(big.size(), 1u << 20);
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(Error(kSchema, big), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(StructuredMatcher, RollbackAndCompletion) {
  auto g = Compile(kRegex, "ab(c|d)*");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.AcceptBytes("a").ok());
  EXPECT_FALSE(m.IsComplete());
  ASSERT_TRUE(m.AcceptBytes("bc").ok());
  EXPECT_TRUE(m.IsComplete());
  EXPECT_FALSE(m.AcceptBytes("x").ok());
  ASSERT_TRUE(m.Rollback(1).ok());
  EXPECT_FALSE(m.IsComplete());
  ASSERT_TRUE(m.AcceptBytes("bd").ok());
  EXPECT_TRUE(m.IsComplete());
  EXPECT_FALSE(m.Rollback(3).ok());
  ASSERT_TRUE(m.Rollback(2).ok());
  EXPECT_EQ(m.steps(), 0);
}

TEST(StructuredLexical, DecimalParsing) {
  auto d = Decimal::Parse("-0012.3400e2");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->ToString(), "-1234");
  EXPECT_EQ(Decimal::Parse("1.5e-3")->ToString(), "0.0015");
  EXPECT_EQ(Decimal::Parse("-0.0")->ToString(), "0");
  EXPECT_FALSE(Decimal::Parse("1.").has_value());
  EXPECT_EQ(CanonicalJson(nlohmann::ordered_json::parse(R"({"b":1.0,"a":[1e2,"\u0001"]})")),
            R"({"b":1,"a":[100,"\u0001"]})");
}

}  // namespace
}  // namespace sy::structured
