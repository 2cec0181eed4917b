#include "router/dispatch/dispatcher_actor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "router/dispatch/actor_protocol.hpp"

namespace sy::router {
namespace {

// Seconds on the actor system's clock: std::chrono::steady_clock in production, the simulated
// clock when the system runs CAF's testing scheduler (tests/unit/test_router_actors.cpp).
double now_s(const caf::local_actor* self) {
  return std::chrono::duration<double>(self->clock().now().time_since_epoch()).count();
}

struct shell {
  std::shared_ptr<dispatcher> d;
  std::shared_ptr<router_status> status;
  std::unique_ptr<zmq::socket_t> to_link;
  std::vector<link_frame> out;

  // Runs one handler body; an exception (out of memory, say) is logged and counted instead of
  // ending the actor — a dispatcher that died would leave every later request hanging.
  template <class F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "switchyard-router: dispatcher: %s failed: %s\n", what, e.what());
    }
    try {
      flush();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "switchyard-router: dispatcher: sending to the link failed: %s\n", e.what());
      out.clear();
    }
  }
  void flush() {
    for (link_frame& f : out) {
      std::array<zmq::message_t, 3> parts{zmq::message_t(&f.worker, 4), zmq::message_t(f.type), zmq::message_t(f.body)};
      zmq::send_multipart(*to_link, parts);  // inproc PUSH, unbounded HWM: never blocks for long
    }
    out.clear();
  }
  void publish(double t) {
    std::string text = d->render_metrics(t);
    {
      std::lock_guard<std::mutex> lk(status->mu);
      status->dispatcher_metrics = std::move(text);
      status->ready = d->ready(t);
      status->active = d->active();
      status->workers_ready = d->workers().n_ready();
      status->workers_ejected = d->workers().count(worker_state::ejected);
      status->published_through = status->publish_requests;  // every scrape numbered so far
    }
    status->published.notify_all();
  }
};

}  // namespace

caf::behavior dispatcher_actor(caf::event_based_actor* self, zmq::context_t* ctx, std::shared_ptr<dispatcher> d,
                               std::shared_ptr<router_status> status) {
  auto s = std::make_shared<shell>();
  s->d = std::move(d);
  s->status = std::move(status);
  s->to_link = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::push);
  s->to_link->set(zmq::sockopt::sndhwm, 0);
  s->to_link->set(zmq::sockopt::linger, 0);
  s->to_link->connect(k_link_inbox);
  self->send(self, tick_atom::value);
  return {
      [s, self](submit_atom, std::shared_ptr<routed_request> r) {
        s->guarded("a request", [&] { s->d->on_request(std::move(r), now_s(self), s->out); });
      },
      [s, self](gone_atom, uint64_t id) {
        s->guarded("a disconnect", [&] { s->d->on_client_gone(id, now_s(self), s->out); });
      },
      [s, self](frame_atom, uint32_t w, const std::string& type, const std::string& body, int64_t t_ns) {
        // Stamped by the link on the steady clock (router_clock.hpp), in nanoseconds.
        const double t_recv_s = static_cast<double>(t_ns) * 1e-9;
        s->guarded("a worker frame", [&] { s->d->on_frame(w, type, body, now_s(self), t_recv_s, s->out); });
      },
      [s, self](add_atom, const std::string& endpoint) {
        s->guarded("adding a worker", [&] { s->d->add_worker(endpoint, now_s(self), s->out); });
      },
      [s, self](retire_atom, const std::string& endpoint) {
        s->guarded("retiring a worker", [&] { s->d->retire_worker(endpoint, now_s(self), s->out); });
      },
      [s, self](drain_atom) {
        s->d->drain();
        s->publish(now_s(self));  // `active` as of now: main waits for it to reach 0
        std::lock_guard<std::mutex> lk(s->status->mu);
        s->status->draining = true;
      },
      [s, self](publish_atom) { s->publish(now_s(self)); },
      [s, self](tick_atom) {
        const double t = now_s(self);
        s->guarded("a tick", [&] { s->d->tick(t, s->out); });
        s->publish(t);
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
      },
  };
}

}  // namespace sy::router
