// Readers of a request body's JSON fields, shared by the API parsers (openai_request.cpp,
// anthropic_api.cpp, embeddings_api.cpp): a field that is absent or null is "not given"; a value
// of the wrong type or out of range is a 400 naming the parameter (bad_request). The readers
// throw `rejected`; each parser's entry point catches it and returns the error, so nothing past
// the edge sees an exception (docs/engineering.md, "Parse at the edge"). Templates over the JSON
// type: the OpenAI parser reads nlohmann::json, the Anthropic translation ordered_json.
#pragma once

#include <string>
#include <utility>

#include "router/openai/openai_request.hpp"

namespace sy::router::json_fields {

struct rejected {
  api_error error;
};

[[noreturn]] inline void reject(std::string param, std::string message, std::string code = "invalid_value") {
  throw rejected{bad_request(std::move(param), std::move(message), std::move(code))};
}

inline std::string quoted(const std::string& param) { return "'" + param + "'"; }

template <class Json>
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const Json& got) {
  reject(param, quoted(param) + " must be " + expected + ", got " + got.type_name(), "invalid_type");
}

// The value of `key`, or nullptr when it is absent or null.
template <class Json>
const Json* field(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

template <class Json>
const std::string& as_string(const Json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.template get_ref<const std::string&>();
}

}  // namespace sy::router::json_fields
