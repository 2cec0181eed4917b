// The Prometheus text helpers both /metrics endpoints write with (common/metrics.hpp): a family's
// header, labelled samples with escaped values, and the unlabelled and histogram forms.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "common/metrics.hpp"

using sy::metric_family;

TEST_CASE("metric_family writes its header and one line per labelled sample", "[metrics]") {
  std::string out;
  metric_family f(out, "sy_things_total", "counter", "Things, by kind and place.");
  f.sample({{"kind", "plain"}, {"place", "here"}}, uint64_t{3});
  f.sample({{"kind", "none"}}, 0);
  f.sample({}, size_t{12345678901});  // integers in full, never as %g
  CHECK(out ==
        "# HELP sy_things_total Things, by kind and place.\n"
        "# TYPE sy_things_total counter\n"
        "sy_things_total{kind=\"plain\",place=\"here\"} 3\n"
        "sy_things_total{kind=\"none\"} 0\n"
        "sy_things_total 12345678901\n");
}

TEST_CASE("metric_family escapes label values and help text as the text format asks", "[metrics]") {
  std::string out;
  metric_family f(out, "sy_gauge", "gauge", "A \\ and a\nsecond line, \"quoted\".");
  f.sample({{"model", "C:\\models\\a.gguf"}, {"worker", "say \"hi\"\nbye"}}, 0.25);
  CHECK(out ==
        "# HELP sy_gauge A \\\\ and a\\nsecond line, \"quoted\".\n"
        "# TYPE sy_gauge gauge\n"
        "sy_gauge{model=\"C:\\\\models\\\\a.gguf\",worker=\"say \\\"hi\\\"\\nbye\"} 0.25\n");
}

TEST_CASE("metric and histogram open their families the same way", "[metrics]") {
  std::string one, same;
  sy::metric(one, "sy_up", "gauge", "1 while up.", 1);
  metric_family(same, "sy_up", "gauge", "1 while up.").sample({}, 1.0);
  CHECK(one == same);
  CHECK(one == "# HELP sy_up 1 while up.\n# TYPE sy_up gauge\nsy_up 1\n");

  sy::histogram h({0.1, 1});
  h.observe(0.05);
  h.observe(5);
  std::string out;
  h.render(out, "sy_wait_seconds", "Waits.");
  CHECK(out ==
        "# HELP sy_wait_seconds Waits.\n"
        "# TYPE sy_wait_seconds histogram\n"
        "sy_wait_seconds_bucket{le=\"0.1\"} 1\n"
        "sy_wait_seconds_bucket{le=\"1\"} 1\n"
        "sy_wait_seconds_bucket{le=\"+Inf\"} 2\n"
        "sy_wait_seconds_sum 5.05\n"
        "sy_wait_seconds_count 2\n");
}
