#include "kernels/cpu/thread_pool.hpp"

#include <immintrin.h>

#include <chrono>

namespace sy::cpu {

thread_pool::thread_pool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::split(int64_t n, int64_t grain, int ith, int nth, int64_t& begin, int64_t& end) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / nth, extra = units % nth;
  const int64_t u0 = ith * per + (ith < extra ? ith : extra);
  const int64_t u1 = u0 + per + (ith < extra ? 1 : 0);
  begin = u0 * grain < n ? u0 * grain : n;
  end = u1 * grain < n ? u1 * grain : n;
}

void thread_pool::call_guarded(int ith) {
  try {
    job_call_(job_ctx_, ith, n_threads_);
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!first_error_) first_error_ = std::current_exception();
  }
}

void thread_pool::run_job(void* ctx, trampoline call) {
  job_ctx_ = ctx;
  job_call_ = call;
  first_error_ = nullptr;
  if (n_threads_ > 1) {
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1);  // seq_cst: pairs with the sleeper count (Dekker-style)
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
  }
  call_guarded(0);
  // Spin briefly, then yield: on a loaded machine the worker we wait for may need our core.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 256)
      _mm_pause();
    else
      std::this_thread::yield();
  }
  if (first_error_) std::rethrow_exception(first_error_);
}

void thread_pool::worker_loop(int ith) {
  uint64_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(2000);
    uint64_t g;
    int spins = 0;
    while ((g = generation_.load()) == seen) {
      if (++spins < 256) {
        _mm_pause();
        continue;
      }
      std::this_thread::yield();
      if (spins % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lk, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
      }
    }
    seen = g;
    if (stop_.load()) return;
    call_guarded(ith);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace sy::cpu
