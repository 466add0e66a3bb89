// JSON Schema (and "any JSON object") as a grammar: the front end of
// response_format json_schema / json_object, guided_json and tool-call
// arguments. docs/architecture/constrain.md lists the subset; in short:
//
//   type (one or a list), properties + required (written in the schema's
//   order; optional ones may be left out), additionalProperties (false or
//   absent: only the listed properties; a schema on an object without
//   properties: any keys with such values), enum, const, items,
//   prefixItems, minItems, maxItems, anyOf, allOf of one schema, $ref to
//   #, #/$defs/... and #/definitions/... (recursion allowed), nullable,
//   minLength, maxLength, pattern (a whole-value match), format (date, time,
//   date-time, uuid, ipv4, email), integer minimum/maximum (and the
//   exclusive forms), number minimum 0 / exclusiveMinimum 0 (non-negative);
//   annotations (title, description, default, examples, $schema, $id,
//   $comment, deprecated, readOnly, writeOnly, discriminator) are accepted and change
//   nothing.
// Any other keyword, or a value these cannot honour, is an InvalidArgument
// naming it with its place in the schema ("properties.age.multipleOf"), so
// a constraint is never silently weaker than the schema.
//
// What is generated is always valid under the schema but is a subset of what
// it allows: compact JSON (no whitespace but one optional space after ':'
// and ','), no extra properties, numbers of at most 16 integer and 16
// fraction digits and 3 exponent digits.
//
// Thread-safety: pure functions over the builder passed in.
#pragma once

#include <nlohmann/json.hpp>

#include "constrain/grammar.h"
#include "util/status.h"

namespace strata::constrain {

// A node for the values `schema` allows. `where` prefixes error messages.
StatusOr<GrammarBuilder::Node> CompileJsonSchema(GrammarBuilder& b,
                                                 const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
GrammarBuilder::Node AnyJsonObject(GrammarBuilder& b);

}  // namespace strata::constrain
