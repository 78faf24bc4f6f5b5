// memplan-cpu-adam-bench: parameters updated per second by each CPU optimizer pass of an
// offloaded chunk, for 1, 2, 4, ... threads: the ChunkManager's tasks (kTaskElems elements each)
// on a ThreadPool, each running what the chunk manager's task runs for one micro-batch (the grad
// arriving as bf16, torch's sqrt kernel: the bit-exact configuration).
//   adamw_fp32    fp32 model: AdamWUpdate on fp32 arrays
//   adamw         bf16 model, fp32 master: widen the grad, AdamWUpdate, round the master to bf16
//   adamw_bf16_torch  bf16 parameters and moments, no master: torch's at::_fused_adamw_ on the
//                 range (what the chunk manager calls)
//   adamw_bf16    the same update by the torch-free AdamWBf16Update (bit-identical)
//   adamw_bf16_direct  AdamWBf16Update alone, on the bf16 grad: an offloaded chunk's pass in
//                 training (one micro-batch: no accumulation copy)
//   adamw_bf16_params  its parameter results alone (AdamWBf16ParamPass: moments not written)
//   adamw_bf16_into_copies  adamw_bf16_direct reading one copy of the parameters and moments and
//                 writing another (UpdateIntoCopies: a speculative update's pass)
//   adamw8bit     bf16 parameters, 8-bit moments: AdamW8bitUpdateBf16, stochastic rounding
//   sgd           bf16 model, fp32 master: widen the grad, SgdUpdate, round to bf16
// vs_adamw is a pass's time over adamw's (common/optimizer_bytes.h's kAdamW8bitCpuTimeFactor is
// that ratio for adamw8bit). cpu_ns_per_param is the tasks' own CPU time (the sum over threads of
// CLOCK_THREAD_CPUTIME_ID, best pass) per parameter: unlike seconds it does not count the time a
// task waits for a core on a loaded machine, so it is the figure to compare there.
// Usage: memplan-cpu-adam-bench [num_params (default 64M)] [max_threads (default: hardware)]
//        [passes (comma-separated names, default all)]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/thread_pool.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"

namespace {

constexpr int64_t kTaskElems = int64_t{1} << 18;  // the ChunkManager's task size
constexpr int kReps = 3;

int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

struct Timing {
  double seconds = 1e30;      // wall time of the best pass
  double cpu_seconds = 1e30;  // the tasks' CPU time, least over the passes
};

// The best of kReps passes over n elements, each split into kTaskElems tasks on `threads`
// threads; task(step, begin, len).
Timing BestTiming(int threads, int64_t n,
                  const std::function<void(int64_t, int64_t, int64_t)>& task) {
  memplan::ThreadPool pool(threads);
  Timing best;
  for (int rep = 0; rep < kReps; ++rep) {
    memplan::TaskTracker tracker;
    std::atomic<int64_t> cpu_nanos{0};
    const auto start = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < n; begin += kTaskElems) {
      const int64_t len = std::min(kTaskElems, n - begin);
      tracker.Add();
      pool.Schedule([&, rep, begin, len] {
        const int64_t cpu_start = ThreadCpuNanos();
        task(rep + 1, begin, len);
        cpu_nanos += ThreadCpuNanos() - cpu_start;
        tracker.Done();
      });
    }
    tracker.Wait();
    best.seconds = std::min(
        best.seconds,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    best.cpu_seconds = std::min(best.cpu_seconds, static_cast<double>(cpu_nanos.load()) * 1e-9);
  }
  return best;
}

// Whether `name` is in the comma-separated `list` ("" = every pass).
bool Selected(const std::string& list, const std::string& name) {
  if (list.empty()) return true;
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{64} << 20);
  const int max_threads =
      argc > 2 ? std::atoi(argv[2]) : std::max(1u, std::thread::hardware_concurrency());
  const std::string only = argc > 3 ? argv[3] : "";
  if (argc > 4 || n <= 0 || max_threads <= 0) {
    std::fprintf(argc > 1 && std::strcmp(argv[1], "--help") == 0 ? stdout : stderr,
                 "usage: memplan-cpu-adam-bench [num_params > 0 (default 64M)] "
                 "[max_threads > 0 (default: hardware)] [passes, comma-separated (default all)]\n"
                 "Prints parameters updated per second by each CPU optimizer pass for 1, 2, 4, "
                 "... threads.\n");
    return argc > 1 && std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  using memplan::AdamWStepScalars;
  const memplan::AdamWOptions options;
  // Weights and grads as a model has them (normal, std 0.02 and 1e-3, a different scale every
  // 4096 elements), not constants: the 8-bit pass's table lookups then see real codes.
  std::vector<float> master(n), grad32(n), m32(n, 0.0f), v32(n, 0.0f);
  std::vector<uint16_t> param16(n), grad16(n), accum16(n, 0);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    float scale = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
      if (i % 4096 == 0) scale = std::exp2(normal(rng));
      master[i] = 0.02f * normal(rng);
      grad32[i] = 1e-3f * scale * normal(rng);
    }
    memplan::RoundToBf16(n, master.data(), param16.data());
    memplan::RoundToBf16(n, grad32.data(), grad16.data());
    for (int64_t i = 0; i < n; ++i) {
      master[i] = memplan::Bf16BitsToFloat(param16[i]);
      grad32[i] = memplan::Bf16BitsToFloat(grad16[i]);
    }
  }
  std::vector<uint16_t> m16(n, 0), v16(n, 0);
  std::vector<uint16_t> param16_copy(n, 0), m16_copy(n, 0), v16_copy(n, 0);  // into_copies
  std::vector<uint8_t> m8(n, 0), v8(n, 0);
  std::vector<float> m_absmax(n / 128 + 2, 0.0f), v_absmax(n / 128 + 2, 0.0f);
  const memplan::SgdStepScalars sgd = memplan::MakeSgdStepScalars(options.lr, options.weight_decay);

  struct Pass {
    std::string name;
    std::function<void(int64_t, int64_t, int64_t)> task;
  };
  // adamw_bf16 reproduces torch's AVX2 / AVX-512 kernels only: 0 skips its pass.
  const int64_t torch_vector_elems = memplan::TorchBf16VectorElems();
  std::vector<Pass> passes;
  passes.push_back({"adamw_fp32", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AdamWUpdate(memplan::MakeAdamWStepScalars(options, step), 1.0f,
                                           len, master.data() + b, grad32.data() + b,
                                           m32.data() + b, v32.data() + b, &memplan::TorchSqrt);
                    }});
  passes.push_back({"adamw", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16(true, len, grad16.data() + b, grad32.data() + b);
                      memplan::AdamWUpdate(memplan::MakeAdamWStepScalars(options, step), 1.0f,
                                           len, master.data() + b, grad32.data() + b,
                                           m32.data() + b, v32.data() + b, &memplan::TorchSqrt);
                      memplan::RoundToBf16(len, master.data() + b, param16.data() + b);
                    }});
  passes.push_back({"adamw_bf16_torch", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16Rounded(true, len, grad16.data() + b,
                                                         accum16.data() + b);
                      auto view = [&](uint16_t* base) {
                        return torch::from_blob(base + b, {len},
                                                torch::TensorOptions().dtype(torch::kBFloat16));
                      };
                      at::_fused_adamw_({view(param16.data())}, {view(accum16.data())},
                                        {view(m16.data())}, {view(v16.data())}, {},
                                        {torch::full({}, static_cast<double>(step),
                                                     torch::kFloat32)},
                                        options.lr, options.beta1, options.beta2,
                                        options.weight_decay, options.eps, false, false);
                    }});
  if (torch_vector_elems > 0) {
    passes.push_back({"adamw_bf16", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16Rounded(true, len, grad16.data() + b,
                                                         accum16.data() + b);
                      memplan::AdamWBf16Update(memplan::MakeAdamWStepScalars(options, step), 1.0f,
                                               len, param16.data() + b, accum16.data() + b,
                                               m16.data() + b, v16.data() + b,
                                               torch_vector_elems);
                    }});
  }
  if (torch_vector_elems > 0) {
    // What an offloaded adamw_bf16 chunk runs in training (no accumulation pass: the update reads
    // the staged grad), and its parameter part alone (AdamWBf16ParamPass).
    passes.push_back({"adamw_bf16_direct", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AdamWBf16Update(memplan::MakeAdamWStepScalars(options, step), 1.0f,
                                               len, param16.data() + b, grad16.data() + b,
                                               m16.data() + b, v16.data() + b,
                                               torch_vector_elems);
                    }});
    passes.push_back({"adamw_bf16_params", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AdamWBf16ParamPass(memplan::MakeAdamWStepScalars(options, step),
                                                  1.0f, len, param16.data() + b,
                                                  grad16.data() + b, m16.data() + b,
                                                  v16.data() + b, torch_vector_elems);
                    }});
    passes.push_back(
        {"adamw_bf16_into_copies", [&](int64_t step, int64_t b, int64_t len) {
           auto bytes = [](std::vector<uint16_t>& v) { return reinterpret_cast<char*>(v.data()); };
           const std::vector<memplan::TileArray> tiled = {
               {bytes(param16), bytes(param16_copy), 2, false},
               {bytes(m16), bytes(m16_copy), 2, false},
               {bytes(v16), bytes(v16_copy), 2, false}};
           memplan::UpdateIntoCopies(
               b, len, tiled, /*slot=*/128, [&](int64_t begin, int64_t count, char* const* tile) {
                 memplan::AdamWBf16Update(memplan::MakeAdamWStepScalars(options, step), 1.0f, count,
                                          reinterpret_cast<uint16_t*>(tile[0]),
                                          grad16.data() + begin,
                                          reinterpret_cast<uint16_t*>(tile[1]),
                                          reinterpret_cast<uint16_t*>(tile[2]), torch_vector_elems);
               });
         }});
  }
  passes.push_back({"adamw8bit", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16Rounded(true, len, grad16.data() + b,
                                                         accum16.data() + b);
                      memplan::QuantBlocks blocks;  // bf16: two absmax slots per block
                      blocks.first_slot_gap = 2;
                      blocks.slot_stride = 2;
                      memplan::AdamW8bitUpdateBf16(
                          memplan::MakeAdamWStepScalars(options, step), 1.0f, len, blocks,
                          param16.data() + b, accum16.data() + b, m8.data() + b, v8.data() + b,
                          m_absmax.data() + b / 128, v_absmax.data() + b / 128,
                          &memplan::TorchSqrt,
                          memplan::ParamRounding{true, memplan::StochasticRoundingKey(0, 0, step),
                                                 b});
                    }});
  passes.push_back({"sgd", [&](int64_t, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16(true, len, grad16.data() + b, grad32.data() + b);
                      memplan::SgdUpdate(sgd, 1.0f, len, master.data() + b, grad32.data() + b);
                      memplan::RoundToBf16(len, master.data() + b, param16.data() + b);
                    }});

  std::printf("params=%lld task_elems=%lld reps=%d (best of) isa=%s\n",
              static_cast<long long>(n), static_cast<long long>(kTaskElems), kReps,
              memplan::CpuIsaName(memplan::BestCpuIsa()));
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    double adamw_seconds = 0;
    for (const Pass& pass : passes) {
      if (!Selected(only, pass.name)) continue;
      const Timing t = BestTiming(threads, n, pass.task);
      const double seconds = t.seconds;
      if (pass.name == "adamw") adamw_seconds = seconds;
      std::printf("optimizer=%-16s threads=%d seconds=%.4f params_per_second=%.3e",
                  pass.name.c_str(), threads, seconds, static_cast<double>(n) / seconds);
      if (adamw_seconds > 0) std::printf(" vs_adamw=%.2f", seconds / adamw_seconds);
      std::printf(" cpu_ns_per_param=%.3f", t.cpu_seconds * 1e9 / static_cast<double>(n));
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
