// Jinja2's parser, for the language chat templates are written in. The grammar follows
// jinja2/parser.py production by production (parse_condexpr … parse_unary, its postfix loop of
// `.`, `[]`, `()`, `|` and `is`), so quirks templates depend on hold: `-2**2` is 4, `a is b c`
// takes c as the test's argument, comparisons chain as in Python.
#include <fmt/format.h>

#include <cstring>

#include "base/utf8.h"
#include "jinja/lexer.h"
#include "jinja/syntax.h"

namespace sy::jinja {
namespace {

// Deep nesting in a hostile template must end in an error, not in a stack overflow.
constexpr int kMaxNesting = 100;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseAll() {
    Body body = ParseBody({});
    if (Current().type != Token::Type::kEnd) Fail("unexpected end tag");
    return body;
  }

 private:
  const Token& Current() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  [[noreturn]] void Fail(const std::string& message) const {
    throw TemplateError(Current().line, message);
  }
  bool IsOp(const char* op) const {
    return Current().type == Token::Type::kOp && Current().text == op;
  }
  bool IsName(const char* name) const {
    return Current().type == Token::Type::kName && Current().text == name;
  }
  bool AcceptOp(const char* op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool AcceptName(const char* name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case Token::Type::kVarEnd:
        return "end of print statement";
      case Token::Type::kBlockEnd:
        return "end of statement block";
      case Token::Type::kEnd:
        return "end of template";
      case Token::Type::kString:
        return "string";
      default:
        return "'" + t.text + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!AcceptOp(op)) Fail(fmt::format("expected '{}', got {}", op, Describe(Current())));
  }
  std::string ExpectName() {
    if (Current().type != Token::Type::kName)
      Fail(fmt::format("expected a name, got {}", Describe(Current())));
    return tokens_[pos_++].text;
  }
  void Expect(Token::Type type, const char* what) {
    if (Current().type != type) Fail(fmt::format("expected {}, got {}", what, Describe(Current())));
    ++pos_;
  }
  void ExpectBlockEnd() { Expect(Token::Type::kBlockEnd, "end of statement block"); }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxNesting) parser->Fail("the template nests too deeply");
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements until a block tag whose name is one of `ends`; that tag is left unconsumed (its
  // kBlockBegin and name are the current tokens).
  Body ParseBody(std::initializer_list<const char*> ends) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Current();
      if (t.type == Token::Type::kEnd) {
        if (ends.size())
          Fail(fmt::format("unexpected end of template: a block is missing its '{}'",
                           *ends.begin()));
        return body;
      }
      if (t.type == Token::Type::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = t.line;
        node->text = t.text;
        body.push_back(std::move(node));
        ++pos_;
      } else if (t.type == Token::Type::kVarBegin) {
        ++pos_;
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = t.line;
        node->expr = ParseTuple(true);
        Expect(Token::Type::kVarEnd, "end of print statement");
        body.push_back(std::move(node));
      } else {
        const Token& name = Peek();
        if (name.type != Token::Type::kName) {
          pos_++;
          Fail("a block tag must start with a name");
        }
        for (const char* end : ends)
          if (name.text == end) return body;
        ++pos_;
        body.push_back(ParseStatement());
      }
    }
  }

  // After a body: consumes the block tag "{% name %}".
  void EndTag(const char* name) {
    ++pos_;  // kBlockBegin
    if (!AcceptName(name)) Fail(fmt::format("expected '{}'", name));
    ExpectBlockEnd();
  }

  NodePtr ParseStatement() {
    const int line = Current().line;
    const std::string keyword = ExpectName();
    auto node = std::make_unique<Node>();
    node->line = line;
    if (keyword == "if") {
      node->kind = Node::Kind::kIf;
      node->conditions.push_back(ParseTuple(false));
      ExpectBlockEnd();
      while (true) {
        node->bodies.push_back(ParseBody({"elif", "else", "endif"}));
        ++pos_;
        const std::string tag = ExpectName();
        if (tag == "elif") {
          node->conditions.push_back(ParseTuple(false));
          ExpectBlockEnd();
        } else if (tag == "else") {
          ExpectBlockEnd();
          node->bodies.push_back(ParseBody({"endif"}));
          EndTag("endif");
          break;
        } else {
          ExpectBlockEnd();
          break;
        }
      }
    } else if (keyword == "for") {
      node->kind = Node::Kind::kFor;
      node->targets = ParseTargets("in");
      if (!AcceptName("in")) Fail("expected 'in' in a for loop");
      node->expr = ParseTuple(false, /*stop_at_if=*/true);
      if (AcceptName("if")) node->filter = ParseExpression(true);
      if (IsName("recursive")) Fail("recursive for loops are not supported");
      ExpectBlockEnd();
      ++loop_depth_;
      node->bodies.push_back(ParseBody({"endfor", "else"}));
      --loop_depth_;
      if (Peek().text == "else") {
        EndTag("else");
        node->bodies.push_back(ParseBody({"endfor"}));
      }
      EndTag("endfor");
    } else if (keyword == "set") {
      node->kind = Node::Kind::kSet;
      node->targets = ParseTargets("=");
      if (AcceptOp("=")) {
        node->expr = ParseTuple(true);
        ExpectBlockEnd();
      } else {
        if (node->targets.size() != 1) Fail("a block set assigns one name");
        if (AcceptOp("|")) node->filter = ParseFilterChain(nullptr, line);
        ExpectBlockEnd();
        node->bodies.push_back(ParseBody({"endset"}));
        EndTag("endset");
      }
    } else if (keyword == "macro") {
      node->kind = Node::Kind::kMacro;
      node->text = ExpectName();
      ExpectOp("(");
      while (!AcceptOp(")")) {
        if (!node->params.empty()) ExpectOp(",");
        if (AcceptOp(")")) break;
        std::string param = ExpectName();
        ExprPtr default_value;
        if (AcceptOp("=")) default_value = ParseExpression(true);
        node->params.emplace_back(std::move(param), std::move(default_value));
      }
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"endmacro"}));
      EndTag("endmacro");
    } else if (keyword == "filter") {
      node->kind = Node::Kind::kFilter;
      node->expr = ParseFilterChain(nullptr, line);
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"endfilter"}));
      EndTag("endfilter");
    } else if (keyword == "generation") {
      // transformers' AssistantTracker tag marks assistant text; rendering is unchanged.
      node->kind = Node::Kind::kIf;
      node->conditions.push_back(Make(Expr::Kind::kLiteral, line));
      node->conditions.back()->value = Value::Bool(true);
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"endgeneration"}));
      EndTag("endgeneration");
    } else if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) Fail(fmt::format("'{}' outside a loop", keyword));
      node->kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      ExpectBlockEnd();
    } else {
      pos_--;
      Fail(fmt::format("unknown or unsupported tag '{}'", keyword));
    }
    return node;
  }

  // The names a for loop or set assigns: `x`, `a, b`, `(a, b)`, `ns.attr`.
  std::vector<std::string> ParseTargets(const char* stop) {
    std::vector<std::string> names;
    const bool parenthesized = AcceptOp("(");
    while (true) {
      std::string name = ExpectName();
      if (AcceptOp(".")) name.append(".").append(ExpectName());
      names.push_back(std::move(name));
      if (!AcceptOp(",")) break;
      if (IsName(stop) || IsOp(stop)) break;
    }
    if (parenthesized) ExpectOp(")");
    for (const std::string& n : names)
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        Fail(fmt::format("cannot assign to '{}'", n));
    return names;
  }

  // An expression, or several separated by commas (a tuple without parentheses).
  ExprPtr ParseTuple(bool with_condexpr, bool stop_at_if = false) {
    const int line = Current().line;
    ExprPtr first = stop_at_if ? ParseOr() : ParseExpression(with_condexpr);
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, line);
    tuple->operands.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (EndsExpression()) break;
      tuple->operands.push_back(stop_at_if ? ParseOr() : ParseExpression(with_condexpr));
    }
    return tuple;
  }

  bool EndsExpression() const {
    const Token& t = Current();
    return t.type == Token::Type::kVarEnd || t.type == Token::Type::kBlockEnd ||
           (t.type == Token::Type::kOp && (t.text == ")" || t.text == "]" || t.text == "}")) ||
           (t.type == Token::Type::kName && t.text == "if");
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    return with_condexpr ? ParseConditional() : ParseOr();
  }

  ExprPtr ParseConditional() {
    ExprPtr value = ParseOr();
    while (IsName("if")) {
      const int line = Current().line;
      ++pos_;
      auto cond = Make(Expr::Kind::kConditional, line);
      cond->operands.push_back(ParseOr());
      cond->operands.push_back(std::move(value));
      cond->operands.push_back(AcceptName("else") ? ParseConditional() : nullptr);
      value = std::move(cond);
    }
    return value;
  }

  ExprPtr ParseOr() { return ParseLogical("or", Expr::Kind::kOr, &Parser::ParseAnd); }
  ExprPtr ParseAnd() { return ParseLogical("and", Expr::Kind::kAnd, &Parser::ParseNot); }

  // `next (keyword next)*`, left-associative.
  ExprPtr ParseLogical(const char* keyword, Expr::Kind kind, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    while (IsName(keyword)) {
      auto node = Make(kind, Current().line);
      ++pos_;
      node->operands.push_back(std::move(left));
      node->operands.push_back((this->*next)());
      left = std::move(node);
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      auto node = Make(Expr::Kind::kNot, Current().line);
      ++pos_;
      node->operands.push_back(ParseNot());
      return node;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Current().line;
    ExprPtr first = ParseMath1();
    ExprPtr chain;
    while (true) {
      std::string op;
      const Token& t = Current();
      if (t.type == Token::Type::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                         t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && Peek().type == Token::Type::kName && Peek().text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!chain) {
        chain = Make(Expr::Kind::kCompare, line);
        chain->operands.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->operands.push_back(ParseMath1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr Binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto node = Make(Expr::Kind::kBinary, line);
    node->name = op;
    node->operands.push_back(std::move(left));
    node->operands.push_back(std::move(right));
    return node;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = tokens_[pos_++];
      left = Binary(t.text, std::move(left), ParseConcat(), t.line);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    const int line = Current().line;
    ExprPtr first = ParseMath2();
    if (!IsOp("~")) return first;
    auto concat = Make(Expr::Kind::kConcat, line);
    concat->operands.push_back(std::move(first));
    while (AcceptOp("~"))
      concat->operands.push_back(ParseMath2());
    return concat;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = tokens_[pos_++];
      left = Binary(t.text, std::move(left), ParsePow(), t.line);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const Token& t = tokens_[pos_++];
      left = Binary(t.text, std::move(left), ParseUnary(true), t.line);
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    const int line = Current().line;
    ExprPtr node;
    if (AcceptOp("-")) {
      node = Make(Expr::Kind::kNegate, line);
      node->operands.push_back(ParseUnary(false));
    } else if (AcceptOp("+")) {
      node = Make(Expr::Kind::kPlus, line);
      node->operands.push_back(ParseUnary(false));
    } else {
      node = ParsePostfix(ParsePrimary());
    }
    return with_filter ? ParseFilterExpr(std::move(node)) : std::move(node);
  }

  ExprPtr ParsePrimary() {
    DepthGuard guard(this);
    const Token& t = Current();
    const int line = t.line;
    switch (t.type) {
      case Token::Type::kName: {
        ++pos_;
        auto node = Make(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          node->value = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          node->value = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          node->value = Value::None();
        } else {
          node->kind = Expr::Kind::kName;
          node->name = t.text;
        }
        return node;
      }
      case Token::Type::kString: {
        // Adjacent string literals join, as in Python.
        std::string text;
        while (Current().type == Token::Type::kString)
          text += tokens_[pos_++].literal.text();
        auto node = Make(Expr::Kind::kLiteral, line);
        node->value = Value::String(std::move(text));
        return node;
      }
      case Token::Type::kInt:
      case Token::Type::kFloat: {
        auto node = Make(Expr::Kind::kLiteral, line);
        node->value = tokens_[pos_++].literal;
        return node;
      }
      case Token::Type::kOp:
        if (t.text == "(") {
          ++pos_;
          if (AcceptOp(")")) return Make(Expr::Kind::kTuple, line);
          ExprPtr first = ParseExpression(true);
          if (AcceptOp(")")) return first;
          auto tuple = Make(Expr::Kind::kTuple, line);
          tuple->operands.push_back(std::move(first));
          while (AcceptOp(",")) {
            if (IsOp(")")) break;
            tuple->operands.push_back(ParseExpression(true));
          }
          ExpectOp(")");
          return tuple;
        }
        if (t.text == "[") {
          ++pos_;
          auto list = Make(Expr::Kind::kList, line);
          while (!AcceptOp("]")) {
            if (!list->operands.empty()) ExpectOp(",");
            if (AcceptOp("]")) break;
            list->operands.push_back(ParseExpression(true));
          }
          return list;
        }
        if (t.text == "{") {
          ++pos_;
          auto dict = Make(Expr::Kind::kDict, line);
          while (!AcceptOp("}")) {
            if (!dict->operands.empty()) ExpectOp(",");
            if (AcceptOp("}")) break;
            dict->operands.push_back(ParseExpression(true));
            ExpectOp(":");
            dict->operands.push_back(ParseExpression(true));
          }
          return dict;
        }
        break;
      default:
        break;
    }
    Fail(fmt::format("unexpected {}", Describe(t)));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        const int line = Current().line;
        ++pos_;
        node = ParseFilterChain(std::move(node), line);
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    DepthGuard guard(this);
    const Token& t = tokens_[pos_++];
    if (t.text == ".") {
      if (Current().type == Token::Type::kInt) {
        auto item = Make(Expr::Kind::kGetItem, t.line);
        item->operands.push_back(std::move(node));
        auto index = Make(Expr::Kind::kLiteral, t.line);
        index->value = tokens_[pos_++].literal;
        item->operands.push_back(std::move(index));
        return item;
      }
      auto attr = Make(Expr::Kind::kGetAttr, t.line);
      attr->name = ExpectName();
      attr->operands.push_back(std::move(node));
      return attr;
    }
    // [index], [start:stop:step], or [a, b] (a tuple index), as jinja's parse_subscribed.
    std::vector<ExprPtr> parts;
    while (!IsOp("]")) {
      if (!parts.empty()) ExpectOp(",");
      parts.push_back(ParseSubscribed(t.line));
    }
    ExpectOp("]");
    if (parts.empty()) Fail("expected a subscript");
    if (parts.size() == 1 && parts[0]->kind == Expr::Kind::kSlice) {
      parts[0]->operands[0] = std::move(node);
      return std::move(parts[0]);
    }
    for (const auto& part : parts)
      if (part->kind == Expr::Kind::kSlice) Fail("a slice inside a tuple index is not supported");
    auto item = Make(Expr::Kind::kGetItem, t.line);
    item->operands.push_back(std::move(node));
    if (parts.size() == 1) {
      item->operands.push_back(std::move(parts[0]));
    } else {
      auto tuple = Make(Expr::Kind::kTuple, t.line);
      tuple->operands = std::move(parts);
      item->operands.push_back(std::move(tuple));
    }
    return item;
  }

  // One subscript: an expression, or a kSlice whose operands[0] (the sliced value) is filled in
  // by the caller.
  ExprPtr ParseSubscribed(int line) {
    ExprPtr start;
    if (!AcceptOp(":")) {
      start = ParseExpression(true);
      if (!AcceptOp(":")) return start;
    }
    auto slice = Make(Expr::Kind::kSlice, line);
    slice->operands.push_back(nullptr);
    slice->operands.push_back(std::move(start));
    auto optional_part = [&]() -> ExprPtr {
      if (IsOp("]") || IsOp(",") || IsOp(":")) return nullptr;
      return ParseExpression(true);
    };
    slice->operands.push_back(optional_part());
    slice->operands.push_back(AcceptOp(":") ? optional_part() : nullptr);
    return slice;
  }

  void ParseCallArgs(Expr* call) {
    ExpectOp("(");
    bool first = true;
    while (!AcceptOp(")")) {
      if (!first) {
        ExpectOp(",");
        if (AcceptOp(")")) break;
      }
      first = false;
      if (IsOp("*") || IsOp("**")) Fail("*args and **kwargs in calls are not supported");
      if (Current().type == Token::Type::kName && Peek().type == Token::Type::kOp &&
          Peek().text == "=") {
        std::string key = tokens_[pos_].text;
        pos_ += 2;
        call->keywords.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!call->keywords.empty()) Fail("a positional argument follows a keyword argument");
        call->operands.push_back(ParseExpression(true));
      }
    }
  }

  ExprPtr ParseCall(ExprPtr callee) {
    DepthGuard guard(this);
    auto call = Make(Expr::Kind::kCall, Current().line);
    call->operands.push_back(std::move(callee));
    ParseCallArgs(call.get());
    return call;
  }

  // `| name(args) | name …` applied to `operand` (null for a filter block's body).
  ExprPtr ParseFilterChain(ExprPtr operand, int line) {
    DepthGuard guard(this);
    while (true) {
      auto filter = Make(Expr::Kind::kFilter, line);
      filter->name = ExpectName();
      while (AcceptOp("."))
        filter->name.append(".").append(ExpectName());
      filter->operands.push_back(std::move(operand));
      if (IsOp("(")) ParseCallArgs(filter.get());
      operand = std::move(filter);
      if (!IsOp("|")) return operand;
      line = Current().line;
      ++pos_;
    }
  }

  ExprPtr ParseTest(ExprPtr operand) {
    DepthGuard guard(this);
    const int line = Current().line;
    ++pos_;  // is
    const bool negated = AcceptName("not");
    auto test = Make(Expr::Kind::kTest, line);
    test->name = ExpectName();
    while (AcceptOp("."))
      test->name.append(".").append(ExpectName());
    test->operands.push_back(std::move(operand));
    const Token& t = Current();
    if (IsOp("(")) {
      ParseCallArgs(test.get());
    } else if ((t.type == Token::Type::kName || t.type == Token::Type::kString ||
                t.type == Token::Type::kInt || t.type == Token::Type::kFloat ||
                (t.type == Token::Type::kOp && (t.text == "[" || t.text == "{"))) &&
               !(t.type == Token::Type::kName &&
                 (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      test->operands.push_back(ParsePostfix(ParsePrimary()));
    }
    if (!negated) return test;
    auto negation = Make(Expr::Kind::kNot, line);
    negation->operands.push_back(std::move(test));
    return negation;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  friend struct DepthGuard;
};

}  // namespace

Body ParseTemplate(std::string_view source) {
  size_t invalid = 0;
  for (size_t pos = 0; pos < source.size();) {
    uint32_t cp;
    if (!DecodeUtf8(source, &pos, &cp)) {
      invalid = pos + 1;
      break;
    }
  }
  if (invalid) {
    int line = 1;
    for (size_t i = 0; i + 1 < invalid; ++i)
      line += source[i] == '\n';
    throw TemplateError(line, "the template is not valid UTF-8");
  }
  return Parser(Lex(source)).ParseAll();
}

}  // namespace sy::jinja
