#include "agent/dist/process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"

#ifdef MEMPLAN_WIDEN_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "agent/core/kernel_launch.h"
#include "agent/dist/widened_sum_kernel.h"
#endif

#if defined(USE_DISTRIBUTED) && __has_include(<torch/csrc/distributed/c10d/TCPStore.hpp>)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "agent/dist/process_group_c10d.h"
#define MEMPLAN_DIST_C10D 1
// The wheel ships no Gloo headers; Debian's libgloo-dev provides them (scripts/bootstrap.sh).
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define MEMPLAN_DIST_GLOO 1
#endif
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define MEMPLAN_DIST_NCCL 1
#endif
#endif

// [Naming the failed rank]
// A collective that fails because a peer died says little (Gloo: "connection closed by peer
// 127.0.0.1:port"; a hung peer: a timeout). So every rank bumps its counter "hb/<rank>" in the
// store every heartbeat_milliseconds from a thread of its own, on a store connection of its own.
// After a failure this rank records "failed/<rank>", reads every counter, waits three heartbeats
// and reads them again: ranks whose counter did not move and that recorded no failure of their
// own are gone (exited, killed, or their process hangs). If the store itself cannot be reached,
// rank 0, which serves it, is gone. The failing rank's status then says which rank, so every
// survivor exits naming it.

namespace memplan {

std::string NcclVersionText() {
#ifdef MEMPLAN_DIST_NCCL
  return c10d::getNcclVersion();
#else
  return "none";
#endif
}

absl::StatusOr<DistBackend> ResolveDistBackend(DistBackend requested) {
  const bool cuda = torch::cuda::is_available();
  const DistBackend backend = requested != DistBackend::kAuto
                                  ? requested
                                  : (cuda ? DistBackend::kNccl : DistBackend::kGloo);
  if (backend == DistBackend::kNccl) {
#ifndef MEMPLAN_DIST_NCCL
    return absl::FailedPreconditionError(
        "this build has no NCCL process group (LibTorch without USE_C10D_NCCL, or no nccl.h at "
        "build time)");
#else
    if (!cuda) {
      return absl::FailedPreconditionError(
          "the nccl backend needs a CUDA device; none is available");
    }
#endif
  } else {
#ifndef MEMPLAN_DIST_GLOO
    return absl::FailedPreconditionError(
        "this build has no Gloo process group (LibTorch without USE_C10D_GLOO, or no Gloo headers "
        "at build time: install libgloo-dev)");
#endif
  }
  return backend;
}

#ifndef MEMPLAN_DIST_C10D

class ProcessGroup::Impl {};

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Join(const DistOptions&) {
  return absl::FailedPreconditionError(
      "this LibTorch has no c10d (USE_DISTRIBUTED); no process group can be formed");
}
ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return 0; }
int ProcessGroup::world_size() const { return 1; }
torch::Device ProcessGroup::device() const { return torch::kCPU; }
DistBackend ProcessGroup::backend() const { return DistBackend::kGloo; }
const DistOptions& ProcessGroup::options() const {
  static const DistOptions options;
  return options;
}
std::unique_ptr<PendingCollective> ProcessGroup::AllGather(torch::Tensor, torch::Tensor) {
  return nullptr;
}
std::unique_ptr<PendingCollective> ProcessGroup::AllGatherCoalesced(std::vector<torch::Tensor>,
                                                                    std::vector<torch::Tensor>) {
  return nullptr;
}
std::unique_ptr<PendingCollective> ProcessGroup::ReduceScatterSum(torch::Tensor, torch::Tensor) {
  return nullptr;
}
std::unique_ptr<PendingCollective> ProcessGroup::ReduceScatterSumWidened(torch::Tensor,
                                                                         torch::Tensor) {
  return nullptr;
}
std::unique_ptr<PendingCollective> ProcessGroup::AllReduceSum(torch::Tensor) { return nullptr; }
absl::Status ProcessGroup::Barrier() { return absl::FailedPreconditionError("no c10d"); }

#else

namespace {

// c10d and Gloo report failures as c10::Error (DistBackendError, DistNetworkError, ...) or as
// std::exception; this is the one place they become text.
std::string ExceptionText(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
  }
  return "unknown exception";
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::vector<uint8_t> Bytes(absl::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

}  // namespace

class ProcessGroup::Impl {
 public:
  Impl(const DistOptions& options, DistBackend backend)
      : options_(options),
        backend_kind_(backend),
        device_(backend == DistBackend::kNccl
                    ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(options.local_rank))
                    : torch::Device(torch::kCPU)) {}

  ~Impl() {
    StopHeartbeat();
    // After a failure the backend goes first: a survivor still blocked in a collective with this
    // rank then fails at once instead of at its timeout, while rank 0 keeps the store up for it
    // to name the rank that is gone ([Leaving]).
    if (failed_) ShutdownBackend();
    if (store_) {
      try {
        store_->set(absl::StrCat("left/", options_.rank), Bytes("1"));
        if (options_.rank == 0 && !options_.store_already_served) WaitForTheOthersToLeave();
      } catch (...) {
        // Leaving is best effort: a rank that died already was named by the collectives.
      }
    }
    ShutdownBackend();
    heartbeat_store_.reset();
    store_.reset();
  }

  void ShutdownBackend() {
    if (!backend_) return;
    try {
      backend_->shutdown();
    } catch (...) {
    }
    backend_.reset();
  }

  absl::Status Connect() {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options_.master_port);
    store_options.isServer = options_.rank == 0 && !options_.store_already_served;
    store_options.numWorkers = options_.world_size;
    store_options.waitWorkers = true;
    store_options.timeout = timeout();
    if (store_options.isServer && options_.master_listen_fd >= 0) {
      store_options.masterListenFd = options_.master_listen_fd;
    }
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options_.master_addr, store_options);
    store_ = c10::make_intrusive<c10d::PrefixStore>(options_.store_prefix, tcp);
    // A connection of its own: the heartbeat must not queue behind a blocked store call.
    heartbeat_store_ = c10::make_intrusive<c10d::PrefixStore>(options_.store_prefix, tcp->clone());
    heartbeat_store_->setTimeout(std::max(heartbeat() * 2, std::chrono::milliseconds(1000)));
    if (backend_kind_ == DistBackend::kNccl) {
#ifdef MEMPLAN_DIST_NCCL
      c10::cuda::set_device(device_.index());
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create(options_.high_priority_streams);
      nccl_options->timeout = timeout();
      backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, options_.rank,
                                                             options_.world_size, nccl_options);
      // [Collective timing] start and end events around every collective (what
      // TORCH_NCCL_ENABLE_TIMING turns on): two event records per collective.
      backend_->enableCollectivesTiming();
      timed_ = true;
#endif
    } else {
#ifdef MEMPLAN_DIST_GLOO
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout());
      // Loopback rendezvous: bind the loopback device (the default one binds the hostname's
      // address, which may not be reachable in a sandbox); else the hostname's, as torchrun does.
      if (IsLoopback(options_.master_addr)) {
        gloo_options->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(options_.master_addr));
      } else {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, options_.rank,
                                                             options_.world_size, gloo_options);
#endif
    }
    if (!backend_) return absl::InternalError("no process group was created");
    heartbeat_thread_ = std::thread([this] { Heartbeat(); });
    return absl::OkStatus();
  }

  // The status of a failed collective: what failed, on which rank, and who is gone.
  absl::Status Failure(absl::string_view what, const std::string& error) {
    failed_ = true;
    return absl::UnavailableError(absl::StrCat("rank ", options_.rank, " of ", options_.world_size,
                                               ": ", what, " failed: ", DescribeGoneRanks(), " (",
                                               error, ")"));
  }

  const DistOptions& options() const { return options_; }
  DistBackend backend_kind() const { return backend_kind_; }
  const torch::Device& device() const { return device_; }
  c10::intrusive_ptr<c10d::Backend> backend() { return backend_; }
  bool timed() const { return timed_; }
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(int64_t{options_.timeout_seconds} * 1000);
  }
  std::chrono::milliseconds heartbeat() const {
    return std::chrono::milliseconds(options_.heartbeat_milliseconds);
  }

 private:
  void Heartbeat() {
    const std::string key = absl::StrCat("hb/", options_.rank);
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      try {
        heartbeat_store_->add(key, 1);
      } catch (...) {
        // The store is gone (rank 0 exited); failures are reported by the collectives.
      }
      mu_.AwaitWithTimeout(absl::Condition(&stop_),
                           absl::Milliseconds(options_.heartbeat_milliseconds));
    }
  }

  // [Leaving] Rank 0 serves the store, so it stays until every rank has marked itself done — but
  // not for a rank without the mark whose heartbeat stopped (it died, or hangs), and never beyond
  // the timeout. Also after a failure: a survivor may notice the failure later than rank 0 (its
  // pending collective is waited for at the next group), and it needs the store to name the rank
  // that is gone. Runs after this rank's heartbeat thread stopped.
  void WaitForTheOthersToLeave() {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout();
    std::vector<int64_t> last(options_.world_size, -1);
    for (bool first = true;; first = false) {
      bool waiting = false;  // for a rank without the mark whose heartbeat still moves
      bool missing = false;
      for (int r = 1; r < options_.world_size; ++r) {
        if (store_->check({absl::StrCat("left/", r)})) continue;
        missing = true;
        const int64_t beat = store_->add(absl::StrCat("hb/", r), 0);
        if (first || beat != last[r]) waiting = true;
        last[r] = beat;
      }
      if (!missing || !waiting || Clock::now() >= deadline) return;
      // A rank stops its heartbeat just before it marks itself done: three beats between looks.
      std::this_thread::sleep_for(std::min<Clock::duration>(3 * heartbeat(),
                                                            deadline - Clock::now()));
    }
  }

  void StopHeartbeat() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }

  // See [Naming the failed rank].
  std::string DescribeGoneRanks() {
    const std::string store_at = absl::StrCat(options_.master_addr, ":", options_.master_port);
    try {
      auto counters = [&] {
        std::vector<int64_t> values;
        for (int r = 0; r < options_.world_size; ++r) {
          values.push_back(heartbeat_store_->add(absl::StrCat("hb/", r), 0));
        }
        return values;
      };
      std::vector<int64_t> before;
      {
        absl::MutexLock lock(&mu_);
        heartbeat_store_->set(absl::StrCat("failed/", options_.rank), Bytes("1"));
        before = counters();
      }
      std::this_thread::sleep_for(3 * heartbeat());
      std::vector<int64_t> after;
      {
        absl::MutexLock lock(&mu_);
        after = counters();
      }
      std::vector<int> gone;
      {
        absl::MutexLock lock(&mu_);
        for (int r = 0; r < options_.world_size; ++r) {
          // A rank that reported a failure itself saw it too (it may be leaving already).
          if (r != options_.rank && after[r] == before[r] &&
              !heartbeat_store_->check({absl::StrCat("failed/", r)})) {
            gone.push_back(r);
          }
        }
      }
      if (gone.empty()) {
        return "every rank is still alive (a rank is slow, or took another path through the "
               "collectives)";
      }
      return absl::StrCat(gone.size() == 1 ? "rank " : "ranks ", absl::StrJoin(gone, ", "),
                          gone.size() == 1 ? " is" : " are", " gone (no heartbeat for ",
                          3 * options_.heartbeat_milliseconds, " ms: exited, killed or hung)");
    } catch (...) {
      return absl::StrCat("rank 0 is gone (the store it served at ", store_at,
                          " cannot be reached)");
    }
  }

  const DistOptions options_;
  const DistBackend backend_kind_;
  const torch::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> heartbeat_store_;  // used under mu_ once the thread runs
  c10::intrusive_ptr<c10d::Backend> backend_;
  bool timed_ = false;  // the backend records each collective's device time
  std::atomic<bool> failed_{false};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_thread_;
};

namespace {

class C10dPending final : public PendingCollective {
 public:
  C10dPending(ProcessGroup::Impl* group, std::string what, c10::intrusive_ptr<c10d::Work> work,
              std::string start_error)
      : group_(group),
        what_(std::move(what)),
        work_(std::move(work)),
        start_error_(std::move(start_error)) {}

  absl::Status Wait() override {
    if (done_) return status_;
    done_ = true;
    if (!work_) {
      status_ = group_->Failure(what_, start_error_);
      return status_;
    }
    try {
      work_->wait();
    } catch (...) {
      status_ = group_->Failure(what_, ExceptionText(std::current_exception()));
    }
    if (status_.ok() && group_->timed()) timed_work_ = work_;
    work_.reset();
    return status_;
  }

  absl::StatusOr<double> DeviceSeconds(bool wait) override {
    if (!timed_work_) return absl::UnimplementedError("not timed (or already answered)");
    try {
      while (!timed_work_->isCompleted()) {
        if (!wait) return absl::UnavailableError("still running");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      const double seconds = static_cast<double>(timed_work_->getDuration()) / 1000.0;
      timed_work_.reset();
      return seconds;
    } catch (...) {
      timed_work_.reset();
      return absl::UnimplementedError(ExceptionText(std::current_exception()));
    }
  }

 private:
  ProcessGroup::Impl* group_;
  std::string what_;
  c10::intrusive_ptr<c10d::Work> work_;
  c10::intrusive_ptr<c10d::Work> timed_work_;  // finished OK, its duration not yet read
  std::string start_error_;
  bool done_ = false;
  absl::Status status_;
};

template <typename Start>
std::unique_ptr<PendingCollective> StartCollective(ProcessGroup::Impl* group,
                                                   absl::string_view what, Start start) {
  try {
    return std::make_unique<C10dPending>(group, std::string(what), start(), "");
  } catch (...) {
    return std::make_unique<C10dPending>(group, std::string(what), nullptr,
                                         ExceptionText(std::current_exception()));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Join(const DistOptions& options) {
  RETURN_IF_ERROR(ValidateDistOptions(options));
  ASSIGN_OR_RETURN(DistBackend backend, ResolveDistBackend(options.backend));
  auto impl = std::make_unique<Impl>(options, backend);
  std::string error;
  try {
    absl::Status s = impl->Connect();
    if (!s.ok()) error = std::string(s.message());
  } catch (...) {
    error = ExceptionText(std::current_exception());
  }
  if (!error.empty()) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, " of ", options.world_size,
                                               " could not join the ", DistBackendName(backend),
                                               " group at ", options.master_addr, ":",
                                               options.master_port, ": ", error));
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return impl_->options().rank; }
int ProcessGroup::world_size() const { return impl_->options().world_size; }
torch::Device ProcessGroup::device() const { return impl_->device(); }
DistBackend ProcessGroup::backend() const { return impl_->backend_kind(); }
const DistOptions& ProcessGroup::options() const { return impl_->options(); }

std::unique_ptr<PendingCollective> ProcessGroup::AllGather(torch::Tensor output,
                                                           torch::Tensor input) {
  return StartCollective(impl_.get(), "all-gather",
                         [&] { return impl_->backend()->_allgather_base(output, input); });
}

std::unique_ptr<PendingCollective> ProcessGroup::AllGatherCoalesced(
    std::vector<torch::Tensor> outputs, std::vector<torch::Tensor> inputs) {
  if (outputs.size() == 1) return AllGather(outputs[0], inputs[0]);
  return StartCollective(impl_.get(), "coalesced all-gather", [&] {
    return impl_->backend()->allgather_into_tensor_coalesced(outputs, inputs);
  });
}

std::unique_ptr<PendingCollective> ProcessGroup::ReduceScatterSum(torch::Tensor output,
                                                                  torch::Tensor input) {
  return StartCollective(impl_.get(), "reduce-scatter",
                         [&] { return impl_->backend()->_reduce_scatter_base(output, input); });
}

namespace {

// [Narrow reduce-scatter] The 16-bit slices exchanged by an all-to-all (`received`: rank r's slice
// for this rank at r * k), widened and summed into `output` in rank order once the exchange is
// done: on CUDA the sum is queued on the compute stream behind the exchange's wait.
class WidenedReduce final : public PendingCollective {
 public:
  WidenedReduce(std::unique_ptr<PendingCollective> exchange, torch::Tensor received,
                torch::Tensor output, int world)
      : exchange_(std::move(exchange)), received_(std::move(received)),
        output_(std::move(output)), world_(world) {}
  absl::Status Wait() override {
    if (done_) return status_;
    done_ = true;
    status_ = exchange_->Wait();
    if (status_.ok()) Sum();
    received_ = torch::Tensor();
    return status_;
  }
  absl::StatusOr<double> DeviceSeconds(bool wait) override {
    return exchange_->DeviceSeconds(wait);
  }

 private:
  void Sum() {
    const int64_t k = output_.numel();
#ifdef MEMPLAN_WIDEN_CUDA
    // On the GPU one pass (widened_sum_kernel.h) computes the loop's values.
    const auto dtype = cuda::KernelDtypeOf(received_);
    if (dtype.has_value() && output_.is_cuda() && output_.scalar_type() == torch::kFloat32 &&
        output_.is_contiguous() && received_.is_contiguous()) {
      const c10::cuda::CUDAGuard guard(output_.device());
      cuda::CheckLaunch(dist_cuda::LaunchWidenedSum(received_.data_ptr(), world_, k, *dtype,
                                                    output_.data_ptr<float>(),
                                                    cuda::CurrentStream(output_)),
                        "widened sum");
      return;
    }
#endif
    output_.copy_(received_.narrow(0, 0, k).view(output_.sizes()));
    for (int r = 1; r < world_; ++r) {
      output_.add_(received_.narrow(0, r * k, k).view(output_.sizes()));
    }
  }

  std::unique_ptr<PendingCollective> exchange_;
  torch::Tensor received_, output_;
  int world_;
  bool done_ = false;
  absl::Status status_;
};

}  // namespace

std::unique_ptr<PendingCollective> ProcessGroup::ReduceScatterSumWidened(torch::Tensor output,
                                                                         torch::Tensor input) {
  torch::Tensor received = torch::empty_like(input);
  auto exchange = StartCollective(impl_.get(), "reduce-scatter (16-bit exchange)", [&] {
    std::vector<int64_t> equal;  // empty: equal splits
    return impl_->backend()->alltoall_base(received, input, equal, equal);
  });
  return std::make_unique<WidenedReduce>(std::move(exchange), std::move(received),
                                         std::move(output), world_size());
}

std::unique_ptr<PendingCollective> ProcessGroup::AllReduceSum(torch::Tensor tensor) {
  return StartCollective(impl_.get(), "all-reduce", [&] {
    std::vector<at::Tensor> tensors = {tensor};
    return impl_->backend()->allreduce(tensors);
  });
}

absl::Status ProcessGroup::Barrier() {
  // An all-reduce rather than c10d's barrier: the same path (and timeout) as the collectives.
  torch::Tensor t = torch::zeros({1}, torch::TensorOptions().device(impl_->device()));
  return AllReduceSum(t)->Wait();
}

c10::intrusive_ptr<c10d::Backend> C10dBackendOf(ProcessGroup& group) {
  return group.impl().backend();
}

#endif  // MEMPLAN_DIST_C10D

}  // namespace memplan
