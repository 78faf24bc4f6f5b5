// memplan-cpu-adam-bench: CPU AdamW throughput (parameters updated per second) for 1, 2, 4, ...
// threads, with the ChunkManager's task size and torch's sqrt kernel (the bit-exact
// configuration), and with std::sqrt for comparison; then the 8-bit AdamW kernel (adamw8bit, bf16
// parameters and grads, the chunk manager's offloaded pass) with torch's sqrt, and its time
// relative to fp32 AdamW's (common/optimizer_bytes.h's kAdamW8bitCpuTimeFactor).
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
  std::vector<uint16_t> param16(n, 0x3f00), grad16(n, 0x3c24);  // bf16 0.5, 0.01
  std::vector<uint8_t> m8(n, 0), v8(n, 0);
  std::vector<float> m_absmax(n / 128 + 2, 0.0f), v_absmax(n / 128 + 2, 0.0f);
  std::vector<uint16_t> out16(n, 0);
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    memplan::ThreadPool pool(threads);
    // The baseline: the chunk manager's adamw pass for a bf16 model (what memplan-agent bench
    // measures as cpu_adamw): bf16 grads widened, AdamW on the fp32 master, rounded to bf16.
    double adamw_seconds = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const memplan::AdamWStepScalars s = memplan::MakeAdamWStepScalars(options, rep + 1);
      memplan::TaskTracker tracker;
      const auto start = std::chrono::steady_clock::now();
      for (int64_t begin = 0; begin < n; begin += kRange) {
        const int64_t len = std::min(kRange, n - begin);
        tracker.Add();
        pool.Schedule([&, begin, len] {
          memplan::AccumulateGradBf16(true, len, grad16.data() + begin, grad.data() + begin);
          memplan::AdamWUpdate(s, 1.0f, len, param.data() + begin, grad.data() + begin,
                               exp_avg.data() + begin, exp_avg_sq.data() + begin,
                               &memplan::TorchSqrt);
          memplan::RoundToBf16(len, param.data() + begin, out16.data() + begin);
          tracker.Done();
        });
      }
      tracker.Wait();
      adamw_seconds = std::min(
          adamw_seconds,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    double best_seconds = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const memplan::AdamWStepScalars s = memplan::MakeAdamWStepScalars(options, rep + 1);
      memplan::TaskTracker tracker;
      const auto start = std::chrono::steady_clock::now();
      for (int64_t begin = 0; begin < n; begin += kRange) {
        const int64_t len = std::min(kRange, n - begin);
        tracker.Add();
        pool.Schedule([&, begin, len] {
          memplan::QuantBlocks blocks;  // bf16: two absmax slots per 256-element block
          blocks.first_slot_gap = 2;
          blocks.slot_stride = 2;
          memplan::AdamW8bitUpdateBf16(s, 1.0f, len, blocks, param16.data() + begin,
                                       grad16.data() + begin, m8.data() + begin,
                                       v8.data() + begin, m_absmax.data() + begin / 128,
                                       v_absmax.data() + begin / 128, &memplan::TorchSqrt,
                                       memplan::ParamRounding{
                                           true, memplan::StochasticRoundingKey(0, 0, rep + 1),
                                           begin});
          tracker.Done();
        });
      }
      tracker.Wait();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best_seconds = std::min(best_seconds, seconds);
    }
    std::printf(
        "bf16 threads=%d adamw_seconds=%.4f adamw8bit_seconds=%.4f adamw8bit_params_per_second="
        "%.3e time_vs_adamw=%.2f\n",
        threads, adamw_seconds, best_seconds, static_cast<double>(n) / best_seconds,
        best_seconds / adamw_seconds);
  }
  return 0;
}
