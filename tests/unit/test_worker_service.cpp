// worker_service (the worker's protocol logic, no sockets, no actors) when the engine's step
// fails: every live request ends with an internal_error frame, nothing waits forever, and the
// worker goes on serving.
#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/unit/model_env.hpp"
#include "worker/cpu_backend.hpp"
#include "worker/worker_service.hpp"

using namespace sy;
using sy::test::env;

namespace {

// The CPU backend, or a failure (as a device error would surface) while `fail` is set.
class flaky_backend final : public forward_backend {
 public:
  flaky_backend(const llama_model& m, cpu::thread_pool& pool) : cpu_(m, pool, 64, 16, cpu::kv_type::f16) {}
  void run(std::span<const batch_seq> b, std::span<const row_sampling> s, step_output& out) override {
    if (fail) throw std::runtime_error("CUDA error: an illegal memory access was encountered");
    cpu_.run(b, s, out);
  }
  bool samples() const override { return false; }
  int32_t n_kv_blocks() const override { return cpu_.n_kv_blocks(); }
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
  s.prompt = m.vocab().encode(m.chat().apply({{"user", "Name a colour."}}), true, true);
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
  const auto last = proto::decode(out.back().type, out.back().body);
  REQUIRE(last);
  const auto* t = last.get_if<proto::tokens>();
  REQUIRE(t);
  CHECK(t->request_id == "a2");
  CHECK(t->finish_reason == "length");
  CHECK(t->usage.completion_tokens == 4);
}
