// Catch2's main with two rules for every test binary (issue 14): a test case that checks nothing
// fails (-w NoAssertions, set here because Catch2 v2 accepts a single -w on the command line and
// ctest's discovery passes -w NoTests), and a run that skipped a test exits 77 (prerequisite.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "prerequisite.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  auto& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoAssertions);
  return sy::test::exit_code(session.run());
}
