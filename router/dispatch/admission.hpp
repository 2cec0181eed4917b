// Admission control (docs/architecture.md, "The path of a request"; docs/engineering.md, "Shed
// at named points"): monitors (per-tenant buckets and concurrency, the cluster queue's load, the
// request's deadline) feed named shed points, each with a counter. An admitted request holds an
// admission_permit for as long as it is in flight (queued or running); dropping the permit
// returns the tenant's concurrency slot.
//
// Rejection is fast and costs nothing: a rejected request charges no bucket and takes no slot.
//
// Time is always passed in (`now_s`, seconds on a steady clock); nothing here reads a clock.
// Not thread-safe: the controller and its permits belong to the router's dispatcher thread —
// except take_rate(), the HTTP edge's charge of the requests/s bucket (and the bucket itself,
// under its own mutex).
//
// The requests/s limit counts requests as they arrive, before their bodies are read (as API
// gateways do), so that it also bounds the work a tenant makes the router do for requests that
// are then refused for their content: validation failures never reach admit().
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "router/dispatch/tenants.hpp"

namespace sy::router {

// The shed points. Each name is a metric label.
enum class reject_reason : uint8_t {
  tenant_rate,           // 429: requests/s token bucket empty
  tenant_tokens,         // 429: tokens/min bucket lacks prompt + max_tokens
  tenant_concurrency,    // 429: max_concurrent requests already in flight
  priority_not_allowed,  // 403: priority outside a strict tenant's [min, max] (others clamp it)
  queue_full,            // 429: cluster queue at its request cap (scaled by the class's shed fraction)
  queue_tokens,          // 429: cluster queue at its token cap (scaled likewise)
  deadline,              // 503: the estimated queue wait already passes the request's deadline
};
inline constexpr size_t k_n_reject_reasons = 7;

std::string_view name(reject_reason r);  // "tenant_rate", "tenant_tokens", ...

struct admission_config {
  size_t max_queued_requests = 4096;    // cluster queue cap (requests waiting for a worker)
  int64_t max_queued_tokens = 4 << 20;  // cluster queue cap in prompt + max_tokens tokens
  // A class may enqueue only while the queue is below this fraction of each cap, so lower
  // priorities are shed first: {interactive, standard, batch}. The check is on the queue as it
  // is, before this request joins it, so the token cap may be overshot by one request.
  std::array<double, k_n_priority_classes> shed_fraction = {1.0, 0.85, 0.6};
};

// The cluster queue's state, filled by the caller from the priority queue and worker throughput.
struct queue_load {
  size_t requests = 0;    // queued requests (all classes)
  int64_t tokens = 0;     // their prompt + max_tokens
  double est_wait_s = 0;  // estimated wait before a new request would be dispatched
};

struct rejection {
  reject_reason reason = reject_reason::queue_full;
  int status = 503;          // 429 tenant_* and queue_*, 403 priority_not_allowed, 503 deadline
  double retry_after_s = 1;  // whole seconds, >= 1: for the Retry-After header
  std::string message;       // names the limit and its value, for the error body
};

namespace detail {
// One tenant's admission state. Owned by admission_controller; permits point at `in_flight`.
struct tenant_admission_state {
  double rate_level = 0;    // requests/s bucket: requests available now (<= capacity)
  double rate_t_s = 0;      // when rate_level was last brought up to date
  double tokens_level = 0;  // tokens/min bucket: tokens available now (<= tokens_per_min)
  double tokens_t_s = 0;
  // Admitted requests whose permit is alive. Changed by the dispatcher thread only; atomic so
  // that the HTTP edge can read it (edge_concurrency).
  std::atomic<int32_t> in_flight{0};
};
}  // namespace detail

// RAII hold on one of a tenant's concurrency slots. Movable, not copyable; a moved-from permit
// holds nothing. It points into its admission_controller, which must outlive it.
class admission_permit {
 public:
  admission_permit() = default;
  admission_permit(admission_permit&& o) noexcept;
  admission_permit& operator=(admission_permit&& o) noexcept;
  admission_permit(const admission_permit&) = delete;
  admission_permit& operator=(const admission_permit&) = delete;
  ~admission_permit() { release(); }

  bool held() const { return state_ != nullptr; }
  size_t tenant_index() const { return tenant_; }
  void release();  // returns the slot now (idempotent)

 private:
  friend class admission_controller;
  admission_permit(detail::tenant_admission_state* s, size_t tenant) : state_(s), tenant_(tenant) {}

  detail::tenant_admission_state* state_ = nullptr;
  size_t tenant_ = 0;
};

class admission_controller {
 public:
  // `tenants` is only read here (to size the per-tenant state); tenants passed to admit() must
  // come from the same registry. Permits point into this controller: it must outlive them, and
  // it cannot be copied or assigned (move construction is fine: per-tenant state is on the heap).
  admission_controller(admission_config cfg, const tenant_registry& tenants);
  admission_controller(const admission_controller&) = delete;
  admission_controller& operator=(const admission_controller&) = delete;
  admission_controller(admission_controller&&) = default;
  admission_controller& operator=(admission_controller&&) = delete;

  // `priority` is the request's priority (the caller substitutes the tenant's default when the
  // request gives none); `tokens` its prompt + max_tokens; `deadline_s` 0 for none.
  // Checks, in order: priority allowed, tenant concurrency, tenant rate, tenant tokens/min, queue
  // caps (scaled by the class's shed fraction), deadline (deadline_s > 0 and now_s +
  // load.est_wait_s > deadline_s). Charges the tenant's buckets and concurrency only when
  // admitted. Counts each rejection by reason, and each admission.
  // `rate_taken`: the request was charged by take_rate() already (the rate check is skipped).
  std::variant<admission_permit, rejection> admit(const tenant& t, int32_t priority, int64_t tokens, double deadline_s,
                                                  double now_s, const queue_load& load, bool rate_taken = false);

  // Thread-safe: takes one request from the tenant's requests/s bucket when it holds one
  // (std::nullopt; the request then goes to admit() with rate_taken), else the tenant_rate
  // rejection (counted). Tenants without a rate limit always pass.
  std::optional<rejection> take_rate(const tenant& t, double now_s);
  // Thread-safe, for the HTTP edge before a body is read: the tenant_concurrency rejection
  // (counted) when the tenant already has its max_concurrent requests in flight. A request it
  // lets through is checked again by admit() (a slot may have been taken meanwhile).
  std::optional<rejection> edge_concurrency(const tenant& t);

  uint64_t rejected(reject_reason r) const;
  uint64_t admitted() const { return admitted_; }
  int32_t in_flight(const tenant& t) const;
  const admission_config& config() const { return cfg_; }

 private:
  rejection reject(reject_reason r, double retry_after_s, std::string message);  // counted
  static rejection make_rejection(reject_reason r, double retry_after_s, std::string message);
  // The rate check on state_[t.index] (caller holds *rate_mu_): the rejection, or nullopt.
  std::optional<rejection> rate_check(const tenant& t, double now_s);

  admission_config cfg_;
  std::vector<detail::tenant_admission_state> state_;  // by tenant index; never resized
  std::array<uint64_t, k_n_reject_reasons> rejected_{};
  uint64_t admitted_ = 0;
  // Guards the requests/s buckets (rate_level, rate_t_s) and edge_rate_rejected_; on the heap
  // so that the controller stays movable.
  std::unique_ptr<std::mutex> rate_mu_ = std::make_unique<std::mutex>();
  uint64_t edge_rate_rejected_ = 0;
  std::unique_ptr<std::atomic<uint64_t>> edge_concurrency_rejected_ = std::make_unique<std::atomic<uint64_t>>(0);
};

}  // namespace sy::router
