#include "router/dispatcher_actor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "router/actor_protocol.hpp"

namespace sy::router {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct shell {
  std::shared_ptr<dispatcher> d;
  std::shared_ptr<router_status> status;
  std::unique_ptr<zmq::socket_t> to_link;
  std::vector<link_frame> out;

  void flush() {
    for (link_frame& f : out) {
      std::array<zmq::message_t, 3> parts{zmq::message_t(&f.worker, 4), zmq::message_t(f.type), zmq::message_t(f.body)};
      zmq::send_multipart(*to_link, parts);  // inproc PUSH, unbounded HWM: never blocks for long
    }
    out.clear();
  }
  void publish(double t) {
    std::string text = d->render_metrics();
    std::lock_guard<std::mutex> lk(status->mu);
    status->dispatcher_metrics = std::move(text);
    status->ready = d->ready(t);
    status->active = d->active();
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
      [s](submit_atom, std::shared_ptr<routed_request> r) {
        if (r->ex->disconnected()) return;  // gone before it arrived
        s->d->on_request(std::move(r), now_s(), s->out);
        s->flush();
      },
      [s](gone_atom, uint64_t id) {
        s->d->on_client_gone(id, now_s(), s->out);
        s->flush();
      },
      [s](frame_atom, uint32_t w, const std::string& type, const std::string& body, int64_t t_ns) {
        const auto t_recv = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(t_ns));
        s->d->on_frame(w, type, body, now_s(), t_recv, s->out);
        s->flush();
      },
      [s](add_atom, const std::string& endpoint) {
        s->d->add_worker(endpoint, now_s(), s->out);
        s->flush();
      },
      [s](retire_atom, const std::string& endpoint) { s->d->retire_worker(endpoint); },
      [s](drain_atom) {
        s->d->drain();
        std::lock_guard<std::mutex> lk(s->status->mu);
        s->status->draining = true;
      },
      [s, self](tick_atom) {
        const double t = now_s();
        s->d->tick(t, s->out);
        s->flush();
        s->publish(t);
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
      },
  };
}

}  // namespace sy::router
