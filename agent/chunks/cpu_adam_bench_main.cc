// memplan-cpu-adam-bench: CPU AdamW throughput (parameters updated per second) for 1, 2, 4, ...
// threads, with the ChunkManager's task size and torch's sqrt kernel (the bit-exact
// configuration), and with std::sqrt for comparison.
// Usage: memplan-cpu-adam-bench [num_params (default 64M)] [max_threads (default: hardware)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/thread_pool.h"
#include "agent/chunks/torch_sqrt.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{64} << 20);
  const int max_threads =
      argc > 2 ? std::atoi(argv[2]) : std::max(1u, std::thread::hardware_concurrency());
  if (argc > 3 || n <= 0 || max_threads <= 0) {
    std::fprintf(argc > 1 && std::strcmp(argv[1], "--help") == 0 ? stdout : stderr,
                 "usage: memplan-cpu-adam-bench [num_params > 0 (default 64M)] "
                 "[max_threads > 0 (default: hardware)]\n"
                 "Prints CPU AdamW parameters updated per second for 1, 2, 4, ... threads.\n");
    return argc > 1 && std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  std::vector<float> param(n, 0.5f), grad(n, 0.01f), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  const memplan::AdamWOptions options;
  const int64_t kRange = int64_t{1} << 18;  // the ChunkManager's task size
  std::printf("params=%lld range=%lld\n", static_cast<long long>(n),
              static_cast<long long>(kRange));
  for (const bool torch_sqrt : {true, false}) {
    for (int threads = 1; threads <= max_threads; threads *= 2) {
      memplan::ThreadPool pool(threads);
      double best_seconds = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const memplan::AdamWStepScalars s = memplan::MakeAdamWStepScalars(options, rep + 1);
        memplan::TaskTracker tracker;
        const auto start = std::chrono::steady_clock::now();
        for (int64_t begin = 0; begin < n; begin += kRange) {
          const int64_t len = std::min(kRange, n - begin);
          tracker.Add();
          pool.Schedule([&, begin, len] {
            memplan::AdamWUpdate(s, 1.0f, len, param.data() + begin, grad.data() + begin,
                                 exp_avg.data() + begin, exp_avg_sq.data() + begin,
                                 torch_sqrt ? &memplan::TorchSqrt : nullptr);
            tracker.Done();
          });
        }
        tracker.Wait();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best_seconds = std::min(best_seconds, seconds);
      }
      std::printf("sqrt=%s threads=%d seconds=%.4f params_per_second=%.3e\n",
                  torch_sqrt ? "torch" : "std", threads, best_seconds,
                  static_cast<double>(n) / best_seconds);
    }
  }
  return 0;
}
