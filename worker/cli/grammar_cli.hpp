// `switchyard-worker json-grammar`: the JSON Schema compiler from the command line — its error for
// a schema it refuses, the grammar it builds, random documents of the grammar, and whether given
// documents are accepted (tests/integration/test_json_grammar.py checks both with `jsonschema`).
// Documents go in and out one per line, each as a JSON string (they may hold newlines).
#pragma once

#include "common/cli_args.hpp"

namespace sy {

int run_json_grammar(const cli_args& a);

}  // namespace sy
