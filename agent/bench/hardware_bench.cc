#include "agent/bench/hardware_bench.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/thread_pool.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/host_ram.h"
#include "agent/core/seconds_since.h"
#include "agent/core/torch_pch.h"
#include "agent/quant/nf4.h"
#include "common/log.h"
#include "common/nf4_bytes.h"
#include "common/validate.h"

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMPLAN_BENCH_CUDA 1
#endif

namespace memplan {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

class Recorder {
 public:
  explicit Recorder(const HardwareBenchOptions& options, HardwareBenchResult* result)
      : options_(options), result_(result) {}

  void Add(std::string name, double value, std::string unit, std::string note = "") {
    const std::string line = absl::StrFormat("bench %-28s %12.3f %-9s %s", name, value, unit, note);
    if (options_.progress) {
      options_.progress(line);
    } else {
      MEMPLAN_LOG(kInfo, "bench").Field("figure", name).Field("value", value).Field("unit", unit);
    }
    result_->figures.push_back(
        BenchFigure{std::move(name), value, std::move(unit), std::move(note)});
  }

 private:
  const HardwareBenchOptions& options_;
  HardwareBenchResult* result_;
};

// ---------------------------------------------------------------- host figures

// RLIMIT_MEMLOCK soft limit; 0 = unlimited.
int64_t MemlockLimitBytes() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<int64_t>(limit.rlim_cur);
}

// ---------------------------------------------------------------- CPU passes

// The figures of one CPU pass: elements per second of the median timed run, and the slowest and
// fastest runs' rates.
struct PassRate {
  double params_per_second = 0;
  double slowest = 0;
  double fastest = 0;
  int runs = 0;
};

// Runs `sweep(run)` once untimed (first touch of fresh pages is not the pass's cost), then again
// until it has at least `options.adam_repetitions` timed runs and `options.adam_min_seconds` in
// them.
template <typename Sweep>
PassRate TimePass(const HardwareBenchOptions& options, int64_t n, Sweep sweep) {
  sweep(0);
  std::vector<double> seconds;
  double total = 0;
  for (int run = 1; static_cast<int>(seconds.size()) < std::max(1, options.adam_repetitions) ||
                    total < options.adam_min_seconds;
       ++run) {
    const auto start = Clock::now();
    sweep(run);
    seconds.push_back(SecondsSince(start));
    total += seconds.back();
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t k = seconds.size();
  const double median = k % 2 == 1 ? seconds[k / 2] : 0.5 * (seconds[k / 2 - 1] + seconds[k / 2]);
  PassRate r;
  r.params_per_second = static_cast<double>(n) / median;
  r.slowest = static_cast<double>(n) / seconds.back();
  r.fastest = static_cast<double>(n) / seconds.front();
  r.runs = static_cast<int>(k);
  return r;
}

std::string PassNote(const PassRate& r, int threads, int64_t n, absl::string_view what) {
  return absl::StrFormat("%d threads, %s, %dM params, median of %d (%.0f-%.0f)", threads, what,
                         n >> 20, r.runs, r.slowest / 1e6, r.fastest / 1e6);
}

// Schedules fn(begin, len) on the pool for every range of the chunk manager's task size
// (agent/chunks/chunk_optimizer_step.cc, kTaskElems) and waits for all of them.
constexpr int64_t kRange = int64_t{1} << 18;
template <typename Fn>
void OverRanges(ThreadPool& pool, int64_t n, Fn fn) {
  TaskTracker tracker;
  for (int64_t begin = 0; begin < n; begin += kRange) {
    const int64_t len = std::min(kRange, n - begin);
    tracker.Add();
    pool.Schedule([&fn, &tracker, begin, len] {
      fn(begin, len);
      tracker.Done();
    });
  }
  tracker.Wait();
}

// The offloaded chunks' CPU work for a bf16 model with AdamW (fp32 master and moments), on the
// chunk manager's own kernels (agent/chunks/cpu_adamw.h) and task size, over arrays of
// options.adam_params elements (256 MiB of fp32 each by default: no last-level cache holds them).
struct AdamPasses {
  PassRate whole;       // widen + AdamW + round per range: one micro-batch, no clipping
  PassRate accumulate;  // [Two CPU passes] one micro-batch's grads into the fp32 grad array
  PassRate update;      // [Two CPU passes] AdamW from that array, after the global norm
};

AdamPasses MeasureAdamPasses(const HardwareBenchOptions& options, ThreadPool& pool) {
  const int64_t n = options.adam_params;
  std::vector<float> master(n, 0.5f), grad(n, 0.01f), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  std::vector<uint16_t> grad16(n, 0x3c24), param16(n, 0);  // bf16 0.01, 0
  auto update = [&](const AdamWStepScalars& s, float grad_scale, int64_t begin, int64_t len) {
    AdamWUpdate(s, grad_scale, len, master.data() + begin, grad.data() + begin,
                exp_avg.data() + begin, exp_avg_sq.data() + begin, &TorchSqrt);
    RoundToBf16(len, master.data() + begin, param16.data() + begin);
  };
  AdamPasses r;
  // What ScheduleChunkWork does when the grads are final and nothing is clipped: each task
  // widens its range and updates it while the fp32 grads are still in cache.
  r.whole = TimePass(options, n, [&](int run) {
    const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, run + 1);
    OverRanges(pool, n, [&](int64_t begin, int64_t len) {
      AccumulateGradBf16(/*first=*/true, len, grad16.data() + begin, grad.data() + begin);
      update(s, 1.0f, begin, len);
    });
  });
  // PostBackward's accumulate (AccumulateGradBf16 over the staged bf16 grads) for the whole
  // array. A later micro-batch adds; the first one copies, which moves the same cache lines
  // (the stores read each line first), so the add stands for both.
  r.accumulate = TimePass(options, n, [&](int) {
    OverRanges(pool, n, [&](int64_t begin, int64_t len) {
      AccumulateGradBf16(/*first=*/false, len, grad16.data() + begin, grad.data() + begin);
    });
  });
  // Step()'s update under clipping: every range reads fp32 grads that the accumulate wrote long
  // before (out of cache), scaled by a clip coefficient.
  r.update = TimePass(options, n, [&](int run) {
    const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, run + 1);
    OverRanges(pool, n, [&](int64_t begin, int64_t len) { update(s, 0.5f, begin, len); });
  });
  return r;
}

// The adamw8bit pass of the same chunk (bf16 grads and parameters, uint8 moments with their
// absmax slots, no master, stochastic rounding as `memplan-agent train` runs it by default), for
// the ratio the cost model prices it by (kAdamW8bitCpuTimeFactor, common/optimizer_bytes.h).
PassRate CpuAdamW8bitRate(const HardwareBenchOptions& options, ThreadPool& pool) {
  const int64_t n = options.adam_params;
  std::vector<uint16_t> grad16(n, 0x3c24), param16(n, 0x3f00);  // bf16 0.01, 0.5
  std::vector<uint8_t> exp_avg(n, 0), exp_avg_sq(n, 0);
  std::vector<float> absmax((n + 255) / 256 * 2, 0.0f), absmax_sq(absmax.size(), 0.0f);
  return TimePass(options, n, [&](int run) {
    const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, run + 1);
    OverRanges(pool, n, [&](int64_t begin, int64_t len) {
      QuantBlocks blocks;  // bf16: two slots per 256-element block
      blocks.first_slot_gap = 2;
      blocks.slot_stride = 2;
      AdamW8bitUpdateBf16(s, 1.0f, len, blocks, param16.data() + begin, grad16.data() + begin,
                          exp_avg.data() + begin, exp_avg_sq.data() + begin,
                          absmax.data() + begin / 128, absmax_sq.data() + begin / 128, &TorchSqrt,
                          ParamRounding{true, StochasticRoundingKey(0, 0, run + 1), begin});
    });
  });
}

// [CPU pass bytes] adamw_bf16's update as ScheduleChunkWork runs it on an offloaded chunk
// (AdamWBf16Update: bf16 parameter, grad and moments in place, torch's fused AdamW bit for bit);
// nullopt where torch's CPU dispatch is one that kernel does not reproduce (training then calls
// at::_fused_adamw_ per range, which is not timed here).
std::optional<PassRate> CpuAdamWBf16Rate(const HardwareBenchOptions& options, ThreadPool& pool) {
  const int64_t vector_elems = TorchBf16VectorElems();
  if (vector_elems <= 0) return std::nullopt;
  const int64_t n = options.adam_params;
  std::vector<uint16_t> grad16(n, 0x3c24), param16(n, 0x3f00), exp_avg(n, 0), exp_avg_sq(n, 0);
  return TimePass(options, n, [&](int run) {
    const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, run + 1);
    OverRanges(pool, n, [&](int64_t begin, int64_t len) {
      AdamWBf16Update(s, 0.5f, len, param16.data() + begin, grad16.data() + begin,
                      exp_avg.data() + begin, exp_avg_sq.data() + begin, vector_elems);
    });
  });
}

// [CPU pass bytes] sgd's update pass on a bf16 model's offloaded chunk: the fp32 master from the
// fp32 grad array (the accumulate pass's output, out of cache as after the norm), rounded into
// the bf16 parameters, as ScheduleChunkWork runs it.
PassRate CpuSgdRate(const HardwareBenchOptions& options, ThreadPool& pool) {
  const int64_t n = options.adam_params;
  std::vector<float> master(n, 0.5f), grad(n, 0.01f);
  std::vector<uint16_t> param16(n, 0);
  const AdamWOptions defaults;
  const SgdStepScalars s = MakeSgdStepScalars(defaults.lr, defaults.weight_decay);
  return TimePass(options, n, [&](int) {
    OverRanges(pool, n, [&](int64_t begin, int64_t len) {
      SgdUpdate(s, 0.5f, len, master.data() + begin, grad.data() + begin);
      RoundToBf16(len, master.data() + begin, param16.data() + begin);
    });
  });
}

// ---------------------------------------------------------------- GPU figures

#ifdef MEMPLAN_BENCH_CUDA
// Device-level used bytes through NVML, loaded at run time (no link dependency); nullopt when
// NVML is missing. Identifies the device by PCI bus id, which CUDA and NVML agree on.
class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    init_ = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
    by_bus_ = reinterpret_cast<int (*)(const char*, void**)>(
        dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    memory_ = reinterpret_cast<int (*)(void*, Memory*)>(dlsym(lib_, "nvmlDeviceGetMemoryInfo"));
    shutdown_ = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"));
    ok_ = init_ != nullptr && by_bus_ != nullptr && memory_ != nullptr && init_() == 0;
  }
  ~Nvml() {
    if (ok_ && shutdown_ != nullptr) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  std::optional<int64_t> UsedBytes(int cuda_device) {
    if (!ok_) return std::nullopt;
    char bus_id[64] = {0};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    void* device = nullptr;
    Memory memory{};
    if (by_bus_(bus_id, &device) != 0 || memory_(device, &memory) != 0) return std::nullopt;
    return static_cast<int64_t>(memory.used);
  }

 private:
  struct Memory {
    unsigned long long total, free, used;
  };
  void* lib_ = nullptr;
  int (*init_)() = nullptr;
  int (*by_bus_)(const char*, void**) = nullptr;
  int (*memory_)(void*, Memory*) = nullptr;
  int (*shutdown_)() = nullptr;
  bool ok_ = false;
};

// Whether the device's primary context exists already (driver API, loaded at run time); false
// when that cannot be told.
bool PrimaryContextActive(int cuda_device) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  auto get_device = reinterpret_cast<int (*)(int*, int)>(dlsym(lib, "cuDeviceGet"));
  auto get_state =
      reinterpret_cast<int (*)(int, unsigned int*, int*)>(dlsym(lib, "cuDevicePrimaryCtxGetState"));
  bool active = false;
  int device = 0;
  unsigned int flags = 0;
  int state = 0;
  if (get_device != nullptr && get_state != nullptr && get_device(&device, cuda_device) == 0 &&
      get_state(device, &flags, &state) == 0) {
    active = state != 0;
  }
  dlclose(lib);
  return active;
}
#endif

// Best bandwidth of `reps` timed runs of `copy` (after one untimed run), bytes per second.
template <typename Copy>
double BestRate(int reps, int64_t bytes, Copy copy) {
  copy();
  torch::cuda::synchronize();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    copy();
    torch::cuda::synchronize();
    best = std::min(best, SecondsSince(start));
  }
  return static_cast<double>(bytes) / best;
}

absl::Status MeasureGpu(const HardwareBenchOptions& options, Recorder& rec, HardwareSpec& spec) {
#ifndef MEMPLAN_BENCH_CUDA
  return absl::FailedPreconditionError("this build has no CUDA runtime; GPU figures not measured");
#else
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "no CUDA device is available; only the host figures (CPU AdamW, RAM, memlock) were "
        "measured");
  }
  const int dev = options.device_index;
  if (dev < 0 || dev >= static_cast<int>(torch::cuda::device_count())) {
    return absl::InvalidArgumentError(absl::StrCat("device_index = ", dev, " is out of range; ",
                                                   torch::cuda::device_count(), " CUDA devices"));
  }
  // [Context overhead] Device-level used memory before this process has a context, and after
  // the benchmark (context + cuBLAS handles + lazily loaded kernels), minus what the caching
  // allocator holds: the bytes a training process has that no tensor accounts for.
  Nvml nvml;
  // A context made earlier in this process (by Torch, or an earlier benchmark) is already in
  // the "before" reading; then only the upper bound below is available.
  const bool context_existed = PrimaryContextActive(dev);
  const std::optional<int64_t> used_before = context_existed ? std::nullopt : nvml.UsedBytes(dev);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError("cudaGetDeviceProperties failed");
  }
  if (spec.name.empty()) spec.name = prop.name;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
  cudaFree(nullptr);  // creates the primary context
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  spec.gpu_memory_bytes = static_cast<int64_t>(total_bytes);
  rec.Add("gpu_memory", static_cast<double>(total_bytes) / kGiB, "GiB", prop.name);

  try {
    const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));
    const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
    const int64_t n = options.transfer_bytes;
    const int reps = options.transfer_repetitions;
    torch::Tensor pinned_a = torch::empty({n}, u8.pinned_memory(true));
    torch::Tensor pinned_b = torch::empty({n}, u8.pinned_memory(true));
    torch::Tensor pageable = torch::empty({n}, u8);
    pinned_a.fill_(1);
    pinned_b.fill_(2);
    pageable.fill_(3);
    torch::Tensor dev_a = torch::empty({n}, u8.device(device));
    torch::Tensor dev_b = torch::empty({n}, u8.device(device));

    spec.h2d_pinned_bytes_per_second =
        BestRate(reps, n, [&] { dev_a.copy_(pinned_a, /*non_blocking=*/true); });
    rec.Add("h2d_pinned", spec.h2d_pinned_bytes_per_second / 1e9, "GB/s",
            absl::StrCat(n >> 20, " MiB copies"));
    spec.d2h_pinned_bytes_per_second =
        BestRate(reps, n, [&] { pinned_a.copy_(dev_a, /*non_blocking=*/true); });
    rec.Add("d2h_pinned", spec.d2h_pinned_bytes_per_second / 1e9, "GB/s");
    spec.h2d_pageable_bytes_per_second = BestRate(reps, n, [&] { dev_a.copy_(pageable); });
    rec.Add("h2d_pageable", spec.h2d_pageable_bytes_per_second / 1e9, "GB/s");
    spec.d2h_pageable_bytes_per_second = BestRate(reps, n, [&] { pageable.copy_(dev_a); });
    rec.Add("d2h_pageable", spec.d2h_pageable_bytes_per_second / 1e9, "GB/s");

    // Both directions at once on two streams: the sum of the two rates.
    c10::cuda::CUDAStream up = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStream down = c10::cuda::getStreamFromPool(false, device.index());
    spec.bidirectional_pinned_bytes_per_second = BestRate(reps, 2 * n, [&] {
      {
        c10::cuda::CUDAStreamGuard g(up);
        dev_a.copy_(pinned_a, true);
      }
      {
        c10::cuda::CUDAStreamGuard g(down);
        pinned_b.copy_(dev_b, true);
      }
    });
    rec.Add("bidirectional_pinned", spec.bidirectional_pinned_bytes_per_second / 1e9, "GB/s",
            "sum of both directions");
    pinned_a.reset();
    pinned_b.reset();
    pageable.reset();
    dev_a.reset();
    dev_b.reset();

    // HBM: a device-to-device copy reads and writes every byte once.
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const int64_t hbm_bytes = std::max<int64_t>(
        int64_t{1} << 20,
        std::min<int64_t>(options.hbm_copy_bytes, static_cast<int64_t>(free_bytes) / 4));
    {
      torch::Tensor src = torch::empty({hbm_bytes}, u8.device(device)).fill_(1);
      torch::Tensor dst = torch::empty({hbm_bytes}, u8.device(device));
      spec.hbm_bytes_per_second = BestRate(reps, 2 * hbm_bytes, [&] { dst.copy_(src, true); });
    }
    rec.Add("hbm_copy", spec.hbm_bytes_per_second / 1e9, "GB/s",
            absl::StrCat("read+write of ", hbm_bytes >> 20, " MiB"));

    // NF4 -> bf16 dequantization of QLoRA's base (agent/quant, the path DequantizeNf4 takes on
    // this build), on an MLP projection of Llama-3.1-8B's shape: NF4 bytes read + bf16 written.
    {
      const torch::Tensor w =
          torch::randn({14336, 4096}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
      absl::StatusOr<quant::Nf4Tensor> q = quant::QuantizeNf4(w);
      if (q.ok()) {
        const int64_t bytes = Nf4Parts(w.numel()).total() + w.numel() * 2;
        spec.nf4_dequant_bytes_per_second =
            BestRate(reps, bytes, [&] { quant::DequantizeNf4(*q, torch::kBFloat16); });
        rec.Add("nf4_dequant", spec.nf4_dequant_bytes_per_second / 1e9, "GB/s",
                quant::Nf4CudaKernelBuilt() ? "CUDA kernel, 14336x4096 to bf16"
                                            : "LibTorch ops, 14336x4096 to bf16");
      }
    }

    // Dense matmul, n shrunk until three n x n fp32 matrices take at most a quarter of free memory.
    cudaMemGetInfo(&free_bytes, &total_bytes);
    int64_t mm = options.matmul_size;
    while (mm > 256 && 3 * mm * mm * 4 > static_cast<int64_t>(free_bytes) / 4) mm /= 2;
    const double flops =
        2.0 * static_cast<double>(mm) * static_cast<double>(mm) * static_cast<double>(mm);
    struct MatmulCase {
      torch::ScalarType type;
      const char* name;
      double* out;
    };
    const MatmulCase cases[] = {{torch::kBFloat16, "matmul_bf16", &spec.matmul_bf16_flops},
                                {torch::kFloat16, "matmul_fp16", &spec.matmul_fp16_flops},
                                {torch::kFloat32, "matmul_fp32", &spec.matmul_fp32_flops}};
    for (const MatmulCase& c : cases) {
      const auto opts = torch::TensorOptions().dtype(c.type).device(device);
      torch::Tensor a = torch::randn({mm, mm}, opts);
      torch::Tensor b = torch::randn({mm, mm}, opts);
      torch::Tensor out = torch::empty({mm, mm}, opts);
      // BestRate's "bytes" is the work: FLOPs per product, times the repetitions per timed run.
      const int inner = std::max(1, options.matmul_repetitions);
      *c.out = BestRate(3, static_cast<int64_t>(flops) * inner, [&] {
        for (int i = 0; i < inner; ++i) at::mm_out(out, a, b);
      });
      rec.Add(c.name, *c.out / 1e12, "TFLOP/s", absl::StrCat(mm, "^3"));
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("GPU benchmark failed: ", e.what_without_backtrace()));
  }

  torch::cuda::synchronize();
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(dev));
  const int64_t reserved =
      stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  const std::optional<int64_t> used_after = nvml.UsedBytes(dev);
  if (used_before.has_value() && used_after.has_value()) {
    spec.cuda_context_bytes = std::max<int64_t>(0, *used_after - *used_before - reserved);
    rec.Add("cuda_context", static_cast<double>(spec.cuda_context_bytes) / kGiB, "GiB",
            "NVML used after - before - allocator reserved");
  } else {
    cudaMemGetInfo(&free_bytes, &total_bytes);
    spec.cuda_context_bytes =
        std::max<int64_t>(0, static_cast<int64_t>(total_bytes - free_bytes) - reserved);
    rec.Add("cuda_context", static_cast<double>(spec.cuda_context_bytes) / kGiB, "GiB",
            context_existed ? "context existed before: device used - reserved (upper bound)"
                            : "no NVML: device used - reserved (upper bound)");
  }
  return absl::OkStatus();
#endif
}

// ---------------------------------------------------------------- collectives

// One row per bandwidth (or one "not measured" row per collective, with the reason); fills the
// profile's NCCL fields (bus bandwidth, as the cost model reads them) from an NCCL run. Returns
// the first reason something was not measured.
absl::Status RecordCollectives(const CollectiveBenchResult& r, const CollectiveBenchOptions& o,
                               Recorder& rec, HardwareSpec& spec) {
  if (!r.status.ok()) {
    for (const char* name : {"allgather_busbw", "reduce_scatter_busbw"}) {
      rec.Add(name, 0, "GB/s", absl::StrCat("not measured: ", r.status.message()));
    }
    return r.status;
  }
  const bool nccl = r.backend == CollectiveBackend::kNccl;
  const std::string setup = absl::StrCat(
      CollectiveBackendName(r.backend), " ", r.dtype, ", ", r.world_size, " ranks, ",
      absl::StrFormat("%.6g", static_cast<double>(r.message_bytes) / (1 << 20)), " MiB ");
  struct Row {
    const char* name;
    const CollectiveFigures& f;
    const char* bytes;
    double* spec_field;
    // [Collectives under compute] (collective_bench.h): a failure there is a "not measured" row,
    // not the bench's status.
    bool optional;
  };
  const Row rows[] = {
      {"allgather", r.allgather, "output", &spec.nccl_allgather_bytes_per_second, false},
      {"reduce_scatter", r.reduce_scatter, "input", &spec.nccl_reduce_scatter_bytes_per_second,
       false},
      {"allgather_under_compute", r.allgather_under_compute, "output",
       &spec.nccl_allgather_under_compute_bytes_per_second, true},
      {"reduce_scatter_under_compute", r.reduce_scatter_under_compute, "input",
       &spec.nccl_reduce_scatter_under_compute_bytes_per_second, true}};
  absl::Status first = absl::OkStatus();
  for (const Row& row : rows) {
    if (!row.f.status.ok()) {
      rec.Add(absl::StrCat(row.name, "_busbw"), 0, "GB/s",
              absl::StrCat("not measured: ", row.f.status.message()));
      if (first.ok() && !row.optional) first = row.f.status;
      continue;
    }
    rec.Add(absl::StrCat(row.name, "_algbw"), row.f.algbw_bytes_per_second / 1e9, "GB/s",
            absl::StrCat(setup, row.bytes, " / median op time (", o.repetitions, " runs of ",
                         o.ops_per_run, ", slowest rank)"));
    const double best_busbw = static_cast<double>(r.message_bytes) / row.f.best_seconds *
                              (r.world_size - 1) / r.world_size;
    rec.Add(absl::StrCat(row.name, "_busbw"), row.f.busbw_bytes_per_second / 1e9, "GB/s",
            absl::StrCat("algbw x (n-1)/n; best ", absl::StrFormat("%.3f", best_busbw / 1e9),
                         " GB/s; data verified",
                         nccl ? "" : "; gloo: not written to the profile (its fields are NCCL's)"));
    if (nccl) *row.spec_field = row.f.busbw_bytes_per_second;
  }
  return first;
}

}  // namespace

HardwareBenchResult MeasureHardware(const HardwareBenchOptions& options) {
  HardwareBenchResult result;
  Recorder rec(options, &result);
  const auto start = Clock::now();
  HardwareSpec& spec = result.spec;
  spec.name = options.name;

  spec.host_memory_bytes = HostRamBytes();
  rec.Add("host_memory", static_cast<double>(spec.host_memory_bytes) / kGiB, "GiB");
  spec.pinned_limit_bytes = MemlockLimitBytes();
  rec.Add("memlock_limit", static_cast<double>(spec.pinned_limit_bytes) / kGiB, "GiB",
          spec.pinned_limit_bytes == 0 ? "unlimited" : "RLIMIT_MEMLOCK soft limit");

  const int threads = options.adam_threads > 0
                          ? options.adam_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options.adam_params > 0 && options.adam_repetitions > 0) {
    const int64_t n = options.adam_params;
    ThreadPool pool(threads);
    const AdamPasses adam = MeasureAdamPasses(options, pool);
    spec.cpu_adam_params_per_second = adam.whole.params_per_second;
    rec.Add("cpu_adamw", spec.cpu_adam_params_per_second / 1e6, "Mparams/s",
            PassNote(adam.whole, threads, n, "bf16 grads -> fp32 AdamW -> bf16 params per range"));
    spec.cpu_grad_accumulate_params_per_second = adam.accumulate.params_per_second;
    rec.Add("cpu_grad_accumulate", spec.cpu_grad_accumulate_params_per_second / 1e6, "Mparams/s",
            PassNote(adam.accumulate, threads, n, "bf16 grads added into fp32 grads"));
    spec.cpu_adam_update_params_per_second = adam.update.params_per_second;
    rec.Add("cpu_adam_update", spec.cpu_adam_update_params_per_second / 1e6, "Mparams/s",
            PassNote(adam.update, threads, n, "fp32 grads -> fp32 AdamW -> bf16 params"));
    const PassRate eight = CpuAdamW8bitRate(options, pool);
    spec.cpu_adamw8bit_params_per_second = eight.params_per_second;
    rec.Add("cpu_adamw8bit", spec.cpu_adamw8bit_params_per_second / 1e6, "Mparams/s",
            absl::StrFormat(
                "%s; time x%.2f of cpu_adamw", PassNote(eight, threads, n, "bf16 -> 8-bit states"),
                spec.cpu_adam_params_per_second / spec.cpu_adamw8bit_params_per_second));
    if (const std::optional<PassRate> bf16 = CpuAdamWBf16Rate(options, pool); bf16.has_value()) {
      spec.cpu_adamw_bf16_params_per_second = bf16->params_per_second;
      rec.Add("cpu_adamw_bf16", spec.cpu_adamw_bf16_params_per_second / 1e6, "Mparams/s",
              PassNote(*bf16, threads, n, "bf16 params, grads and moments in place"));
    } else {
      rec.Add("cpu_adamw_bf16", 0, "Mparams/s",
              "not measured: torch's CPU dispatch is neither AVX2 nor AVX-512 (the planner scales "
              "cpu_adam_update by bytes)");
    }
    const PassRate sgd = CpuSgdRate(options, pool);
    spec.cpu_sgd_params_per_second = sgd.params_per_second;
    rec.Add("cpu_sgd", spec.cpu_sgd_params_per_second / 1e6, "Mparams/s",
            PassNote(sgd, threads, n, "fp32 grads -> fp32 SGD -> bf16 params"));
  }

  result.gpu_status = MeasureGpu(options, rec, spec);
  if (spec.name.empty()) spec.name = "cpu";
  // With world size 1 the NCCL fields stay 0, which the planner reads as "not measured".
  if (options.collective.world_size > 1) {
    CollectiveBenchOptions collective = options.collective;
    if (collective.message_bytes == 0) collective.message_bytes = options.transfer_bytes;
    collective.device_index = options.device_index;
    result.collectives = MeasureCollectives(collective);
    result.collective_status = RecordCollectives(result.collectives, collective, rec, spec);
  }
  spec.measured = result.gpu_status.ok();
  result.seconds = SecondsSince(start);
  return result;
}

absl::StatusOr<HardwareSpec> RunHardwareBench(const HardwareBenchOptions& options) {
  HardwareBenchResult result = MeasureHardware(options);
  if (!result.gpu_status.ok()) return result.gpu_status;
  if (absl::Status s = ValidateHardwareSpec(result.spec, "bench."); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("the benchmark produced an invalid profile: ", s.message()));
  }
  return result.spec;
}

std::string FormatBenchTable(const HardwareBenchResult& result) {
  std::string out = absl::StrFormat("%-24s %14s  %-10s %s\n", "figure", "value", "unit", "note");
  for (const BenchFigure& f : result.figures) {
    absl::StrAppend(&out,
                    absl::StrFormat("%-24s %14.3f  %-10s %s\n", f.name, f.value, f.unit, f.note));
  }
  absl::StrAppend(&out,
                  absl::StrFormat("profile \"%s\": %s in %.1f s\n", result.spec.name,
                                  result.gpu_status.ok() ? std::string("complete")
                                                         : std::string(result.gpu_status.message()),
                                  result.seconds));
  if (!result.collective_status.ok()) {
    absl::StrAppend(&out, "collectives: ", result.collective_status.message(), "\n");
  }
  return out;
}

}  // namespace memplan
