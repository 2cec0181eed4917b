// Secrets published with the project are refused at start-up (common/wire/published_secrets.hpp).
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>

#include "common/wire/published_secrets.hpp"

TEST_CASE("published secrets: the example keys are known, fresh ones are not") {
  // From deploy/tenants.example.json, and the worker CURVE key the Kubernetes base once carried.
  CHECK(sy::published_secret("sk-ops-change-me") == "an example tenant API key");
  CHECK(sy::published_secret("sk-batch-change-me") == "an example tenant API key");
  CHECK(sy::published_secret("g&Hg!>s4oZOe&*D9ER%%>^T[YbJ5c9z0^1Ji*WzI") == "the example worker CURVE secret key");
  CHECK(sy::published_secret("sk-ops-change-me ").empty());  // exact bytes only
  CHECK(sy::published_secret("sk-3f1d9a0c7e2b4d6f8a1c3e5b7d9f0a2c4e6b8d0f").empty());
  CHECK(sy::published_secret("").empty());
}

TEST_CASE("published secrets: refused with what to do, or a warning for a demo") {
  CHECK_THROWS_WITH(sy::refuse_published("sk-webapp-change-me", "--tenants t.json: the key of tenant 'webapp'", false),
                    Catch::Contains("tenant 'webapp' is an example tenant API key published with Switchyard") &&
                        Catch::Contains("make-secrets.py") && Catch::Contains("--allow-example-keys"));
  CHECK_NOTHROW(sy::refuse_published("sk-webapp-change-me", "--tenants t.json", true));
  CHECK_NOTHROW(sy::refuse_published("a key of our own", "--tenants t.json", false));
}
