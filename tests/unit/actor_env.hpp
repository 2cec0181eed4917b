// A CAF 0.17 actor system for actor tests under Catch2 (docs/testing.md, "Actors on a testing
// scheduler"): `scheduler.policy = testing`, so scheduled (event-based) actors run only when the
// test steps the test_coordinator, one message per run_once(), and delayed messages wait on a
// simulated clock that only the test advances. Nothing sleeps and no result depends on how fast the
// machine is.
//
// CAF's own test DSL (caf/test/dsl.hpp) is not used: it pulls in caf/all.hpp and CAF's unit-test
// framework, whose engine (command line, CAF_CHECK) its fixtures call; this is the part of its
// test_coordinator_fixture these tests need.
//
// Detached and blocking actors (the ZeroMQ link actors) still get a thread of their own here;
// the test coordinator never runs them.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace sy::test {

class actor_env {
 public:
  actor_env() : sys_(configure(cfg_)), sched_(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())) {}
  actor_env(const actor_env&) = delete;
  actor_env& operator=(const actor_env&) = delete;

  // The system waits for every actor before it goes, and only the test runs scheduled actors:
  // whatever is still alive is stopped (and run to its end) here.
  ~actor_env() {
    for (const auto& a : owned_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched_.run();
  }

  caf::actor_system& sys() { return sys_; }
  // run() / run_once(): handle queued messages (one per run_once); has_job(): any queued.
  caf::scheduler::test_coordinator& sched() { return sched_; }

  // Spawns a scheduled actor the test steps; it is stopped when the environment goes.
  template <class... Ts>
  caf::actor spawn(Ts&&... xs) {
    caf::actor a = sys_.spawn(std::forward<Ts>(xs)...);
    owned_.push_back(a);
    return a;
  }

  // Advances the simulated clock in steps of `step`, delivering the delayed messages that fall
  // due at each and running every actor until idle after each, as a periodic timer would see it.
  void advance(std::chrono::milliseconds total, std::chrono::milliseconds step = std::chrono::milliseconds(100)) {
    for (auto t = std::chrono::milliseconds(0); t < total; t += step) {
      sched_.advance_time(std::min(step, total - t));
      sched_.run();
    }
  }

 private:
  static caf::actor_system_config& configure(caf::actor_system_config& cfg) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    return cfg;
  }

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
  std::vector<caf::actor> owned_;  // spawned by spawn(): stopped at the end
};

}  // namespace sy::test
