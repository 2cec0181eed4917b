// The worker link's plain class (worker/service/worker_link.hpp), without sockets or actors:
// envelopes from routers, the protocol error a malformed one gets, the heartbeats it keeps and
// repeats while the engine is inside a long step (times passed in, no clock), ZAP answers.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "common/wire/curve_keys.hpp"
#include "common/wire/protocol.hpp"
#include "worker/service/worker_link.hpp"

using namespace std::chrono_literals;
using sy::worker_link;
using sy::link::frame;

namespace {

frame parts(std::vector<std::string> ps) {
  frame f;
  for (auto& p : ps) f.emplace_back(p);
  return f;
}

frame heartbeat_to(const std::string& router, uint64_t steps) {
  sy::proto::heartbeat hb;
  hb.steps = steps;
  return parts({router, "heartbeat", sy::proto::encode(hb)});
}

uint64_t steps_of(const frame& f) {
  const auto r = sy::proto::decode(f.at(1).to_string_view(), f.at(2).to_string_view());
  const auto* hb = r.get_if<sy::proto::heartbeat>();
  REQUIRE(hb);
  return hb->steps;
}

const worker_link::clock::time_point t0{};

}  // namespace

TEST_CASE("worker link: [identity][type][body] from a router is for the engine") {
  sy::link_config cfg;
  sy::link_counters c;
  worker_link l(cfg, c, t0);
  frame reply;
  CHECK(l.from_router(parts({"r1", "cancel", "body"}), reply));
  CHECK(reply.empty());
  CHECK(c.frames_in == 1);
  CHECK(c.malformed_envelopes == 0);
}

TEST_CASE("worker link: a malformed envelope is answered with a protocol error, bad_message") {
  sy::link_config cfg;
  sy::link_counters c;
  worker_link l(cfg, c, t0);
  frame reply;
  CHECK_FALSE(l.from_router(parts({"r1", "only-one"}), reply));
  CHECK(c.frames_in == 1);
  CHECK(c.malformed_envelopes == 1);
  REQUIRE(reply.size() == 3);
  CHECK(reply[0].to_string() == "r1");
  CHECK(reply[1].to_string() == "error");
  const auto r = sy::proto::decode(reply[1].to_string_view(), reply[2].to_string_view());
  const auto* e = r.get_if<sy::proto::error>();
  REQUIRE(e);
  CHECK(e->code == sy::proto::error_code::bad_message);
  CHECK(e->message == "expected [type][body] frames");
  CHECK(e->request_id.empty());
}

TEST_CASE("worker link: the engine's last heartbeat is repeated only while the engine is silent") {
  sy::link_config cfg;
  cfg.heartbeat_repeat = 750ms;
  cfg.engine_silence = 5000ms;
  sy::link_counters c;
  worker_link l(cfg, c, t0);
  l.from_engine(heartbeat_to("r1", 1), t0);
  l.from_engine(heartbeat_to("r1", 2), t0 + 100ms);  // the newer one is kept
  l.from_engine(parts({"r1", "tokens", "x"}), t0 + 200ms);
  CHECK(l.kept_heartbeats() == 1);
  CHECK(l.heartbeats_due(t0 + 500ms).empty());  // the engine spoke 400 ms ago
  auto due = l.heartbeats_due(t0 + 900ms);
  REQUIRE(due.size() == 1);
  CHECK(due[0][0].to_string() == "r1");
  CHECK(steps_of(due[0]) == 2);
  CHECK(c.heartbeats_repeated == 1);
  CHECK(l.heartbeats_due(t0 + 1000ms).empty());  // just repeated
  CHECK(l.heartbeats_due(t0 + 1700ms).size() == 1);
  CHECK(l.heartbeats_due(t0 + 5200ms).empty());  // silent past engine_silence: no cover
  CHECK(c.heartbeats_repeated == 2);
}

TEST_CASE("worker link: each router's heartbeat is its own, a gone router's is forgotten") {
  sy::link_config cfg;
  sy::link_counters c;
  worker_link l(cfg, c, t0);
  l.from_engine(heartbeat_to("r1", 7), t0);
  l.from_engine(heartbeat_to("r2", 7), t0);
  CHECK(l.heartbeats_due(t0 + 1s).size() == 2);
  l.router_gone("r1");
  const auto due = l.heartbeats_due(t0 + 2s);
  REQUIRE(due.size() == 1);
  CHECK(due[0][0].to_string() == "r2");
}

TEST_CASE("worker link: engine_silence 0 never repeats") {
  sy::link_config cfg;
  cfg.engine_silence = 0ms;
  sy::link_counters c;
  worker_link l(cfg, c, t0);
  l.from_engine(heartbeat_to("r1", 1), t0);
  CHECK(l.heartbeats_due(t0 + 1s).empty());
}

TEST_CASE("worker link: heartbeats and KV events are the expendable frames") {
  CHECK(sy::expendable_frame(parts({"r", "heartbeat", ""})));
  CHECK(sy::expendable_frame(parts({"r", "kv_events", ""})));
  CHECK_FALSE(sy::expendable_frame(parts({"r", "tokens", ""})));
  CHECK_FALSE(sy::expendable_frame(parts({"r"})));
}

TEST_CASE("worker link: ZAP admits a CURVE client whose key is allowed, refuses and counts the rest") {
  const std::string raw(32, 'k');  // a public key as ZAP hands it over: 32 bytes
  const std::string key_z85 = sy::curve::z85_of(raw.data(), raw.size());
  REQUIRE(key_z85.size() == 40);
  sy::link_counters c;
  const auto req = [&](const std::string& mech) { return parts({"1.0", "7", "", "1.2.3.4", "", mech, raw}); };
  const frame ok = sy::zap_reply(req("CURVE"), {key_z85}, c);
  REQUIRE(ok.size() == 6);
  CHECK(ok[1].to_string() == "7");
  CHECK(ok[2].to_string() == "200");
  CHECK(c.auth_refused == 0);
  CHECK(sy::zap_reply(req("CURVE"), {}, c)[2].to_string() == "400");
  CHECK(sy::zap_reply(req("PLAIN"), {key_z85}, c)[2].to_string() == "400");
  CHECK(sy::zap_reply(parts({"1.0"}), {key_z85}, c)[2].to_string() == "400");
  CHECK(c.auth_refused == 3);
}
