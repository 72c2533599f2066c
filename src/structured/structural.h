// The structural front end: a grammar composed of literal text, single named tokens and JSON
// schemas — what a model's tool-call format is (DeepSeek's "<｜tool▁call▁begin｜>" NAME
// "<｜tool▁sep｜>" ARGUMENTS "<｜tool▁call▁end｜>"), in the spirit of xgrammar's structural tags.
// The spec is JSON, one node per object:
//
//   {"type": "text", "text": "function"}             the bytes of the text
//   {"type": "token", "token": "<｜tool▁sep｜>"}      that one vocabulary token (grammar.h
//                                                     SpecialToken), never the text in pieces
//   {"type": "json_schema", "schema": {...}}          a JSON value the schema validates
//                                                     (json_schema.h, every keyword enforced)
//   {"type": "regex", "pattern": "..."}               text the pattern matches whole (regex.h)
//   {"type": "sequence", "elements": [...]}           one after another
//   {"type": "alternatives", "elements": [...]}       one of them
//   {"type": "repeat", "element": {...}, "min": 1, "max": -1, "separator": {...}}
//                                                     min..max times (max -1: unbounded),
//                                                     separator (optional) between them
//
// Built by the server from a request's tools (chat_output/tool_choice.h), never by clients.
#pragma once

#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

Result<Grammar> StructuralGrammar(std::string_view spec_json, const GrammarLimits& limits);

}  // namespace sy::structured
