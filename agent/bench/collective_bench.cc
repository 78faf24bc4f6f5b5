#include "agent/bench/collective_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/core/torch_pch.h"
#include "common/status.h"

#if defined(USE_DISTRIBUTED) && __has_include(<torch/csrc/distributed/c10d/Backend.hpp>)
#include "agent/bench/collective_bench_testing.h"
#include "agent/dist/process_group.h"
#include "agent/dist/process_group_c10d.h"
#define MEMPLAN_BENCH_C10D 1
#endif
#if __has_include(<c10/cuda/CUDAStream.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define MEMPLAN_BENCH_CUDA_STREAMS 1
#endif

namespace memplan {

namespace {

constexpr int64_t kDefaultMessageBytes = int64_t{256} << 20;

absl::Status IntInRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is out of range [", lo, ", ", hi, "]"));
}

}  // namespace

absl::Status ValidateCollectiveBenchOptions(const CollectiveBenchOptions& o) {
  RETURN_IF_ERROR(IntInRange("world_size", o.world_size, 1, kMaxCollectiveWorldSize));
  RETURN_IF_ERROR(IntInRange("rank", o.rank, 0, o.world_size - 1));
  RETURN_IF_ERROR(IntInRange("master_port", o.master_port, 1, 65535));
  if (o.master_addr.empty()) return absl::InvalidArgumentError("master_addr is empty");
  RETURN_IF_ERROR(IntInRange("device_index", o.device_index, 0, 1023));
  if (o.message_bytes != 0) {
    // At least one 4-byte element per rank (fp32 on Gloo; bf16 needs half of that).
    RETURN_IF_ERROR(IntInRange("message_bytes", o.message_bytes, int64_t{4} * o.world_size,
                               kMaxCollectiveMessageBytes));
  }
  RETURN_IF_ERROR(IntInRange("warmup_ops", o.warmup_ops, 0, 1000));
  RETURN_IF_ERROR(IntInRange("repetitions", o.repetitions, 1, 1000));
  RETURN_IF_ERROR(IntInRange("ops_per_run", o.ops_per_run, 1, 1000));
  RETURN_IF_ERROR(IntInRange("timeout_seconds", o.timeout_seconds, 1, 86400));
  return absl::OkStatus();
}

DistOptions CollectiveDistOptions(const CollectiveBenchOptions& o, CollectiveBackend backend) {
  DistOptions d;
  d.world_size = o.world_size;
  d.rank = o.rank;
  d.local_rank = o.device_index;
  d.local_world_size = 1;
  d.master_addr = o.master_addr;
  d.master_port = o.master_port;
  d.master_listen_fd = o.master_listen_fd;
  d.store_already_served = o.store_already_served;
  d.backend = backend;
  d.timeout_seconds = o.timeout_seconds;
  d.store_prefix = "memplan_bench";
  return d;
}

#ifndef MEMPLAN_BENCH_C10D

CollectiveBenchResult MeasureCollectives(const CollectiveBenchOptions& options) {
  CollectiveBenchResult result;
  result.world_size = options.world_size;
  result.status = absl::FailedPreconditionError(
      "this LibTorch has no c10d (USE_DISTRIBUTED); collectives not measured");
  return result;
}

#else

namespace {

using Clock = std::chrono::steady_clock;

// c10d and Gloo report failures as c10::Error (DistBackendError, DistNetworkError, ...) or as
// std::exception; this is the one place they become a Status.
absl::Status ExceptionToStatus(absl::string_view what, std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const c10::Error& error) {
    return absl::InternalError(absl::StrCat(what, ": ", error.what_without_backtrace()));
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(what, ": ", error.what()));
  }
}

template <typename Fn>
absl::Status Guarded(absl::string_view what, Fn fn) {
  try {
    return fn();
  } catch (...) {
    return ExceptionToStatus(what, std::current_exception());
  }
}

// One rank's membership of the group (agent/dist's ProcessGroup, or a backend formed by a test)
// and the c10d backend the measurement drives directly. Not thread-safe.
class CollectiveGroup {
 public:
  static absl::StatusOr<std::unique_ptr<CollectiveGroup> > Join(const CollectiveBenchOptions& o,
                                                                CollectiveBackend backend) {
    ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group,
                     ProcessGroup::Join(CollectiveDistOptions(o, backend)));
    auto joined = std::make_unique<CollectiveGroup>(o, group->backend(), C10dBackendOf(*group));
    joined->owner_ = std::move(group);
    return joined;
  }

  // A group over a backend formed elsewhere (tests: a fake process group); no store.
  CollectiveGroup(const CollectiveBenchOptions& o, CollectiveBackend backend,
                  c10::intrusive_ptr<c10d::Backend> process_group)
      : options_(o),
        backend_kind_(backend),
        device_(DeviceFor(o, backend)),
        backend_(std::move(process_group)) {}

  ~CollectiveGroup() {
    backend_.reset();
    owner_.reset();  // leaves the group ([Leaving] in agent/dist/process_group.h)
  }

  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  c10d::Backend& backend() { return *backend_; }
  const torch::Device& device() const { return device_; }
  // Gloo: waits for `work`. NCCL: orders the current stream after it (SyncDevice waits). No
  // timeout argument: with one, WorkNCCL::wait polls the host every millisecond, which would
  // break the back-to-back ops apart; options.timeout_seconds still bounds every collective, as
  // the backend's own timeout (ProcessGroup::Join sets it from CollectiveDistOptions).
  void Finish(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }
  void SyncDevice() {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  }
  // Waits for the current stream only (which Finish ordered after the collectives), not for
  // work on the device's other streams: the compute load's.
  void SyncCurrentStream() {
#ifdef MEMPLAN_BENCH_CUDA_STREAMS
    if (device_.is_cuda()) {
      c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
      return;
    }
#endif
    SyncDevice();
  }

  // Element-wise maximum over the ranks (also a barrier).
  std::vector<double> MaxOverRanks(const std::vector<double>& values) {
    std::vector<at::Tensor> t = {torch::tensor(values, torch::dtype(torch::kFloat64)).to(device_)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    Finish(backend_->allreduce(t, opts));
    SyncDevice();
    at::Tensor host = t[0].cpu();
    return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  }

  void Barrier() { MaxOverRanks({0.0}); }

 private:
  static torch::Device DeviceFor(const CollectiveBenchOptions& o, CollectiveBackend backend) {
    if (backend != CollectiveBackend::kNccl) return torch::Device(torch::kCPU);
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.device_index));
  }

  const CollectiveBenchOptions options_;
  const CollectiveBackend backend_kind_;
  torch::Device device_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::unique_ptr<ProcessGroup> owner_;  // null over a test's backend
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Both collectives share two buffers: `full` (the all-gather's output, the reduce-scatter's
// input, world_size shards) and `shard` (one rank's part).
struct Buffers {
  at::Tensor full;
  at::Tensor shard;
};

// A collective: how to run it once, how to prepare the checked op's input, how to check it.
struct Collective {
  const char* name;
  std::function<c10::intrusive_ptr<c10d::Work>(Buffers&)> run;
  std::function<void(Buffers&, int rank)> fill;
  // Empty when the output is right; else what is wrong with it.
  std::function<std::string(const Buffers&, int world_size)> check;
};

// Warm-up ops, then timed runs of ops_per_run back-to-back ops of `c`; sets f's times (the
// slowest rank's median and best per op) or its status. under_load: the compute load runs beside
// them, so the runs wait for the collectives' stream only, not for the whole device.
void TimeOps(CollectiveGroup& group, Buffers& buffers, const Collective& c,
             const CollectiveBenchOptions& o, bool under_load, CollectiveFigures* f) {
  std::vector<double> per_op;
  auto sync = [&] { under_load ? group.SyncCurrentStream() : group.SyncDevice(); };
  f->status = Guarded(absl::StrCat(c.name, " failed"), [&]() -> absl::Status {
    for (int i = 0; i < o.warmup_ops; ++i) group.Finish(c.run(buffers));
    sync();
    for (int rep = 0; rep < o.repetitions; ++rep) {
      group.Barrier();
      const auto start = Clock::now();
      for (int i = 0; i < o.ops_per_run; ++i) group.Finish(c.run(buffers));
      sync();
      per_op.push_back(std::chrono::duration<double>(Clock::now() - start).count() / o.ops_per_run);
    }
    // The group is as fast as its slowest rank; every rank reports the same figures.
    const std::vector<double> slowest =
        group.MaxOverRanks({Median(per_op), *std::min_element(per_op.begin(), per_op.end())});
    f->median_seconds = slowest[0];
    f->best_seconds = slowest[1];
    return absl::OkStatus();
  });
}

// [Collectives under compute] A matrix-multiply load beside the collectives while it lives: on
// CUDA bf16 8192 x 8192 GEMMs on a stream of its own (at most two queued, so that stopping waits
// for little), on the CPU fp32 512 x 512 matmuls, from a thread of its own. Not thread-safe; the
// destructor stops the load and waits for it.
class ComputeLoad {
 public:
  // Returns once the load runs (its first product done) or has failed.
  explicit ComputeLoad(const torch::Device& device) : device_(device) {
    thread_ = std::thread([this] { Run(); });
    std::unique_lock<std::mutex> lock(mu_);
    running_.wait(lock, [this] { return started_; });
  }
  ~ComputeLoad() { Stop().IgnoreError(); }
  ComputeLoad(const ComputeLoad&) = delete;
  ComputeLoad& operator=(const ComputeLoad&) = delete;

  // Stops the load and waits for it; whether it ran (at least one product) and did not fail.
  absl::Status Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (products_ == 0) return absl::InternalError("the compute load ran no product");
    return absl::OkStatus();
  }

 private:
  void Run() {
    absl::Status s = Guarded("the compute load", [this]() -> absl::Status {
      const bool cuda = device_.is_cuda();
      const int64_t n = cuda ? 8192 : 512;
      const auto opts =
          torch::TensorOptions().dtype(cuda ? torch::kBFloat16 : torch::kFloat32).device(device_);
#ifdef MEMPLAN_BENCH_CUDA_STREAMS
      std::optional<c10::cuda::CUDAStreamGuard> guard;
      if (cuda) guard.emplace(c10::cuda::getStreamFromPool(false, device_.index()));
#endif
      const at::Tensor a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
      at::Tensor out = torch::empty({n, n}, opts);
      int64_t done = 0;
      while (!stop_) {
        at::mm_out(out, a, b);
        ++done;
#ifdef MEMPLAN_BENCH_CUDA_STREAMS
        if (cuda && done % 2 == 0) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
        if (done == 1) Started();
      }
#ifdef MEMPLAN_BENCH_CUDA_STREAMS
      if (cuda) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
      std::lock_guard<std::mutex> lock(mu_);
      products_ = done;
      return absl::OkStatus();
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = s;
    }
    Started();  // a load that failed before its first product
  }

  void Started() {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    running_.notify_all();
  }

  const torch::Device device_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable running_;
  bool started_ = false;
  absl::Status error_;
  int64_t products_ = 0;
  std::thread thread_;
};

// Runs `c` once with known input and checks the output on every rank (all ranks learn whether
// any rank saw wrong data), then warm-up ops, then timed runs of ops_per_run back-to-back ops.
// Fills everything but the bandwidths.
CollectiveFigures MeasureOne(CollectiveGroup& group, Buffers& buffers, const Collective& c,
                             const CollectiveBenchOptions& o) {
  CollectiveFigures f;
  std::string wrong;
  f.status = Guarded(absl::StrCat(c.name, " failed"), [&]() -> absl::Status {
    c.fill(buffers, o.rank);
    group.Finish(c.run(buffers));
    group.SyncDevice();
    wrong = c.check(buffers, o.world_size);
    return absl::OkStatus();
  });
  if (!f.status.ok()) return f;
  // Every rank goes on only if every rank's check passed; otherwise all stop here together.
  std::vector<double> bad;
  absl::Status agreed = Guarded("agreeing on the check", [&]() -> absl::Status {
    bad = group.MaxOverRanks({wrong.empty() ? 0.0 : 1.0});
    return absl::OkStatus();
  });
  if (!agreed.ok()) {
    f.status = agreed;
    return f;
  }
  if (!wrong.empty()) {
    f.status = absl::DataLossError(
        absl::StrCat(c.name, " returned wrong data on rank ", o.rank, ": ", wrong));
    return f;
  }
  if (bad[0] != 0) {
    f.status = absl::DataLossError(
        absl::StrCat(c.name, " returned wrong data on another rank (see that rank's output)"));
    return f;
  }
  f.verified = true;
  TimeOps(group, buffers, c, o, /*under_load=*/false, &f);
  return f;
}

std::string FirstMismatch(const at::Tensor& got, const at::Tensor& expected, const char* what) {
  const at::Tensor bad = got.ne(expected);
  if (!bad.any().item<bool>()) return "";
  const int64_t i = bad.flatten().nonzero()[0][0].item<int64_t>();
  const at::Tensor flat_got = got.flatten();
  const at::Tensor flat_expected = expected.expand_as(got).flatten();
  return absl::StrCat(what, " element ", i, " is ", flat_got[i].item<double>(), ", expected ",
                      flat_expected[i].item<double>());
}

// The options' checks shared by both entry points; false (with result->status set) when there is
// nothing to measure.
bool Prepare(const CollectiveBenchOptions& options, CollectiveBenchResult* result) {
  result->world_size = options.world_size;
  if (absl::Status s = ValidateCollectiveBenchOptions(options); !s.ok()) {
    result->status = s;
    return false;
  }
  if (options.world_size < 2) {
    result->status = absl::FailedPreconditionError("world_size = 1: no collective to measure");
    return false;
  }
  return true;
}

// Measures both collectives on a formed group; result->backend is set.
void MeasureOnGroup(const CollectiveBenchOptions& options, CollectiveGroup& g,
                    CollectiveBenchResult* result) {
  const bool nccl = result->backend == CollectiveBackend::kNccl;
  const torch::ScalarType dtype = nccl ? torch::kBFloat16 : torch::kFloat32;
  result->dtype = nccl ? "bf16" : "fp32";
  const int64_t element_bytes = nccl ? 2 : 4;
  const int64_t requested =
      options.message_bytes > 0 ? options.message_bytes : kDefaultMessageBytes;
  const int64_t shard_elements = requested / (element_bytes * options.world_size);
  result->message_bytes = shard_elements * options.world_size * element_bytes;

  Buffers buffers;
  result->status = Guarded("allocating the collective buffers", [&]() -> absl::Status {
    const auto opts = torch::TensorOptions().dtype(dtype).device(g.device());
    buffers.full = torch::empty({options.world_size * shard_elements}, opts);
    buffers.shard = torch::empty({shard_elements}, opts);
    return absl::OkStatus();
  });
  if (!result->status.ok()) return;

  // All-gather: rank r contributes r + 1 everywhere; shard i of the output must hold i + 1.
  const Collective allgather{
      "all-gather", [&g](Buffers& b) { return g.backend()._allgather_base(b.full, b.shard); },
      [](Buffers& b, int rank) {
        b.full.zero_();
        b.shard.fill_(rank + 1);
      },
      [](const Buffers& b, int world_size) {
        const at::Tensor expected = torch::arange(1, world_size + 1, torch::kFloat32)
                                        .to(b.full.options())
                                        .view({world_size, 1});
        return FirstMismatch(b.full.view({world_size, -1}), expected, "output");
      }};
  // Reduce-scatter: every rank contributes ones; every output element must be world_size.
  const Collective reduce_scatter{
      "reduce-scatter",
      [&g](Buffers& b) { return g.backend()._reduce_scatter_base(b.shard, b.full); },
      [](Buffers& b, int) {
        b.shard.zero_();
        b.full.fill_(1);
      },
      [](const Buffers& b, int world_size) {
        return FirstMismatch(b.shard, torch::full({1}, world_size, b.shard.options()), "output");
      }};

  const double bytes = static_cast<double>(result->message_bytes);
  const double bus_factor = static_cast<double>(options.world_size - 1) / options.world_size;
  auto finish = [&](CollectiveFigures f) {
    if (f.status.ok() && f.median_seconds > 0) {
      f.algbw_bytes_per_second = bytes / f.median_seconds;
      f.busbw_bytes_per_second = f.algbw_bytes_per_second * bus_factor;
    }
    return f;
  };
  result->allgather = finish(MeasureOne(g, buffers, allgather, options));
  // A failed all-gather leaves the ranks' op sequences unknown; measure nothing more.
  if (result->allgather.status.ok()) {
    result->reduce_scatter = finish(MeasureOne(g, buffers, reduce_scatter, options));
  } else {
    result->reduce_scatter.status = absl::AbortedError("the all-gather before it failed");
  }
  CollectiveFigures& ag = result->allgather_under_compute;
  CollectiveFigures& rs = result->reduce_scatter_under_compute;
  if (!options.under_compute) {
    ag.status = rs.status = absl::FailedPreconditionError("under_compute is off");
    return;
  }
  if (!result->allgather.status.ok() || !result->reduce_scatter.status.ok()) {
    ag.status = rs.status = absl::AbortedError("the plain measurement before it failed");
    return;
  }
  // [Collectives under compute]: the data was verified above; the same ops, timed beside the
  // load. Every rank runs its own load; a rank whose load failed still takes part in the
  // collectives (the op sequences stay aligned) and the figures carry its error.
  absl::Status load_status;
  {
    ComputeLoad load(g.device());
    TimeOps(g, buffers, allgather, options, /*under_load=*/true, &ag);
    if (ag.status.ok()) TimeOps(g, buffers, reduce_scatter, options, /*under_load=*/true, &rs);
    load_status = load.Stop();
  }
  if (!ag.status.ok()) {
    rs.status = absl::AbortedError("the all-gather under compute before it failed");
    return;
  }
  for (CollectiveFigures* f : {&ag, &rs}) {
    if (f->status.ok() && !load_status.ok()) f->status = load_status;
    f->verified = f->status.ok();
    *f = finish(*f);
  }
}

}  // namespace

CollectiveBenchResult MeasureCollectives(const CollectiveBenchOptions& options) {
  CollectiveBenchResult result;
  if (!Prepare(options, &result)) return result;
  absl::StatusOr<CollectiveBackend> backend = ResolveDistBackend(options.backend);
  if (!backend.ok()) {
    result.status = backend.status();
    return result;
  }
  result.backend = *backend;
  absl::StatusOr<std::unique_ptr<CollectiveGroup> > group =
      CollectiveGroup::Join(options, *backend);
  if (!group.ok()) {
    result.status = group.status();  // names the rank, the backend and the address
    return result;
  }
  MeasureOnGroup(options, **group, &result);
  return result;
}

CollectiveBenchResult MeasureCollectivesOn(const CollectiveBenchOptions& options,
                                           CollectiveBackend backend,
                                           c10::intrusive_ptr<c10d::Backend> process_group) {
  CollectiveBenchResult result;
  if (!Prepare(options, &result)) return result;
  result.backend = backend == CollectiveBackend::kNccl ? backend : CollectiveBackend::kGloo;
  CollectiveGroup group(options, result.backend, std::move(process_group));
  MeasureOnGroup(options, group, &result);
  return result;
}

#endif  // MEMPLAN_BENCH_C10D

}  // namespace memplan
