// The real model, loaded once per test binary and shared by its test cases; tests that need it
// start with REQUIRE_MODEL(), which skips them (ctest: Skipped; a failure under CI) when the file
// was not downloaded (prerequisite.hpp's SY_REQUIRE_MODEL_FILE).
#pragma once

#include <catch2/catch.hpp>

#include <memory>

#include "kernels/cpu/thread_pool.hpp"
#include "tests/unit/prerequisite.hpp"
#include "worker/model/llama_model.hpp"

namespace sy::test {

struct model_env {
  cpu::thread_pool pool{2};
  std::unique_ptr<llama_model> model;
};

inline model_env* env() {
  static std::unique_ptr<model_env> e = [] {
    auto r = std::make_unique<model_env>();
    if (model_present()) r->model = llama_model::load(model_path(), r->pool);
    return r;
  }();
  return e.get();
}

}  // namespace sy::test

#define REQUIRE_MODEL()                \
  do {                                 \
    SY_REQUIRE_MODEL_FILE();           \
    REQUIRE(::sy::test::env()->model); \
  } while (0)
