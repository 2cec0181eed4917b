#include "router/http/work_pool.hpp"

#include <stdexcept>

namespace sy::router {

work_pool::work_pool(work_pool_config cfg) : cfg_(cfg) {
  if (cfg_.threads < 1) throw std::invalid_argument("work_pool: at least one thread");
  threads_.reserve(static_cast<size_t>(cfg_.threads));
  for (int i = 0; i < cfg_.threads; ++i) threads_.emplace_back([this] { run(); });
}

work_pool::~work_pool() { stop(); }

bool work_pool::try_post(size_t bytes, std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    const bool idle = queue_.empty() && running_ == 0;
    const bool fits = queue_.size() < cfg_.max_waiting && (bytes_ + bytes <= cfg_.max_bytes || idle);
    if (!stopping_ && fits) {
      bytes_ += bytes;
      queue_.push_back({bytes, std::move(job)});
      cv_.notify_one();
      return true;
    }
  }
  refused_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void work_pool::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    job_t j = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    try {
      j.f();
    } catch (...) {
      failed_.fetch_add(1, std::memory_order_relaxed);
    }
    j.f = nullptr;  // what the job captured goes before its bytes are released
    lock.lock();
    --running_;
    bytes_ -= j.bytes;
  }
}

void work_pool::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

size_t work_pool::waiting() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

size_t work_pool::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

}  // namespace sy::router
