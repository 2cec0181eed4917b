// worker_service (the worker's protocol logic, no sockets, no actors) when the engine's step
// fails: every live request ends with an internal_error frame, nothing waits forever, and the
// worker goes on serving.
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/kv_hash.hpp"
#include "tests/unit/model_env.hpp"
#include "worker/model/cpu_backend.hpp"
#include "worker/service/worker_service.hpp"

using namespace sy;
using sy::test::env;

namespace {

// The CPU backend, or a failure (as a device error would surface) while `fail` is set.
class flaky_backend final : public forward_backend {
 public:
  flaky_backend(const llama_model& m, cpu::thread_pool& pool) : cpu_(m, pool, 64, 16, cpu::kv_type::f16, 1024) {}
  void run(std::span<const batch_seq> b, std::span<const row_sampling> s, step_output& out) override {
    if (fail) throw std::runtime_error("CUDA error: an illegal memory access was encountered");
    cpu_.run(b, s, out);
  }
  bool samples() const override { return false; }
  int32_t n_kv_blocks() const override { return cpu_.n_kv_blocks(); }
  int32_t n_window_blocks() const override { return cpu_.n_window_blocks(); }
  int32_t block_size() const override { return cpu_.block_size(); }
  size_t kv_bytes() const override { return cpu_.kv_bytes(); }
  size_t weight_read_bytes() const override { return cpu_.weight_read_bytes(); }
  size_t kv_bytes_per_token() const override { return cpu_.kv_bytes_per_token(); }
  std::string describe() const override { return "flaky"; }
  bool fail = false;

 private:
  cpu_backend cpu_;
};

proto::submit submit_of(const std::string& id, int32_t max_tokens) {
  const auto& m = *env()->model;
  proto::submit s;
  s.request_id = id;
  s.prompt = m.vocab().encode(m.chat().apply({{"user", "Name a colour."}}));
  s.sampling.max_tokens = max_tokens;
  s.sampling.ignore_eos = true;
  s.stream = true;
  return s;
}

template <class T>
void feed(worker_service& w, const std::string& peer, const T& m, std::vector<out_frame>& out) {
  w.on_frame(peer, std::string(proto::name(proto::type_of<T>)), proto::encode(m), 1000, out);
}

}  // namespace

TEST_CASE("a failing step ends every live request with internal_error and the worker keeps serving") {
  REQUIRE_MODEL();
  auto backend = std::make_unique<flaky_backend>(*env()->model, env()->pool);
  flaky_backend* flaky = backend.get();
  engine_config cfg;
  cfg.n_kv_blocks = 64;
  engine eng(*env()->model, std::move(backend), cfg);
  worker_service w(eng, {});
  std::vector<out_frame> out;
  proto::hello h;
  h.router_id = "r";
  feed(w, "peer-a", h, out);
  feed(w, "peer-a", submit_of("a1", 16), out);
  feed(w, "peer-b", submit_of("b1", 16), out);
  out.clear();
  w.step(1000, out);  // prefill: both produce their first token
  REQUIRE(out.size() == 2);

  flaky->fail = true;
  out.clear();
  w.step(1000, out);
  REQUIRE(out.size() == 2);
  for (const auto& f : out) {
    REQUIRE(f.type == proto::name(proto::msg_type::error));
    const auto r = proto::decode(f.type, f.body);
    REQUIRE(r);
    const auto* e = r.get_if<proto::error>();
    REQUIRE(e);
    CHECK(e->code == proto::error_code::internal_error);
    CHECK(e->request_id == (f.peer == "peer-a" ? "a1" : "b1"));
    CHECK(e->message.find("illegal memory access") != std::string::npos);
    CHECK(e->failure == 1);  // both report the worker's first failed step: one failure, not two
  }
  CHECK(w.counters().step_failures == 1);

  // The cancelled requests leave the engine at the next step; then new work is served again.
  flaky->fail = false;
  out.clear();
  while (w.step(1000, out)) {
  }
  CHECK(out.empty());  // nothing more about the failed requests
  CHECK(eng.stats().running == 0);
  CHECK(eng.pool().n_available() == 64);
  feed(w, "peer-a", submit_of("a2", 4), out);
  out.clear();
  while (w.step(1000, out)) {
  }
  REQUIRE_FALSE(out.empty());
  // Its frames are numbered 1, 2, ... in the order they go out (a receiver finds a lost one).
  uint32_t expect_seq = 1;
  for (const auto& f : out) {
    const auto d = proto::decode(f.type, f.body);
    if (const auto* each = d ? d.get_if<proto::tokens>() : nullptr) CHECK(each->seq == expect_seq++);
  }
  CHECK(expect_seq > 2);
  const auto last = proto::decode(out.back().type, out.back().body);
  REQUIRE(last);
  const auto* t = last.get_if<proto::tokens>();
  REQUIRE(t);
  CHECK(t->request_id == "a2");
  CHECK(t->finish_reason == sy::finish_reason::length);
  CHECK(t->usage.completion_tokens == 4);
}

TEST_CASE("kv events: a router that asks gets a snapshot, then each step's blocks before its tokens") {
  REQUIRE_MODEL();
  engine_config cfg;
  cfg.n_kv_blocks = 64;
  engine eng(*env()->model, env()->pool, cfg);
  worker_service w(eng, {});
  std::vector<out_frame> out;
  auto decoded = [](const out_frame& f) {
    auto r = proto::decode(f.type, f.body);
    REQUIRE(r);
    return r;
  };
  proto::hello h;
  h.router_id = "r";
  h.kv_events = true;
  feed(w, "peer-a", h, out);
  h.kv_events = false;
  feed(w, "peer-b", h, out);  // an older router: never gets kv_events
  // a: welcome, snapshot, heartbeat; b: welcome, then a heartbeat to each.
  REQUIRE(out.size() == 6);
  for (const auto& f : out) CHECK((f.type != "kv_events" || f.peer == "peer-a"));
  const auto welcome = decoded(out[0]);
  const auto* wm = welcome.get_if<proto::welcome>();
  REQUIRE(wm);
  CHECK(wm->kv_events);
  REQUIRE(out[1].type == "kv_events");  // before the heartbeat that names its seq
  const auto snap = decoded(out[1]);
  REQUIRE(snap.get_if<proto::kv_events>());
  CHECK(out[1].peer == "peer-a");
  const auto hb = decoded(out[2]);
  REQUIRE(hb.get_if<proto::heartbeat>());
  CHECK(hb.get_if<proto::heartbeat>()->kv_seq == snap.get_if<proto::kv_events>()->seq);
  CHECK(snap.get_if<proto::kv_events>()->reset);
  CHECK(snap.get_if<proto::kv_events>()->stored.empty());

  const proto::submit s = submit_of("a1", 2);
  feed(w, "peer-b", s, out);
  out.clear();
  w.step(1000, out);  // the prefill registers the prompt's full blocks
  REQUIRE(out.size() >= 2);
  CHECK(out[0].peer == "peer-a");
  const auto first = decoded(out[0]);
  const auto* ev = first.get_if<proto::kv_events>();
  REQUIRE(ev);
  CHECK(ev->seq == snap.get_if<proto::kv_events>()->seq + 1);
  // Exactly the hashes a router computes from the prompt it sent, with the welcome's salt.
  const auto want = kv_block_hashes(s.prompt, wm->kv_block_size, wm->kv_hash_salt);
  REQUIRE_FALSE(want.empty());
  CHECK(ev->stored == want);
  CHECK(ev->evicted.empty());
  for (const auto& f : out) CHECK((f.peer == "peer-b" || f.type == "kv_events"));  // b gets only its tokens

  // A resync: a fresh snapshot holding those blocks (cached once the request ends).
  while (w.step(1000, out)) {
  }
  out.clear();
  feed(w, "peer-a", proto::kv_resync{.reason = "gap"}, out);
  REQUIRE(out.size() == 1);
  const auto again = decoded(out[0]);
  const auto* r = again.get_if<proto::kv_events>();
  REQUIRE(r);
  CHECK(r->reset);
  CHECK(std::set<uint64_t>(r->stored.begin(), r->stored.end()).count(want.back()) == 1);
  CHECK(w.counters().kv.snapshots == 2);
  CHECK(w.counters().kv_subscribers == 1);
  w.on_peer_gone("peer-a");
  CHECK(w.counters().kv_subscribers == 0);
}
