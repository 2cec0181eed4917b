#include "router/http/responses_store.hpp"

#include <mutex>
#include <vector>

#include "cache/entry_mac.hpp"
#include "cache/percent_escape.hpp"
#include "common/metrics.hpp"
#include "router/openai/responses_api.hpp"

namespace sy::router {
namespace {

using cache::redis_reply;

}  // namespace

std::string responses_store::key(std::string_view tenant, std::string_view id) {
  return "sy:v1:resp:" + cache::percent_escape(tenant, ':') + ":" + std::string(id);
}

void responses_store::get(std::string_view tenant, const std::string& id,
                          std::function<void(outcome, std::string)> done) {
  auto k = key(tenant, id);
  const std::string mac_key = cache_.policy().mac_key;
  auto shared = std::make_shared<std::function<void(outcome, std::string)>>(std::move(done));
  const bool queued = cache_.submit(
      [n = n_, k, mac_key, shared](cache::redis_client& c) {
        auto r = c.command({"GET", k});
        if (!r || r->is_error()) {
          n->read_failures++;
          (*shared)(outcome::unavailable, "");
          return;
        }
        if (r->is_nil()) {
          (*shared)(outcome::not_found, "");
          return;
        }
        if (mac_key.empty()) {
          (*shared)(outcome::ok, std::move(r->str));
          return;
        }
        const auto inner = cache::unseal(mac_key, k, r->str);
        if (!inner) {
          (*shared)(outcome::not_found, "");
          return;
        }
        (*shared)(outcome::ok, std::string(*inner));
      },
      /*urgent=*/true);
  if (!queued) {
    n_->read_failures++;
    (*shared)(outcome::unavailable, "");
  }
}

void responses_store::put(std::string_view tenant, const std::string& id, std::string record,
                          std::function<void(bool)> done) {
  auto k = key(tenant, id);
  const std::string mac_key = cache_.policy().mac_key;
  if (!mac_key.empty()) record = cache::seal(mac_key, k, std::move(record));
  auto shared = std::make_shared<std::function<void(bool)>>(std::move(done));
  const bool queued = cache_.submit(
      [n = n_, k, record = std::move(record), ttl = std::to_string(ttl_.count()), shared](cache::redis_client& c) {
        auto r = c.command({"SET", k, record, "EX", ttl});
        const bool ok = r && !r->is_error();
        (ok ? n->stored : n->store_failures)++;
        (*shared)(ok);
      },
      /*urgent=*/false);
  if (!queued) {
    n_->store_failures++;
    (*shared)(false);
  }
}

void responses_store::remove(std::string_view tenant, const std::string& id, std::function<void(outcome)> done) {
  auto k = key(tenant, id);
  auto shared = std::make_shared<std::function<void(outcome)>>(std::move(done));
  const bool queued = cache_.submit(
      [k, shared](cache::redis_client& c) {
        auto r = c.command({"DEL", k});
        if (!r || r->is_error()) {
          (*shared)(outcome::unavailable);
          return;
        }
        (*shared)(r->integer > 0 ? outcome::ok : outcome::not_found);
      },
      /*urgent=*/true);
  if (!queued) (*shared)(outcome::unavailable);
}

std::string responses_store::render_metrics() const {
  std::string out;
  metric(out, "switchyard_router_responses_stored_total", "counter", "Responses API responses stored in Redis.",
         static_cast<double>(n_->stored.load()));
  metric(out, "switchyard_router_responses_store_failures_total", "counter",
         "Responses API responses not stored (Redis error or timeout, cache threads backed up).",
         static_cast<double>(n_->store_failures.load()));
  metric(out, "switchyard_router_responses_read_failures_total", "counter",
         "Stored responses that could not be read (Redis error or timeout): answered 503.",
         static_cast<double>(n_->read_failures.load()));
  return out;
}

namespace {

class storing_exchange final : public http_exchange {
 public:
  storing_exchange(std::shared_ptr<http_exchange> inner, std::shared_ptr<responses_state> st,
                   std::function<void(std::string, std::function<void()>)> save)
      : inner_(std::move(inner)), st_(std::move(st)), save_(std::move(save)) {}

  void respond(http_response r) override {
    if (!save_ || r.status != 200 || st_->final_response.empty()) {
      inner_->respond(std::move(r));
      return;
    }
    auto inner = inner_;
    auto resp = std::make_shared<http_response>(std::move(r));
    save_(responses_record(*st_), [inner, resp] { inner->respond(std::move(*resp)); });
  }
  void start_stream(int status, std::vector<std::pair<std::string, std::string>> headers) override {
    inner_->start_stream(status, std::move(headers));
  }
  void send_event(std::string data, std::chrono::steady_clock::time_point t_received) override {
    if (data.empty()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (holding()) {
        held_.push_back(std::move(data));
        return;
      }
    }
    inner_->send_event(std::move(data), t_received);
  }
  void send_events(std::vector<std::string> data) override {
    std::vector<std::string> out;
    for (auto& d : data)
      if (!d.empty()) out.push_back(std::move(d));
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (holding()) {
        for (auto& d : out) held_.push_back(std::move(d));
        return;
      }
    }
    inner_->send_events(std::move(out));
  }
  void end_stream() override {
    std::vector<std::string> held;
    bool save = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      save = holding();
      held.swap(held_);
    }
    if (!save) {
      inner_->end_stream();
      return;
    }
    auto inner = inner_;
    auto events = std::make_shared<std::vector<std::string>>(std::move(held));
    save_(responses_record(*st_), [inner, events] {
      inner->send_events(std::move(*events));
      inner->end_stream();
    });
  }
  void on_disconnect(std::function<void()> f) override { inner_->on_disconnect(std::move(f)); }
  bool disconnected() const override { return inner_->disconnected(); }

 private:
  // The finished response is formatted (its last events are being sent): they wait for the store.
  bool holding() const { return save_ && !st_->final_response.empty(); }

  std::shared_ptr<http_exchange> inner_;
  std::shared_ptr<responses_state> st_;
  std::function<void(std::string, std::function<void()>)> save_;
  std::mutex mu_;
  std::vector<std::string> held_;
};

}  // namespace

std::shared_ptr<http_exchange> responses_exchange(
    std::shared_ptr<http_exchange> inner, std::shared_ptr<responses_state> st,
    std::function<void(std::string record, std::function<void()> then)> save) {
  return std::make_shared<storing_exchange>(std::move(inner), std::move(st), std::move(save));
}

}  // namespace sy::router
