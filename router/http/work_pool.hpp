// A bounded pool of threads for the HTTP edge's CPU work: parsing a request body, applying the
// chat template and tokenizing (up to the body limit, megabytes) would otherwise run on an I/O
// thread and hold up every stream that thread writes. The pool has a fixed number of threads
// and a bounded backlog (jobs waiting, and the bytes of the bodies waiting or running); a job
// that does not fit is refused at once so that the caller can shed the request (503 with
// Retry-After) instead of queueing without bound.
//
// Thread-safe. stop() (and the destructor) runs what is queued, then joins: an accepted job
// always runs, so a request it carries always gets its answer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sy::router {

struct work_pool_config {
  int threads = 2;
  size_t max_waiting = 64;              // jobs accepted but not started
  size_t max_bytes = size_t{64} << 20;  // bytes of the jobs waiting or running
};

class work_pool {
 public:
  explicit work_pool(work_pool_config cfg);
  ~work_pool();  // stop()
  work_pool(const work_pool&) = delete;
  work_pool& operator=(const work_pool&) = delete;

  // Queues `job`, which holds `bytes` of input until it has run; false (the job dropped
  // unrun) when the backlog is full or the pool stopped. A job that throws is counted, not
  // propagated. A job larger than max_bytes is accepted only into an idle pool.
  bool try_post(size_t bytes, std::function<void()> job);
  // Runs every accepted job, then joins the threads. Idempotent.
  void stop();

  size_t waiting() const;
  size_t running() const;
  uint64_t refused() const { return refused_.load(); }
  uint64_t failed() const { return failed_.load(); }  // jobs that threw
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  struct job_t {
    size_t bytes;
    std::function<void()> f;
  };
  void run();

  const work_pool_config cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job_t> queue_;  // guarded by mu_
  size_t bytes_ = 0;         // guarded by mu_: waiting + running
  size_t running_ = 0;       // guarded by mu_
  bool stopping_ = false;    // guarded by mu_
  std::atomic<uint64_t> refused_{0}, failed_{0};
  std::vector<std::thread> threads_;
};

}  // namespace sy::router
