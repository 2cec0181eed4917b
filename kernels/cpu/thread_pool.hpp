// A fixed pool of compute threads for data-parallel kernels.
//
// `run(fn)` calls fn(thread_index, n_threads) on every thread (the caller is thread 0) and
// returns when all have finished. Workers spin briefly between jobs (steps issue hundreds of
// small jobs back to back) and then sleep on a condition variable, so an idle worker process
// costs no CPU. Only one thread may call run() at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sy::cpu {

class thread_pool {
 public:
  explicit thread_pool(int n_threads = 0);  // 0: one per available core
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }
  void run(const std::function<void(int ith, int nth)>& fn);

  // Splits [0, n) into contiguous ranges of whole `grain`s, one per thread.
  static void split(int64_t n, int64_t grain, int ith, int nth, int64_t& begin, int64_t& end);

 private:
  void worker_loop(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // bumped once per job
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace sy::cpu
