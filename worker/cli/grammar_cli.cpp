#include "worker/cli/grammar_cli.hpp"

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/structured/grammar.hpp"
#include "common/structured/json_schema.hpp"

namespace sy {

int run_json_grammar(const cli_args& a) {
  a.check_known({"schema", "json-object", "sample", "seed", "check", "dump"});
  grammar::grammar g;
  if (a.has("json-object")) {
    g = json_object_grammar();
  } else {
    if (!a.has("schema")) throw std::invalid_argument("json-grammar: --schema JSON|@FILE or --json-object is required");
    std::string schema = a.get("schema");
    if (!schema.empty() && schema[0] == '@') {
      std::ifstream f(schema.substr(1), std::ios::binary);
      if (!f) throw std::runtime_error("json-grammar: cannot read " + schema.substr(1));
      std::ostringstream ss;
      ss << f.rdbuf();
      schema = ss.str();
    }
    try {
      g = compile_json_schema(schema);
    } catch (const json_schema_error& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  const grammar::matcher m(g);
  if (a.has("dump")) std::cout << g.dump();
  if (a.has("sample")) {
    const int64_t n = a.get_int("sample", 10);
    const auto seed = static_cast<uint64_t>(a.get_int("seed", 1));
    int64_t written = 0;
    for (int64_t i = 0; written < n && i < n * 20; ++i) {
      // Walk lengths vary from tiny to a few hundred bytes.
      const size_t soft = static_cast<size_t>((seed * 7919 + static_cast<uint64_t>(i) * 104729) % 300);
      if (const auto doc = grammar::random_sentence(m, seed * 1000003 + static_cast<uint64_t>(i), soft, 20000)) {
        std::cout << nlohmann::json(*doc).dump() << "\n";  // a JSON string per line
        ++written;
      }
    }
  }
  if (a.has("check")) {  // one document per line on stdin, as a JSON string: 1 accepted, 0 not
    std::string line;
    while (std::getline(std::cin, line)) {
      const std::string doc = nlohmann::json::parse(line).get<std::string>();
      std::cout << (m.accept(m.initial(), doc).accepting() ? 1 : 0) << "\n";
    }
  }
  return 0;
}

}  // namespace sy
