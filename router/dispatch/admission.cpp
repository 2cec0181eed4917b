#include "router/dispatch/admission.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace sy::router {

std::string_view name(reject_reason r) {
  switch (r) {
    case reject_reason::tenant_rate:
      return "tenant_rate";
    case reject_reason::tenant_tokens:
      return "tenant_tokens";
    case reject_reason::tenant_concurrency:
      return "tenant_concurrency";
    case reject_reason::priority_not_allowed:
      return "priority_not_allowed";
    case reject_reason::queue_full:
      return "queue_full";
    case reject_reason::queue_tokens:
      return "queue_tokens";
    case reject_reason::deadline:
      return "deadline";
  }
  return "unknown";
}

// --- admission_permit ---

admission_permit::admission_permit(admission_permit&& o) noexcept
    : state_(std::exchange(o.state_, nullptr)), tenant_(o.tenant_) {}

admission_permit& admission_permit::operator=(admission_permit&& o) noexcept {
  if (this != &o) {
    release();
    state_ = std::exchange(o.state_, nullptr);
    tenant_ = o.tenant_;
  }
  return *this;
}

void admission_permit::release() {
  if (state_ == nullptr) return;
  assert(state_->in_flight > 0);
  state_->in_flight--;
  state_ = nullptr;
}

// --- admission_controller ---

namespace {

constexpr double k_inf = std::numeric_limits<double>::infinity();

double rate_capacity(const tenant_limits& l) { return l.burst > 0 ? l.burst : std::max(1.0, l.requests_per_s); }

// Brings a token bucket's level up to now_s: it refills continuously at `per_s` up to `capacity`.
// Time going backwards refills nothing.
void refill(double& level, double& t_s, double now_s, double per_s, double capacity) {
  if (now_s > t_s) {
    level = std::min(capacity, level + (now_s - t_s) * per_s);
    t_s = now_s;
  }
}

// Slack for floating-point drift in bucket levels and products (a bucket refilled in several
// steps to exactly 1 request must admit it).
constexpr double k_eps = 1e-9;

// Whole seconds, at least 1 (Retry-After is an integer).
double retry_seconds(double s) {
  if (!(s < 1e9)) return 1e9;  // also catches NaN
  return std::max(1.0, std::ceil(s - 1e-6));
}

// A class's share of a queue cap, in whole units, rounded up so that every class with a
// non-zero fraction can queue at least one request: the queue admits while below it.
double class_cap(double fraction, double cap) { return std::ceil(fraction * cap - k_eps); }

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

admission_controller::admission_controller(admission_config cfg, const tenant_registry& tenants)
    : cfg_(cfg), state_(tenants.tenants().size()) {
  for (const tenant& t : tenants.tenants()) {
    detail::tenant_admission_state& s = state_[t.index];
    // Buckets start full; -inf makes the first refill a no-op at capacity.
    s.rate_level = rate_capacity(t.limits);
    s.rate_t_s = -k_inf;
    s.tokens_level = static_cast<double>(t.limits.tokens_per_min);
    s.tokens_t_s = -k_inf;
  }
}

rejection admission_controller::reject(reject_reason r, double retry_after_s, std::string message) {
  rejected_[static_cast<size_t>(r)]++;
  return make_rejection(r, retry_after_s, std::move(message));
}

rejection admission_controller::make_rejection(reject_reason r, double retry_after_s, std::string message) {
  // A full queue is a 429, as SGLang's gateway answers it (docs/router.md, "Queue timeout").
  int status = 503;
  switch (r) {
    case reject_reason::tenant_rate:
    case reject_reason::tenant_tokens:
    case reject_reason::tenant_concurrency:
    case reject_reason::queue_full:
    case reject_reason::queue_tokens:
      status = 429;
      break;
    case reject_reason::priority_not_allowed:
      status = 403;
      break;
    case reject_reason::deadline:
      status = 503;
      break;
  }
  return rejection{r, status, retry_seconds(retry_after_s), std::move(message)};
}

std::optional<rejection> admission_controller::rate_check(const tenant& t, double now_s) {
  const tenant_limits& l = t.limits;
  detail::tenant_admission_state& s = state_[t.index];
  refill(s.rate_level, s.rate_t_s, now_s, l.requests_per_s, rate_capacity(l));
  if (s.rate_level >= 1 - k_eps) return std::nullopt;
  return make_rejection(reject_reason::tenant_rate, (1 - s.rate_level) / l.requests_per_s,
                        "tenant '" + t.name + "' is over its limit of " + num(l.requests_per_s) + " requests/s");
}

std::optional<rejection> admission_controller::take_rate(const tenant& t, double now_s) {
  assert(t.index < state_.size());
  if (t.limits.requests_per_s <= 0) return std::nullopt;
  std::lock_guard<std::mutex> lk(*rate_mu_);
  auto no = rate_check(t, now_s);
  if (no) {
    edge_rate_rejected_++;  // not rejected_: that array is the dispatcher thread's
    return no;
  }
  state_[t.index].rate_level -= 1;
  return std::nullopt;
}

std::optional<rejection> admission_controller::edge_concurrency(const tenant& t) {
  assert(t.index < state_.size());
  const int32_t max = t.limits.max_concurrent;
  if (max <= 0 || state_[t.index].in_flight.load(std::memory_order_relaxed) < max) return std::nullopt;
  (*edge_concurrency_rejected_)++;  // not rejected_: that array is the dispatcher thread's
  return make_rejection(reject_reason::tenant_concurrency, 1,
                        "tenant '" + t.name + "' is over its limit of " + std::to_string(max) + " concurrent requests");
}

uint64_t admission_controller::rejected(reject_reason r) const {
  uint64_t n = rejected_[static_cast<size_t>(r)];
  if (r == reject_reason::tenant_concurrency) n += edge_concurrency_rejected_->load();
  if (r == reject_reason::tenant_rate) {
    std::lock_guard<std::mutex> lk(*rate_mu_);
    n += edge_rate_rejected_;
  }
  return n;
}

std::variant<admission_permit, rejection> admission_controller::admit(const tenant& t, int32_t priority, int64_t tokens,
                                                                      double deadline_s, double now_s,
                                                                      const queue_load& load, bool rate_taken) {
  assert(t.index < state_.size());
  assert(tokens >= 0);
  const tenant_limits& l = t.limits;
  detail::tenant_admission_state& s = state_[t.index];
  const std::string who = "tenant '" + t.name + "'";

  if (!l.priority_allowed(priority)) {
    return reject(reject_reason::priority_not_allowed, 1,
                  who + " may not use priority " + std::to_string(priority) +
                      " (allowed: " + std::to_string(l.min_priority) + " to " + std::to_string(l.max_priority) + ")");
  }

  if (l.max_concurrent > 0 && s.in_flight >= l.max_concurrent) {
    return reject(reject_reason::tenant_concurrency, 1,
                  who + " is over its limit of " + std::to_string(l.max_concurrent) + " concurrent requests");
  }

  const bool rate_here = l.requests_per_s > 0 && !rate_taken;
  std::unique_lock<std::mutex> rate_lock(*rate_mu_, std::defer_lock);
  if (rate_here) {
    rate_lock.lock();  // held to the charge below: the edge charges the same bucket
    if (auto no = rate_check(t, now_s)) {
      rejected_[static_cast<size_t>(reject_reason::tenant_rate)]++;
      return std::move(*no);
    }
  }

  if (l.tokens_per_min > 0) {
    const double capacity = static_cast<double>(l.tokens_per_min);
    const double per_s = capacity / 60;
    refill(s.tokens_level, s.tokens_t_s, now_s, per_s, capacity);
    const double need = static_cast<double>(tokens);
    if (need > capacity) {
      // Can never fit; a minute is as good an answer as any, and the message says why.
      return reject(reject_reason::tenant_tokens, 60,
                    "request of " + std::to_string(tokens) + " tokens exceeds " + who + "'s limit of " +
                        std::to_string(l.tokens_per_min) + " tokens/min");
    }
    if (s.tokens_level < need - k_eps) {
      return reject(reject_reason::tenant_tokens, (need - s.tokens_level) / per_s,
                    who + " is over its limit of " + std::to_string(l.tokens_per_min) + " tokens/min");
    }
  }

  const priority_class cls = class_of(priority);
  const double fraction = cfg_.shed_fraction[static_cast<size_t>(cls)];
  const double wait = std::max(0.0, load.est_wait_s);
  const double requests_cap = class_cap(fraction, static_cast<double>(cfg_.max_queued_requests));
  if (static_cast<double>(load.requests) >= requests_cap) {
    return reject(reject_reason::queue_full, wait,
                  "the cluster queue is full for " + std::string(name(cls)) +
                      " requests: " + std::to_string(load.requests) + " queued, limit " +
                      std::to_string(static_cast<int64_t>(requests_cap)) + " (" + num(fraction * 100) + "% of " +
                      std::to_string(cfg_.max_queued_requests) + ")");
  }
  const double tokens_cap = class_cap(fraction, static_cast<double>(cfg_.max_queued_tokens));
  if (static_cast<double>(load.tokens) >= tokens_cap) {
    return reject(reject_reason::queue_tokens, wait,
                  "the cluster queue is full for " + std::string(name(cls)) +
                      " requests: " + std::to_string(load.tokens) + " tokens queued, limit " +
                      std::to_string(static_cast<int64_t>(tokens_cap)) + " (" + num(fraction * 100) + "% of " +
                      std::to_string(cfg_.max_queued_tokens) + ")");
  }

  if (deadline_s > 0 && now_s + wait > deadline_s) {
    return reject(reject_reason::deadline, wait,
                  "the request's deadline cannot be met: estimated queue wait " + num(wait) + " s, " +
                      num(std::max(0.0, deadline_s - now_s)) + " s left");
  }

  // Admitted: charge the buckets and take a slot.
  if (rate_here) s.rate_level -= 1;
  if (l.tokens_per_min > 0) s.tokens_level -= static_cast<double>(tokens);
  s.in_flight++;
  admitted_++;
  return admission_permit(&s, t.index);
}

int32_t admission_controller::in_flight(const tenant& t) const {
  assert(t.index < state_.size());
  return state_[t.index].in_flight.load();
}

}  // namespace sy::router
