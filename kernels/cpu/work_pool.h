// A parallel loop whose caller never waits for a thread that has not started: the decode
// kernels' replacement for at::parallel_for.
//
//     parallel_chunks(count, fn)   fn(i) for every i in [0, count), each exactly once, on the
//                                  calling thread and up to at::get_num_threads() - 1 helpers
//     WorkPool::instance().warm(ranges)
//                                  the first helper prefetches these bytes until the next job
//
// The chunks are cut into one contiguous part per participant (the caller and the helpers
// the call may use); each claims its own part's chunks front to back, then takes what is left
// of the others' parts from their backs, and the call returns once every chunk is done. Parts,
// not chunks dealt round robin: a thread streaming its own stretch of a weight keeps its
// prefetches (the hardware's and the kernels' next-rows pulls) useful, where interleaved
// chunks start every chunk cold (q8_0 [3072, 576] matvecs from memory, 2 threads: 14 GB/s
// dealt round robin, below one thread's 16; 22 GB/s in parts).
//
// With OpenMP (at::parallel_for) each region ends in a barrier that waits for every thread of
// the team: a helper that is slow to wake (asleep between decode steps, or its core busy with
// another process) holds the whole step, and a batch-1 decode step runs ~130 such regions.
// Here the others take a late helper's part, and a helper that finds every part empty goes
// back to waiting; the result never depends on which thread ran a chunk.
//
// Between a decode step's matmuls the caller works alone (attention, norms, the sampler) and
// memory sits idle; `warm` puts the idle helper to pulling the next matmul's weights into its
// caches meanwhile, so that the matmul reads part of them from L2/L3 (batch-1 decode of the
// default model: 1.14x, median of 8 alternations in one process).
//
// Helpers spin for kSpinMicros after a job (the next projection follows within microseconds),
// then sleep on a condition variable. One job runs at a time: a call made while another is
// running, or from inside a chunk, runs its chunks on the calling thread alone.
#pragma once

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace radixflow_cpu {

class WorkPool {
 public:
  using Chunk = std::function<void(int64_t)>;
  using Range = std::pair<const void*, size_t>;

  static WorkPool& instance() {
    static WorkPool* pool = new WorkPool();  // never destroyed: helpers are detached
    return *pool;
  }

  void run(int64_t count, const Chunk& fn) {
    const int helpers =
        std::min<int64_t>({at::get_num_threads(), count, int64_t{kMaxParticipants}}) - 1;
    std::unique_lock<std::mutex> caller(caller_mutex_, std::try_to_lock);
    // (a part's bounds are 32-bit halves of one word)
    if (helpers <= 0 || in_chunk_ || !caller.owns_lock() || count >> 32 != 0)
      return run_alone(count, fn);
    grow(helpers);
    Job job(&fn, count, helpers + 1);
    current_.store(&job);  // the job is whole before any helper can see it
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      epoch_.fetch_add(1);
    }
    if (sleeping_.load() > 0) wake_.notify_all();
    in_chunk_ = true;
    claim(job, 0);
    in_chunk_ = false;
    while (job.done.load() < count) pause();
    // No helper may touch `job` once this returns: a helper counts itself in busy_ before it
    // reads current_, so after the store below only those already counted can hold it.
    current_.store(nullptr);
    while (busy_.load() != 0) pause();
  }

  // Pulls `ranges` (pointer, bytes) towards the caches on the first helper while the caller
  // works alone (a decode step's attention, norms and hand-offs between its matmuls, when
  // memory would otherwise sit idle), in order, until the next job starts. Only prefetch
  // instructions touch them (a range freed meanwhile cannot fault).
  void warm(const std::vector<Range>& ranges) {
    if (at::get_num_threads() < 2 || in_chunk_ || threads_.load() == 0) return;
    int n = 0;
    for (const Range& r : ranges) {
      if (n == kMaxWarmRanges) break;
      warm_begin_[n].store(reinterpret_cast<uintptr_t>(r.first), std::memory_order_relaxed);
      warm_end_[n].store(reinterpret_cast<uintptr_t>(r.first) + r.second,
                         std::memory_order_relaxed);
      ++n;
    }
    warm_count_.store(n);
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      epoch_.fetch_add(1);
    }
    if (sleeping_.load() > 0) wake_.notify_all();
  }

 private:
  static constexpr int64_t kSpinMicros = 100;
  static constexpr int kMaxParticipants = 64;
  static constexpr int kMaxWarmRanges = 8;
  static constexpr uintptr_t kLine = 64, kPage = 4096;

  // One call's chunks; its counters are its own, so a late helper can only claim chunks of
  // the job it read. Part p holds chunks [p count / P, (p + 1) count / P); its unclaimed ones
  // are [front, back), both in one word (front in the low half) so that a claim from either
  // end is one compare-and-swap.
  struct Job {
    const Chunk* fn;
    int64_t count;
    int participants;
    std::atomic<int64_t> done{0};
    std::atomic<uint64_t> parts[kMaxParticipants];

    Job(const Chunk* fn_, int64_t count_, int participants_)
        : fn(fn_), count(count_), participants(participants_) {
      for (int p = 0; p < participants; ++p)
        parts[p].store(pack(p * count / participants, (p + 1) * count / participants));
    }
  };

  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
  }

  // A chunk of part p from its front (own) or back (stolen); -1 when the part is empty.
  static int64_t take(Job& job, int p, bool from_back) {
    uint64_t range = job.parts[p].load();
    for (;;) {
      const int64_t front = static_cast<int64_t>(range & 0xFFFFFFFFu);
      const int64_t back = static_cast<int64_t>(range >> 32);
      if (front >= back) return -1;
      const uint64_t rest = from_back ? pack(front, back - 1) : pack(front + 1, back);
      if (job.parts[p].compare_exchange_weak(range, rest)) return from_back ? back - 1 : front;
    }
  }

  static void pause() {
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  static void run_alone(int64_t count, const Chunk& fn) {
    for (int64_t i = 0; i < count; ++i) fn(i);
  }

  // Participant `self`'s part, then the others' leftovers.
  static void claim(Job& job, int self) {
    for (int k = 0; k < job.participants; ++k) {
      const int p = (self + k) % job.participants;
      for (int64_t i = take(job, p, k > 0); i >= 0; i = take(job, p, k > 0)) {
        (*job.fn)(i);
        job.done.fetch_add(1);
      }
    }
  }

  void grow(int helpers) {
    while (static_cast<int>(threads_) < helpers) {
      const int index = static_cast<int>(threads_++);
      std::thread([this, index] { helper(index); }).detach();
    }
  }

  // Waits for an epoch after `seen`; false when none came within the spin (then it sleeps).
  bool spin_for_job(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int i = 0;; ++i) {
      if (epoch_.load() != seen) return true;
      pause();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() > until) return false;
    }
  }

  void helper(int index) {
    in_chunk_ = true;  // a kernel called from a chunk runs alone
    uint64_t seen = epoch_.load();
    for (;;) {
      if (!spin_for_job(seen)) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return epoch_.load() != seen; });
        sleeping_.fetch_sub(1);
      }
      seen = epoch_.load();
      busy_.fetch_add(1);
      Job* job = current_.load();
      if (job != nullptr && index + 1 < job->participants) claim(*job, index + 1);
      busy_.fetch_sub(1);
      if (job == nullptr && index == 0) warm_until_next(seen);
    }
  }

  // The ranges of the last warm(), a page at a time, until another epoch begins.
  void warm_until_next(uint64_t seen) {
    const int n = warm_count_.exchange(0);
    for (int i = 0; i < n; ++i) {
      const uintptr_t end = warm_end_[i].load(std::memory_order_relaxed);
      for (uintptr_t p = warm_begin_[i].load(std::memory_order_relaxed); p < end;) {
        if (epoch_.load(std::memory_order_relaxed) != seen) return;
        for (const uintptr_t page_end = std::min(end, p + kPage); p < page_end; p += kLine)
          prefetch_l2(reinterpret_cast<const void*>(p));
      }
    }
  }

  std::mutex caller_mutex_;  // one job at a time
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> epoch_{0};  // moves once per job: wakes the helpers
  std::atomic<Job*> current_{nullptr};
  std::atomic<int> sleeping_{0}, busy_{0};
  std::atomic<size_t> threads_{0};
  // the last warm() (atomic so that a helper reading while it is rewritten is no data race)
  std::atomic<uintptr_t> warm_begin_[kMaxWarmRanges], warm_end_[kMaxWarmRanges];
  std::atomic<int> warm_count_{0};
  static inline thread_local bool in_chunk_ = false;
};

// fn(i) for i in [0, count) on the pool (see above).
inline void parallel_chunks(int64_t count, const WorkPool::Chunk& fn) {
  WorkPool::instance().run(count, fn);
}

}  // namespace radixflow_cpu
