// A fixed pool of compute threads for data-parallel kernels.
//
// `run(fn)` calls fn(thread_index, n_threads) on every thread (the caller is thread 0) and
// returns when all have finished; an exception thrown by fn on any thread is rethrown by run()
// on the caller after every thread has finished. Workers spin briefly between jobs (a decode
// step issues hundreds of small jobs back to back), then yield, then sleep on a condition
// variable, so an idle worker process costs no CPU. Only one thread may call run() at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace sy::cpu {

class thread_pool {
 public:
  explicit thread_pool(int n_threads = 0);  // 0: one per available core
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }

  // No allocation per call: the callable is passed by reference through a trampoline.
  template <class F>
  void run(F&& fn) {
    using fn_t = std::remove_reference_t<F>;
    run_job(const_cast<void*>(static_cast<const void*>(&fn)),
            [](void* ctx, int ith, int nth) { (*static_cast<fn_t*>(ctx))(ith, nth); });
  }

  // Splits [0, n) into contiguous ranges of whole `grain`s, one per thread.
  static void split(int64_t n, int64_t grain, int ith, int nth, int64_t& begin, int64_t& end);

  // fn(begin, end) over [0, n) in chunks taken by whichever thread is free: each take is a share
  // of what is left (guided scheduling: large chunks first, `min_chunk` at the end), in whole
  // `grain`s. A thread slowed by another process on its core then does less of the work instead
  // of holding up the whole job (docs/cpu-backend.md, Threads). Which thread runs a chunk must not
  // change its results.
  template <class F>
  void for_chunks(int64_t n, int64_t grain, int64_t min_chunk, F&& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1) return fn(int64_t{0}, n);
    std::atomic<int64_t> next{0};
    run([&](int, int nth) {
      for (;;) {
        int64_t b = next.load(std::memory_order_relaxed), e;
        do {
          if (b >= n) return;
          int64_t take = std::max(min_chunk, (n - b) / (2 * nth));
          take = (take + grain - 1) / grain * grain;
          e = n - b < take ? n : b + take;
        } while (!next.compare_exchange_weak(b, e, std::memory_order_relaxed));
        fn(b, e);
      }
    });
  }

  // fn(i) for every i in [0, n): on the caller alone below `min_parallel` items (a job costs a
  // few microseconds), else in contiguous ranges, one per thread. Each item's work is the same
  // either way.
  template <class F>
  void for_each(int64_t n, int64_t min_parallel, F&& fn) {
    if (n < min_parallel || n_threads_ == 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    run([&](int ith, int nth) {
      int64_t i0, i1;
      split(n, 1, ith, nth, i0, i1);
      for (int64_t i = i0; i < i1; ++i) fn(i);
    });
  }

 private:
  using trampoline = void (*)(void*, int, int);
  void run_job(void* ctx, trampoline call);
  void worker_loop(int ith);
  void call_guarded(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  // The current job; written by the caller before the generation bump, read by workers after.
  void* job_ctx_ = nullptr;
  trampoline job_call_ = nullptr;
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped once per job
  alignas(64) std::atomic<int> pending_{0};          // workers still running the current job
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards the sleep/wake handshake and first_error_
  std::condition_variable cv_;
  std::exception_ptr first_error_;
};

}  // namespace sy::cpu
