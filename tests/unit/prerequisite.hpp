// Tests that cannot pass by not running (docs/testing.md). A test whose prerequisite is missing
// (the model file, redis-server) must neither pass silently nor fail where the prerequisite is
// merely not installed: SY_SKIP_TEST records the reason and returns, and the process then exits 77,
// which ctest shows as Skipped (SKIP_RETURN_CODE 77, tests/CMakeLists.txt). With CI set the same
// test fails instead: CI promises the prerequisites, so their absence there is a broken setup.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace sy::test {

inline bool in_ci() {
  const char* v = std::getenv("CI");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0;
}

// Reasons of the tests skipped in this process, in order. Catch2 runs tests on one thread.
inline std::vector<std::string>& skip_reasons() {
  static std::vector<std::string> reasons;
  return reasons;
}

// The process's exit code from Catch2's: a failure stays one; otherwise any skip makes it 77
// (under ctest a process runs one test case, so 77 means exactly "this test did not run").
inline int exit_code(int catch_result) {
  if (catch_result != 0 || skip_reasons().empty()) return catch_result;
  for (const auto& r : skip_reasons()) std::cerr << "SKIPPED: " << r << "\n";
  return 77;
}

#ifdef SY_MODEL_PATH
// The model the model-level tests load: $SY_MODEL when set (a missing path hides the model, to
// check the skip path), else the build's models/ file.
inline std::string model_path() {
  const char* v = std::getenv("SY_MODEL");
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(SY_MODEL_PATH);
}
// Whether model_path() can be read (SY_REQUIRE_MODEL_FILE).
inline bool model_present() { return std::ifstream(model_path()).good(); }
#endif

}  // namespace sy::test

// Ends the current test case as skipped with `reason` (streamable), or fails it when CI is set.
// The SUCCEED keeps `-w NoAssertions` from calling a skip a test without checks.
#define SY_SKIP_TEST(reason)                                                                 \
  do {                                                                                       \
    std::ostringstream sy_skip_text_;                                                        \
    sy_skip_text_ << reason;                                                                 \
    if (::sy::test::in_ci()) FAIL("prerequisite missing under CI: " << sy_skip_text_.str()); \
    ::sy::test::skip_reasons().push_back(sy_skip_text_.str());                               \
    SUCCEED("skipped: " << sy_skip_text_.str());                                             \
    return;                                                                                  \
  } while (0)

// Skips the current test (a failure under CI) when the model file was not downloaded: the one
// model prerequisite of every C++ test (model_env.hpp's REQUIRE_MODEL starts with it).
#define SY_REQUIRE_MODEL_FILE()                                                                   \
  do {                                                                                            \
    if (!::sy::test::model_present())                                                             \
      SY_SKIP_TEST("model not found at " << ::sy::test::model_path() << "; run deploy/setup.sh"); \
  } while (0)
