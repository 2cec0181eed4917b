// JSON Schema -> byte grammar (common/structured/grammar.hpp): the documents a constrained decoder may write
// for OpenAI's `response_format` (`json_object`, `json_schema`) and tool-call arguments.
//
// Supported (the subset OpenAI's structured outputs document): `type` (one or a list of
// object/array/string/number/integer/boolean/null), `properties`, `required`,
// `additionalProperties` (false, true or a schema), `items`, `minItems`/`maxItems`, `enum`,
// `const`, `anyOf` (and `oneOf`, generated as anyOf), `allOf` of one schema, `minLength`/
// `maxLength`, local `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion allowed),
// string `pattern` (a regex subset) and `format` (json_schema_strings.cpp), integer `minimum`/
// `maximum`/`exclusive*` (an exact digit-range grammar, json_schema_numbers.cpp) and a single
// bound of 0 on a number.
// Annotations are ignored (title, description, default, examples, $schema, $id, $comment, ...), as
// are keywords whose value cannot restrict a document (uniqueItems false, additionalItems true, ...).
// Any other keyword is refused with an error naming it and where it is — never silently dropped.
//
// What the grammar writes: properties in the schema's order (as OpenAI's structured outputs do),
// optional ones optionally, then extra properties, never under a listed name, where
// additionalProperties is true or a schema, or is absent and no properties are listed (an object
// that lists them is closed by default, as llama.cpp's and xgrammar's grammars); compact JSON
// with optional whitespace (a space, or a newline and up to 20 spaces/tabs) between tokens; strings
// as valid UTF-8 with JSON escapes; numbers with at most 16 integer digits, 16 fraction digits and
// a 3-digit exponent (bounds that stop a sampled model running away with digits). A document that orders keys
// differently is valid JSON Schema but not generated — the grammar's documents are a subset of the schema's, never a
// superset.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/structured/grammar.hpp"

namespace sy {

// A schema the compiler refuses: `what()` names the keyword and its JSON pointer.
struct json_schema_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct json_schema_limits {
  size_t max_schema_bytes = 64 * 1024;
  int max_depth = 32;             // schema nesting (objects in properties in items ...)
  int max_bounded_repeat = 1000;  // maxLength / maxItems that unroll into rules
  size_t max_grammar_size = 200000;
};

// `schema_json`: the schema as JSON text. Throws json_schema_error.
grammar::grammar compile_json_schema(std::string_view schema_json, const json_schema_limits& limits = {});
// Any JSON object (`response_format: {"type": "json_object"}`).
grammar::grammar json_object_grammar();

}  // namespace sy
