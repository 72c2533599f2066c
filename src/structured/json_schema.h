// JSON Schema (draft 7, with 2019-09/2020-12's $defs and prefixItems) to a grammar whose
// language is exactly the canonical spellings (json_lexical.h) of the instances the schema
// validates — for every keyword the converter accepts. A keyword it cannot enforce exactly is an
// error naming the keyword and where it is; annotations (title, description, default, examples,
// $comment, readOnly, writeOnly, deprecated, contentMediaType, contentEncoding, $schema, a root
// $id) are ignored as the specification allows.
//
// Supported: type (and type arrays), enum, const, properties, required, additionalProperties
// (false, true or a schema), items (schema or tuple), additionalItems, prefixItems, minItems,
// maxItems, minLength, maxLength, pattern, format (date, time, date-time, email, uuid, ipv4,
// uri), minimum, maximum, exclusiveMinimum, exclusiveMaximum, contains (elements otherwise free),
// minProperties / maxProperties / propertyNames (string keywords; no declared properties),
// anyOf, oneOf (when its branches are provably disjoint: different types, different constants,
// or a property every branch requires with different constant values), allOf (merged keyword by
// keyword where that is exact), $ref to "#..." JSON pointers into the same document, recursion
// included.
//
// Objects are written with the declared properties in the schema's order (required ones always,
// optional ones when present), then any additional properties; additional property names are
// never declared names (so no declared property appears twice), but a context-free grammar
// cannot keep additional names distinct from each other.
#pragma once

#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

Result<Grammar> JsonSchemaGrammar(std::string_view schema_json, const GrammarLimits& limits);

// Any JSON object (OpenAI's response_format {"type": "json_object"}), under the same whitespace
// and string policy; duplicate keys are not excluded.
Grammar AnyJsonObjectGrammar();

}  // namespace sy::structured
