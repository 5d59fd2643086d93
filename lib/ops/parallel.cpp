// Sleeping thread pool behind ops::parallel_for: a generation counter wakes the workers,
// caller and workers claim chunks of a fixed partition, the last chunk wakes the caller.
#include "ops/parallel.h"

#include "core/check.h"
#include "core/env.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::ops {

namespace {

// DTRAIN_NUM_THREADS is declared in config's schema_env_knobs (1 to 1024), which refuses a
// bad value when the rank loads its config; this layer sits below config, so it only falls
// back here.
int threads_from_env() {
  for (const char* name : {"DTRAIN_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = env_get(name)) {
      char* end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (end != v && n >= 1) return static_cast<int>(std::min(n, 1024L));
    }
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

thread_local bool t_in_pool = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One parallel_for call: a fixed partition of [0, n) into `chunks` pieces that the
// caller and the workers claim dynamically, so a worker the OS has descheduled (a loaded
// machine) does not hold everyone up; a worker that wakes after all chunks are claimed
// does nothing. The partition, not the thread that runs a chunk, determines the result.
struct Job {
  const std::function<void(size_t, size_t)>* fn = nullptr;
  size_t n = 0, chunks = 0;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};  // written under Pool::mu_; read without it while spinning
  std::exception_ptr error;
};

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(size_t n, const std::function<void(size_t, size_t)>& fn, int chunks_per_thread) {
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    job->chunks = std::min(n, static_cast<size_t>(size()) * static_cast<size_t>(std::max(1, chunks_per_thread)));
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = job;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    work(*job);
    spin_until([&] { return job->done.load(std::memory_order_acquire) == job->chunks; });
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return job->done == job->chunks; });
    job_.reset();
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  void work(Job& job) {
    const bool outer = t_in_pool;
    t_in_pool = true;
    for (;;) {
      const size_t i = job.next.fetch_add(1);
      if (i >= job.chunks) break;
      std::exception_ptr err;
      try {
        const size_t begin = job.n * i / job.chunks, end = job.n * (i + 1) / job.chunks;
        if (begin < end) (*job.fn)(begin, end);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !job.error) job.error = err;
      if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) done_.notify_all();
    }
    t_in_pool = outer;
  }

  void worker() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (!stop_ && generation_ == seen) {
        lk.unlock();
        spin_until([&] { return published_.load(std::memory_order_acquire) != seen; });
        lk.lock();
      }
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      std::shared_ptr<Job> job = job_;
      if (!job) continue;
      lk.unlock();
      work(*job);
      lk.lock();
    }
  }

  // Before blocking, a thread polls for up to $DTRAIN_POOL_SPIN_US (default 200 us, 0 =
  // never): the step's parallel loops come back to back, tens of microseconds apart, and
  // a futex wake-up puts about that much on the critical path each time, in both
  // directions (the caller waking a worker, the last chunk waking the caller). Bounded,
  // so an idle pool sleeps (bench_cpu_step, 2 threads: 200 us took 3-5% off the step).
  // Declared (0 to 100000) in config's schema_env_knobs, which refuses a bad value.
  template <class Pred>
  static void spin_until(Pred&& ready) {
    static const int64_t spin_ns = [] {
      const char* v = env_get("DTRAIN_POOL_SPIN_US");
      char* end = nullptr;
      const long long us = v ? std::strtoll(v, &end, 10) : 200;
      return (v && (end == v || us < 0)) ? int64_t{200000} : static_cast<int64_t>(std::min(us, 100000LL)) * 1000;
    }();
    if (spin_ns <= 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      if (ready()) return;
      cpu_relax();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(spin_ns)) return;
    }
  }

  std::atomic<uint64_t> published_{0};  // generation_, readable without the mutex
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// One pool per process; run_mu_ serialises its users (a second thread that finds it
// busy runs its loop serially instead of waiting).
std::mutex g_run_mu;
std::unique_ptr<Pool> g_pool;
int g_threads = 0;

}  // namespace

int num_threads() {
  std::lock_guard<std::mutex> lk(g_run_mu);
  if (g_threads == 0) g_threads = threads_from_env();
  return g_threads;
}

void set_num_threads(int n) {
  DT_ENFORCE_GE(n, 1, UsageError, "ops thread count");
  std::lock_guard<std::mutex> lk(g_run_mu);
  g_threads = n;
  g_pool.reset();
}

void parallel_for(size_t n, size_t work, const std::function<void(size_t, size_t)>& fn, int chunks_per_thread) {
  if (n == 0) return;
  if (n == 1 || work < PARALLEL_MIN_WORK || t_in_pool) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lk(g_run_mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    fn(0, n);
    return;
  }
  if (g_threads == 0) g_threads = threads_from_env();
  if (g_threads == 1) {
    lk.unlock();
    fn(0, n);
    return;
  }
  if (!g_pool || g_pool->size() != g_threads) g_pool = std::make_unique<Pool>(g_threads);
  g_pool->run(n, fn, chunks_per_thread);
}

}  // namespace dtrain::ops
