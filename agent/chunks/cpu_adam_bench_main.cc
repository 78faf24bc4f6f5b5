// memplan-cpu-adam-bench: parameters updated per second by each CPU optimizer pass of an
// offloaded chunk, for 1, 2, 4, ... threads: the ChunkManager's tasks (kTaskElems elements each)
// on a ThreadPool, each running what the chunk manager's task runs for one micro-batch (the grad
// arriving as bf16, torch's sqrt kernel: the bit-exact configuration).
//   adamw_fp32    fp32 model: AdamWUpdate on fp32 arrays
//   adamw         bf16 model, fp32 master: widen the grad, AdamWUpdate, round the master to bf16
//   adamw_bf16_torch  bf16 parameters and moments, no master: torch's at::_fused_adamw_ on the
//                 range (what the chunk manager calls)
//   adamw_bf16    the same update by the torch-free AdamWBf16Update (bit-identical)
//   adamw8bit     bf16 parameters, 8-bit moments: AdamW8bitUpdateBf16, stochastic rounding
//   sgd           bf16 model, fp32 master: widen the grad, SgdUpdate, round to bf16
// vs_adamw is a pass's time over adamw's (common/optimizer_bytes.h's kAdamW8bitCpuTimeFactor is
// that ratio for adamw8bit).
// Usage: memplan-cpu-adam-bench [num_params (default 64M)] [max_threads (default: hardware)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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

// The best of kReps passes over n elements, each split into kTaskElems tasks on `threads`
// threads; task(step, begin, len).
double BestSeconds(int threads, int64_t n,
                   const std::function<void(int64_t, int64_t, int64_t)>& task) {
  memplan::ThreadPool pool(threads);
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    memplan::TaskTracker tracker;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < n; begin += kTaskElems) {
      const int64_t len = std::min(kTaskElems, n - begin);
      tracker.Add();
      pool.Schedule([&, rep, begin, len] {
        task(rep + 1, begin, len);
        tracker.Done();
      });
    }
    tracker.Wait();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{64} << 20);
  const int max_threads =
      argc > 2 ? std::atoi(argv[2]) : std::max(1u, std::thread::hardware_concurrency());
  if (argc > 3 || n <= 0 || max_threads <= 0) {
    std::fprintf(argc > 1 && std::strcmp(argv[1], "--help") == 0 ? stdout : stderr,
                 "usage: memplan-cpu-adam-bench [num_params > 0 (default 64M)] "
                 "[max_threads > 0 (default: hardware)]\n"
                 "Prints parameters updated per second by each CPU optimizer pass for 1, 2, 4, "
                 "... threads.\n");
    return argc > 1 && std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  using memplan::AdamWStepScalars;
  const memplan::AdamWOptions options;
  std::vector<float> master(n, 0.5f), grad32(n, 0.01f), m32(n, 0.0f), v32(n, 0.0f);
  std::vector<uint16_t> param16(n, 0x3f00), grad16(n, 0x3c24), accum16(n, 0);  // 0.5, 0.01
  std::vector<uint16_t> m16(n, 0), v16(n, 0);
  std::vector<uint8_t> m8(n, 0), v8(n, 0);
  std::vector<float> m_absmax(n / 128 + 2, 0.0f), v_absmax(n / 128 + 2, 0.0f);
  const memplan::SgdStepScalars sgd = memplan::MakeSgdStepScalars(options.lr, options.weight_decay);

  struct Pass {
    std::string name;
    std::function<void(int64_t, int64_t, int64_t)> task;
  };
  const int64_t torch_vector_elems = at::get_cpu_capability() == "AVX512" ? 32 : 16;
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
  passes.push_back({"adamw_bf16", [&](int64_t step, int64_t b, int64_t len) {
                      memplan::AccumulateGradBf16Rounded(true, len, grad16.data() + b,
                                                         accum16.data() + b);
                      memplan::AdamWBf16Update(memplan::MakeAdamWStepScalars(options, step), 1.0f,
                                               len, param16.data() + b, accum16.data() + b,
                                               m16.data() + b, v16.data() + b,
                                               torch_vector_elems);
                    }});
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
      const double seconds = BestSeconds(threads, n, pass.task);
      if (pass.name == "adamw") adamw_seconds = seconds;
      std::printf("optimizer=%-16s threads=%d seconds=%.4f params_per_second=%.3e",
                  pass.name.c_str(), threads, seconds, static_cast<double>(n) / seconds);
      if (adamw_seconds > 0) std::printf(" vs_adamw=%.2f", seconds / adamw_seconds);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
