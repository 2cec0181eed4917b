// worker/thinking_budget.hpp: a thinking past its budget is closed with the end text's tokens,
// one that closes itself in time is never touched, and a resumed stream counts what it replays.
#include "worker/engine/thinking_budget.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"
#include "tests/unit/tiny_vocab.hpp"

using sy::thinking_budget;
using sy::token_id;

namespace {

const sy::tokenizer& vocab() {
  static const sy::tokenizer tok = sy::tokenizer::from_spec(sy::test::tiny_vocab());
  return tok;
}

// What the limiter emits over `n_emit` steps when the sampler would write `text`'s tokens in turn.
std::string run(thinking_budget& b, const std::string& text, size_t n_emit) {
  const std::vector<token_id> ids = vocab().encode(text, {.add_special = false});
  std::vector<token_id> out;
  for (size_t i = 0; i < n_emit; ++i) out.push_back(b.pick(ids[i % ids.size()]));
  return vocab().decode(out);
}

}  // namespace

TEST_CASE("thinking_budget: past the budget, the end text replaces what is sampled, then sampling goes on",
          "[thinking_budget]") {
  const std::string end = "\n</think>\n\n";
  const size_t n_end = vocab().encode(end, {.add_special = false}).size();
  thinking_budget b(5, end, vocab());
  const std::string thought = "<think>abcdefghijklmnopqrstuvwxyz";
  const std::string out = run(b, thought, 5 + n_end + 3);
  CHECK(out.substr(0, 5) == "<thin");  // the first 5 tokens as sampled
  CHECK(out.substr(5, end.size()) == end);
  CHECK(out.size() > 5 + end.size());  // then sampled again (the script's next tokens)
  CHECK(b.closed());
  CHECK(b.forced() == static_cast<int32_t>(n_end));
}

TEST_CASE("thinking_budget: a thinking closed in time is never touched", "[thinking_budget]") {
  thinking_budget b(20, "\n</think>\n\n", vocab());
  const std::string text = "<think>a</think>\n\nThe answer, at length, goes well past the budget.";
  const std::vector<token_id> ids = vocab().encode(text, {.add_special = false});
  REQUIRE(ids.size() > 20);
  std::vector<token_id> out;
  for (const token_id t : ids) out.push_back(b.pick(t));
  CHECK(out == ids);
  CHECK(b.closed());
  CHECK(b.forced() == 0);
}

TEST_CASE("thinking_budget: a resumed stream's replayed tokens count toward the budget", "[thinking_budget]") {
  const std::string end = "\n</think>\n\n";
  thinking_budget b(4, end, vocab());
  for (const token_id t : vocab().encode("<thi", {.add_special = false})) b.replay(t);
  CHECK(run(b, "nk>xyz", end.size()).substr(0, end.size()) == end);  // the budget was spent before
  // The tag split over the replayed and the new tokens still counts as the thinking closing.
  thinking_budget c(16, end, vocab());
  for (const token_id t : vocab().encode("<think>x</th", {.add_special = false})) c.replay(t);
  const std::string answer = "ink> and an answer that runs well past the budget";
  std::vector<token_id> tail;
  for (const token_id t : vocab().encode(answer, {.add_special = false})) tail.push_back(c.pick(t));
  CHECK(vocab().decode(tail) == answer);
  CHECK(c.closed());
  CHECK(c.forced() == 0);
}
