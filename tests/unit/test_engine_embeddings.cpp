// Embeddings in the engine (docs/worker.md, "Embeddings"): the final normed hidden states of each
// input, pooled and L2-normalized, through the same forward pass as prompts; no KV block kept and
// nothing in the prefix cache afterwards; generations running alongside are not changed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/unit/model_env.hpp"
#include "worker/engine/engine.hpp"

using namespace sy;
using sy::test::env;

namespace {

std::vector<token_id> ids_of(const std::string& text) { return env()->model->vocab().encode(text); }

// Steps until idle; the embeddings finished, by id, and the generations' tokens, by id.
struct run_result {
  std::map<std::string, embedding_event> embedded;
  std::map<std::string, std::vector<token_id>> tokens;
};
run_result run_all(engine& e) {
  run_result r;
  std::vector<request_event> ev;
  std::vector<embedding_event> em;
  for (int i = 0; i < 100000 && e.has_work(); ++i) {
    ev.clear();
    e.step(0, ev);
    for (auto& x : ev) r.tokens[x.id].insert(r.tokens[x.id].end(), x.tokens.begin(), x.tokens.end());
    em.clear();
    e.take_embeddings(em);
    for (auto& x : em) r.embedded[x.id] = std::move(x);
  }
  REQUIRE_FALSE(e.has_work());
  return r;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

engine_config with_pooling(embedding_pooling p, int32_t blocks = 64) {
  engine_config c;
  c.n_kv_blocks = blocks;
  c.max_context = 512;
  c.pooling = p;
  return c;
}

void require_clean_pool(const engine& e) {
  std::string why;
  CHECK(e.pool().check_invariants(&why));
  INFO(why);
  CHECK(e.pool().stats().in_use == 0);
  CHECK(e.pool().registered_hashes().empty());  // nothing entered the prefix cache
}

std::string words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += " word";
  return s;
}

const std::vector<std::string> texts = {"The cat sat on the mat.",
                                        "A second sentence, somewhat longer than the first one.", "Short.",
                                        words(300)};  // more than a step's 256 tokens

}  // namespace

TEST_CASE("embeddings are unit vectors of the hidden size, the same batched as alone, and leave no KV block") {
  REQUIRE_MODEL();
  engine e(*env()->model, env()->pool, with_pooling(embedding_pooling::mean));
  std::vector<std::vector<token_id>> inputs;
  for (const auto& t : texts) inputs.push_back(ids_of(t));
  REQUIRE_FALSE(e.submit_embedding("batch", inputs));
  auto batch = run_all(e).embedded.at("batch");
  REQUIRE(batch.data.size() == texts.size());
  int64_t tokens = 0;
  for (const auto& in : inputs) tokens += static_cast<int64_t>(in.size());
  CHECK(batch.prompt_tokens == tokens);
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO(texts[i]);
    REQUIRE(batch.data[i].size() == static_cast<size_t>(env()->model->hparams().n_embd));
    CHECK(std::abs(dot(batch.data[i], batch.data[i]) - 1.0) < 1e-5);
    REQUIRE_FALSE(e.submit_embedding("one", {inputs[i]}));
    const auto one = run_all(e).embedded.at("one");
    CHECK(one.data.at(0) == batch.data[i]);  // batching-invariant rows: bit for bit
  }
  CHECK(dot(batch.data[0], batch.data[1]) < 0.9999);  // different texts, different vectors
  require_clean_pool(e);
}

TEST_CASE("mean and last pooling agree on a one-token input and differ on longer ones") {
  REQUIRE_MODEL();
  engine mean(*env()->model, env()->pool, with_pooling(embedding_pooling::mean));
  engine last(*env()->model, env()->pool, with_pooling(embedding_pooling::last));
  const auto ids = ids_of("Pooling of a few tokens.");
  REQUIRE(ids.size() > 2);
  for (engine* e : {&mean, &last}) REQUIRE_FALSE(e->submit_embedding("x", {ids, {ids[0]}}));
  const auto m = run_all(mean).embedded.at("x"), l = run_all(last).embedded.at("x");
  CHECK(m.data[1] == l.data[1]);
  CHECK(dot(m.data[0], l.data[0]) < 0.9999);
  CHECK(std::abs(dot(l.data[0], l.data[0]) - 1.0) < 1e-5);
}

TEST_CASE("an embedding beside generations changes none of their tokens and waits for blocks under pressure") {
  REQUIRE_MODEL();
  sampling_params greedy;
  greedy.max_tokens = 24;
  greedy.ignore_eos = true;
  const auto prompt = ids_of("Once upon a time, in a small village by the sea,");
  std::vector<token_id> alone;
  std::vector<uint64_t> cached_alone;
  {
    engine e(*env()->model, env()->pool, with_pooling(embedding_pooling::mean));
    REQUIRE_FALSE(e.submit("g", prompt, greedy, 0));
    alone = run_all(e).tokens.at("g");
    cached_alone = e.pool().registered_hashes();
  }
  // 14 blocks of 16 tokens: the generation holds 2 or 3, the long input needs 12 and the two
  // inputs together 13, so the embedding runs its inputs apart or waits for blocks.
  engine e(*env()->model, env()->pool, with_pooling(embedding_pooling::mean, 14));
  REQUIRE_FALSE(e.submit("g", prompt, greedy, 0));
  std::vector<request_event> ev;
  for (int i = 0; i < 3; ++i) e.step(0, ev);  // the generation holds its blocks
  const auto long_ids = ids_of(words(185));
  REQUIRE(long_ids.size() > 176);  // 12 blocks
  REQUIRE_FALSE(e.submit_embedding("emb", {long_ids, ids_of("and a short one")}));
  auto r = run_all(e);
  std::vector<token_id> early;
  for (auto& x : ev) early.insert(early.end(), x.tokens.begin(), x.tokens.end());
  r.tokens["g"].insert(r.tokens["g"].begin(), early.begin(), early.end());
  CHECK(r.tokens.at("g") == alone);
  REQUIRE(r.embedded.at("emb").data.size() == 2);
  CHECK(e.pool().stats().in_use == 0);
  // The prefix cache holds the generation's blocks (those eviction left), nothing of the embedding.
  for (const uint64_t h : e.pool().registered_hashes())
    CHECK(std::find(cached_alone.begin(), cached_alone.end(), h) != cached_alone.end());
}

TEST_CASE("embedding requests the engine cannot serve are refused with a named error", "[bookkeeping]") {
  REQUIRE_MODEL();
  engine off(*env()->model, env()->pool, with_pooling(embedding_pooling::none));
  auto err = off.submit_embedding("a", {{1, 2, 3}});
  REQUIRE(err);
  CHECK(err->code == error_code::embeddings_not_supported);
  CHECK(err->message.find("--embeddings") != std::string::npos);
  CHECK_FALSE(off.has_work());

  engine e(*env()->model, env()->pool, with_pooling(embedding_pooling::mean, 8));
  const int32_t n_vocab = static_cast<int32_t>(env()->model->hparams().n_vocab);
  CHECK(e.submit_embedding("a", {})->code == error_code::invalid_request);
  CHECK(e.submit_embedding("a", {{1}, {}})->code == error_code::invalid_request);
  CHECK(e.submit_embedding("a", {{n_vocab}})->code == error_code::invalid_request);
  CHECK(e.submit_embedding("a", {std::vector<token_id>(513, 1)})->code == error_code::invalid_request);  // > context
  CHECK(e.submit_embedding("a", {std::vector<token_id>(200, 1)})->code == error_code::exceeds_kv_capacity);
  CHECK_FALSE(e.has_work());
  REQUIRE_FALSE(e.submit_embedding("a", {{1, 2}}));
  CHECK(e.submit_embedding("a", {{1, 2}})->code == error_code::duplicate_request);
  CHECK(e.cancel("a"));  // dropped before it ran
  CHECK_FALSE(e.has_work());
  CHECK_FALSE(e.cancel("a"));
}
