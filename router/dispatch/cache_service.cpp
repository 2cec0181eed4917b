#include "router/dispatch/cache_service.hpp"

namespace sy::router {

cache_service::cache_service(cache_service_config cfg) : cfg_(std::move(cfg)) {
  if (cfg_.lookup_max_wait.count() <= 0) cfg_.lookup_max_wait = 4 * cfg_.redis.command_timeout;
  const int n = std::max(1, cfg_.threads);
  for (int i = 0; i < n; ++i)
    conns_.push_back(std::make_unique<cache::response_cache>(cfg_.redis, cfg_.policy, cfg_.analytics));
  auto with_timeout = [&](std::chrono::milliseconds command, std::chrono::milliseconds connect) {
    cache::redis_config c = cfg_.redis;
    c.command_timeout = command;
    c.connect_timeout = std::max(c.connect_timeout, connect);
    return std::make_unique<cache::response_cache>(c, cfg_.policy, cfg_.analytics);
  };
  conns_.push_back(with_timeout(std::max(cfg_.store_timeout, cfg_.redis.command_timeout), cfg_.redis.connect_timeout));
  conns_.push_back(with_timeout(cfg_.query_timeout, std::chrono::milliseconds(500)));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { run(work_, *conns_[static_cast<size_t>(i)]); });
  threads_.emplace_back([this, n] { run(writes_, *conns_[static_cast<size_t>(n)]); });
  threads_.emplace_back([this] { run(queries_, *conns_.back()); });
}

cache_service::~cache_service() {
  stop_.store(true);
  for (lane* l : {&work_, &writes_, &queries_}) {
    std::lock_guard<std::mutex> lk(l->mu);
    l->cv.notify_all();
  }
  for (auto& t : threads_) t.join();
}

bool cache_service::push(lane& l, job j, size_t cap, bool urgent) {
  {
    std::lock_guard<std::mutex> lk(l.mu);
    std::deque<job>& q = urgent ? l.urgent : l.jobs;
    if (q.size() >= cap) return false;
    q.push_back(std::move(j));
  }
  l.cv.notify_one();
  return true;
}

void cache_service::run(lane& l, cache::response_cache& rc) {
  for (;;) {
    job j;
    {
      std::unique_lock<std::mutex> lk(l.mu);
      l.cv.wait(lk, [&] { return stop_.load() || !l.urgent.empty() || !l.jobs.empty(); });
      std::deque<job>& q = !l.urgent.empty() ? l.urgent : l.jobs;
      if (q.empty()) return;  // stopping
      j = std::move(q.front());
      q.pop_front();
    }
    try {
      j(rc);
    } catch (const std::exception&) {
      // A callback that throws must not take the cache thread down; the request it served has
      // already been answered or submitted by then.
    }
  }
}

bool cache_service::lookup(std::string key, lookup_done done) {
  const bool ok = push(
      work_,
      [this, key = std::move(key), done = std::move(done),
       queued = std::chrono::steady_clock::now()](cache::response_cache& rc) {
        const auto t0 = std::chrono::steady_clock::now();
        if (t0 - queued > cfg_.lookup_max_wait) {  // its request has waited enough: served live
          by_status_[static_cast<size_t>(cache::lookup_status::expired)]++;
          done(std::nullopt, cache::lookup_status::expired);
          return;
        }
        cache::lookup_status st = cache::lookup_status::miss;
        std::optional<cache::stored_response> r;
        try {
          r = rc.lookup(key, &st);
        } catch (const std::exception&) {
          // Counted as an error and served uncached: `done` must run, or the request it carries
          // would never be submitted nor answered.
          r.reset();
          st = cache::lookup_status::error;
        }
        {
          std::lock_guard<std::mutex> lk(hist_mu_);
          lookup_s_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        by_status_[static_cast<size_t>(st)]++;
        done(std::move(r), st);
      },
      cfg_.max_queue, /*urgent=*/true);
  if (!ok) queue_full_++;
  return ok;
}

void cache_service::store(std::string key, cache::stored_response r) {
  const bool queued = push(
      writes_,
      [this, key = std::move(key), r = std::move(r)](cache::response_cache& rc) {
        bool ok = false;
        try {
          ok = rc.store(key, r);
        } catch (const std::exception&) {
          ok = false;  // counted below, like a Redis error
        }
        (ok ? stores_ : store_failures_)++;
      },
      cfg_.max_queue);
  if (!queued) store_failures_++;  // the writes queue is full: not stored, counted
}

bool cache_service::submit(std::function<void(cache::redis_client&)> j, bool urgent) {
  const bool ok = push(
      work_, [j = std::move(j)](cache::response_cache& rc) { j(rc.client()); }, cfg_.max_queue, urgent);
  if (!ok) queue_full_++;
  return ok;
}

void cache_service::record(cache_event e) {
  if (!cfg_.analytics.enabled) return;
  const bool ok = push(
      writes_,
      [this, e = std::move(e)](cache::response_cache& rc) {
        rc.record(e.kind, e.tenant, e.model, e.tokens_saved, e.device_s_saved, e.entry_age_s, e.prompt_hash,
                  e.preview ? &*e.preview : nullptr);
        events_++;
      },
      cfg_.max_queue);
  if (!ok) events_dropped_++;
}

void cache_service::query(int64_t from_unix_s, int64_t to_unix_s, size_t top_k,
                          std::function<void(cache::cache_stats)> done) {
  const bool ok = push(
      queries_,
      [from_unix_s, to_unix_s, top_k, done](cache::response_cache& rc) {
        done(rc.query(from_unix_s, to_unix_s, top_k));
      },
      64);
  if (!ok) {
    cache::cache_stats s;
    s.from_unix_s = from_unix_s;
    s.to_unix_s = to_unix_s;
    s.complete = false;
    s.error = "too many stats queries in progress";
    done(std::move(s));
  }
}

std::string cache_service::render_metrics() const {
  std::string out;
  metric_family lookups(out, "switchyard_router_cache_lookups_total", "counter", "Response-cache lookups, by outcome.");
  for (size_t i = 0; i < cache::k_n_lookup_statuses; ++i)
    lookups.sample({{"status", cache::name(static_cast<cache::lookup_status>(i))}}, by_status_[i].load());
  metric(out, "switchyard_router_cache_queue_full_total", "counter",
         "Lookups not attempted because the cache threads were backed up (served uncached).",
         static_cast<double>(queue_full_.load()));
  metric(out, "switchyard_router_cache_stores_total", "counter", "Responses stored in the cache.",
         static_cast<double>(stores_.load()));
  metric(out, "switchyard_router_cache_store_failures_total", "counter",
         "Stores refused (too large), failed (Redis error) or dropped (writes queue full).",
         static_cast<double>(store_failures_.load()));
  metric(out, "switchyard_router_cache_events_total", "counter", "Analytics events written to Redis.",
         static_cast<double>(events_.load()));
  metric(out, "switchyard_router_cache_events_dropped_total", "counter", "Analytics events dropped (queue full).",
         static_cast<double>(events_dropped_.load()));
  std::lock_guard<std::mutex> lk(hist_mu_);
  lookup_s_.render(out, "switchyard_router_cache_lookup_seconds", "Response-cache lookup latency (Redis GET).");
  return out;
}

}  // namespace sy::router
