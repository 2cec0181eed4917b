// The real model, loaded once per test binary and shared by its test cases; tests that need it
// start with REQUIRE_MODEL(), which skips (with a warning) when the file was not downloaded.
#pragma once

#include <catch2/catch.hpp>

#include <fstream>
#include <memory>

#include "kernels/cpu/thread_pool.hpp"
#include "worker/llama_model.hpp"

namespace sy::test {

struct model_env {
  cpu::thread_pool pool{2};
  std::unique_ptr<llama_model> model;
};

inline model_env* env() {
  static std::unique_ptr<model_env> e = [] {
    auto r = std::make_unique<model_env>();
    if (std::ifstream(SY_MODEL_PATH).good()) r->model = llama_model::load(SY_MODEL_PATH, r->pool);
    return r;
  }();
  return e.get();
}

}  // namespace sy::test

#define REQUIRE_MODEL()                                                \
  if (!::sy::test::env()->model) {                                     \
    WARN("model not found at " SY_MODEL_PATH "; run deploy/setup.sh"); \
    return;                                                            \
  }
