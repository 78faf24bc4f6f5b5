#include "agent/blocks/activation_offloader.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <atomic>
#include <compare>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/chunks/host_buffer.h"
#include "common/log.h"
#include "common/status.h"

namespace memplan {
namespace {

// [Pageable host pool] A pageable host copy allocated afresh for every offload is memory the
// kernel maps on first touch: the driver's staging copy into it takes a page fault per 4 KiB
// page. On an H200 that made a 117 MB HS_OFFLOAD copy take 105 ms of the training thread (1.1
// GB/s, against the 13 GB/s `memplan-agent bench` measures into reused pageable memory), and a
// pageable device-to-host copy holds that thread until it is done. So the storages of pageable
// host copies are kept when their entries die and handed to the next copy of the same byte size:
// every step after the first writes into mapped memory. The pool holds at most the largest
// amount of host copies alive at once so far (what the step needs anyway). Pinned copies come
// from the caching host allocator, which already reuses them, unless [Exact pinned host copies].
//
// [Exact pinned host copies] (ActivationOffloadOptions::exact_pinned_host) torch's caching host
// allocator rounds every pinned block up to a power of two: a [T, I] MLP activation of qwen3-8b
// at 49 152 tokens (1.21 GB) takes 2 GiB. A plan whose swapped activations the planner priced at
// 165 GB (exact bytes) could then ask well over 200 GB of a 256 GiB host (seed 5757 draw 6,
// docs/benchmarks.md). With the option the pinned copies are page-locked at their exact size
// (cudaHostRegister) and kept in a second pool like the pageable one; a kept storage is handed
// out again only once the copies that read or wrote it (its entry's events) have finished.
class HostStoragePool {
 public:
  // A storage of exactly `nbytes` bytes kept before whose copies have finished, or an undefined
  // one.
  c10::Storage Take(int64_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(nbytes);
    if (it == free_.end()) return c10::Storage();
    std::vector<Kept>& kept = it->second;
    for (size_t i = kept.size(); i-- > 0;) {
      bool done = true;
      for (at::cuda::CUDAEvent& e : kept[i].guards) done = done && e.query();
      if (!done) continue;
      c10::Storage s = std::move(kept[i].storage);
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(i));
      held_ -= nbytes;
      ++reuses_;
      return s;
    }
    return c10::Storage();
  }
  // Keeps `storage` (of nbytes bytes) unless that would hold more than `limit` bytes; `guards`
  // are the events of the copies that used it (none for pageable memory, whose copies are
  // synchronous).
  void Give(c10::Storage storage, int64_t nbytes, int64_t limit,
            std::vector<at::cuda::CUDAEvent> guards = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + nbytes > limit) return;
    held_ += nbytes;
    free_[nbytes].push_back(Kept{std::move(storage), std::move(guards)});
  }
  int64_t reuses() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reuses_;
  }

 private:
  struct Kept {
    c10::Storage storage;
    std::vector<at::cuda::CUDAEvent> guards;
  };
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<Kept>> free_;
  int64_t held_ = 0;
  int64_t reuses_ = 0;
};

// [Exact pinned host copies] `nbytes` of pinned host memory (HostBuffer::AllocatePinned, the
// chunks' host arrays' allocation) as a storage that owns it.
absl::StatusOr<c10::Storage> AllocateExactPinned(int64_t nbytes) {
  ASSIGN_OR_RETURN(HostBuffer buffer, HostBuffer::AllocatePinned(nbytes));
  auto* owner = new HostBuffer(std::move(buffer));
  return c10::Storage(
      c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
      c10::DataPtr(
          owner->data(), owner, [](void* ctx) { delete static_cast<HostBuffer*>(ctx); },
          c10::Device(c10::kCPU)),
      /*allocator=*/nullptr, /*resizable=*/false);
}

// One tensor moved to the host: its host copy and, once prefetched, its device copy. On CUDA the
// events order the copies: d2h_done (offload stream) before the upload, h2d_done (prefetch
// stream) before the first use on the consuming stream.
struct OffloadedTensor {
  torch::Tensor kept;  // pass-through (parameters): never copied
  // [Sources released in program order] The device tensor a device→host copy reads, held until
  // forward has waited for the copy (Impl::ReleaseSources).
  torch::Tensor source;
  torch::Tensor host;
  torch::Tensor device;
  std::optional<at::cuda::CUDAEvent> d2h_done;
  std::optional<at::cuda::CUDAEvent> h2d_done;
  std::optional<c10::cuda::CUDAStream> device_stream;  // whose pool `device` came from
  std::atomic<int64_t>* host_bytes_counter = nullptr;
  // [One copy per saved tensor] Pack hooks holding this entry whose unpack has not come yet.
  int consumers = 1;
  // [Pageable host pool] Where `host` goes back to (pageable copies only), and the pool's bound.
  HostStoragePool* pool = nullptr;
  const std::atomic<int64_t>* pool_limit = nullptr;

  ~OffloadedTensor() {
    // A source dropped before forward waited for its copy (an entry cleared mid-step): the copy
    // may still read it.
    if (source.defined() && d2h_done.has_value()) {
      try {
        d2h_done->synchronize();
      } catch (const c10::Error& e) {
        MEMPLAN_LOG(kWarning, "activation offload: waiting for a copy failed")
            .Field("error", std::string(e.what_without_backtrace()));
      }
    }
    if (host_bytes_counter != nullptr && host.defined()) {
      host_bytes_counter->fetch_sub(static_cast<int64_t>(host.nbytes()));
    }
    // [Upload memory] An upload dropped before its use: its memory returns to the stream's pool
    // now, so that stream must not run past the copy into it.
    if (device.defined() && h2d_done.has_value() && device_stream.has_value()) {
      try {
        h2d_done->block(*device_stream);
      } catch (const c10::Error& e) {
        // Cannot order the streams: wait for the copy on the host instead.
        MEMPLAN_LOG(kWarning, "activation upload: stream wait failed, synchronizing")
            .Field("error", std::string(e.what_without_backtrace()));
        h2d_done->synchronize();
      }
    }
    if (pool != nullptr && host.defined() && host.storage().use_count() == 1) {
      const auto nbytes = static_cast<int64_t>(host.storage().nbytes());
      // [Exact pinned host copies] the copies into and out of it may still run.
      std::vector<at::cuda::CUDAEvent> guards;
      if (d2h_done.has_value()) guards.push_back(std::move(*d2h_done));
      if (h2d_done.has_value()) guards.push_back(std::move(*h2d_done));
      pool->Give(host.storage(), nbytes, pool_limit->load(), std::move(guards));
    }
  }
};

// [One copy per saved tensor] What identifies a saved tensor's data: the same view of the same
// storage object at the same version, as autograd saves it for each op that reads it. The
// storage object, not its data address: a swapped tensor's memory is freed and may come back at
// the same address for another tensor of the group, while the record's weak reference keeps the
// storage object itself (not its memory) from being reused.
struct SavedKey {
  const c10::StorageImpl* storage = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t version = 0;
  auto operator<=>(const SavedKey&) const = default;
};
struct SavedCopy {
  std::weak_ptr<OffloadedTensor> entry;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
};

// [One copy per storage] A dense copy and the span of its storage it holds: elements
// [offset, offset + numel) of the storage, in the storage's own layout.
struct SpanCopy {
  std::weak_ptr<OffloadedTensor> entry;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t offset = 0;
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// A saved tensor read out of another one's copy: its sizes, strides and offset into that copy.
struct ViewOfCopy {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

// What a pack hook holds: the copy, and the view of it the unpack hook gives back (none: the
// copy itself).
struct PackedTensor {
  std::shared_ptr<OffloadedTensor> entry;
  std::optional<ViewOfCopy> view;
};

struct GroupRecord {
  std::vector<std::shared_ptr<OffloadedTensor>> saved;  // SWAP
  std::map<SavedKey, SavedCopy> by_key;
  std::map<std::pair<const c10::StorageImpl*, int64_t>, SpanCopy> by_storage;  // and version
  std::shared_ptr<OffloadedTensor> input;                                      // HS_OFFLOAD
  bool prefetched = false;
};

}  // namespace

class ActivationOffloader::Impl {
 public:
  explicit Impl(const ActivationOffloadOptions& options) : options_(options) {
    cuda_ = options.device.is_cuda();
    pinned_ = cuda_ && options.host_memory == HostMemoryKind::kPinned;
    if (options.host_memory == HostMemoryKind::kPinned && !cuda_) {
      MEMPLAN_LOG(kInfo, "activation offload uses pageable host memory")
          .Field("reason", "pinned memory needs a CUDA device")
          .Field("device", options.device.str());
    }
    if (cuda_) {
      // Tensors report an indexed device; compare against the same form.
      if (!options_.device.has_index()) {
        options_.device = torch::Device(torch::kCUDA, c10::cuda::current_device());
      }
      c10::cuda::CUDAGuard guard(options_.device);
      offload_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false);
      prefetch_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false);
    }
  }

  // The records' entries give back to the counters and the pool below: release them first.
  ~Impl() {
    std::lock_guard<std::mutex> lock(mu_);
    records_.clear();
  }

  // Copies `t` to host memory (asynchronously on CUDA).
  std::shared_ptr<OffloadedTensor> Offload(const torch::Tensor& t) {
    auto entry = std::make_shared<OffloadedTensor>();
    bool exact_pinned = false;
    entry->host = EmptyHostLike(t, &exact_pinned);
    if (!pinned_ || exact_pinned) {  // EmptyHostLike fell back, pageable was asked for, or exact
      entry->pool = exact_pinned ? &pinned_pool_ : &pool_;
      entry->pool_limit = &host_bytes_peak_;
    }
    if (cuda_) {
      c10::cuda::CUDAGuard guard(options_.device);
      auto compute = c10::cuda::getCurrentCUDAStream();
      at::cuda::CUDAEvent produced;
      produced.record(compute);
      produced.block(*offload_stream_);
      {
        c10::cuda::CUDAStreamGuard on_offload(*offload_stream_);
        entry->host.copy_(t, /*non_blocking=*/true);
      }
      // [Sources released in program order] The copy reads `t` on the offload stream. With
      // record_stream its memory, once the caller dropped it, would wait for that stream's queue
      // at whatever moment the allocator looked: which blocks were reusable then depended on how
      // far the GPU trailed the host, each step laid the memory out differently, and reserved
      // bytes crept up step after step (an H200, llama-3.2-1b 5x4352 with 2 SWAP blocks: reserved
      // 51.9 -> 56.1 GB over five steps at a constant 51 GB allocated). Held here instead, it is
      // freed at a fixed point of forward, after its copy is waited for (EndForwardGroup).
      entry->source = t;
      entry->d2h_done.emplace();
      entry->d2h_done->record(*offload_stream_);
    } else {
      entry->host.copy_(t);
    }
    const auto bytes = static_cast<int64_t>(entry->host.nbytes());
    entry->host_bytes_counter = &host_bytes_;
    offloaded_bytes_.fetch_add(bytes);
    const int64_t now = host_bytes_.fetch_add(bytes) + bytes;
    int64_t peak = host_bytes_peak_.load();
    while (now > peak && !host_bytes_peak_.compare_exchange_weak(peak, now)) {
    }
    return entry;
  }

  // Starts the host→device copy of `entry` (no-op if started or if it is a pass-through).
  void Upload(OffloadedTensor& entry) {
    if (entry.kept.defined() || entry.device.defined() || !entry.host.defined()) return;
    if (cuda_) {
      c10::cuda::CUDAGuard guard(options_.device);
      // [Upload memory] The destination comes from the compute stream's pool, so the caching
      // allocator can reuse it for activations afterwards (a side-stream pool would only grow
      // the reserved memory). The block may still be read by compute work already queued, so
      // the copy waits for the compute stream to reach this point. No record_stream on the
      // prefetch stream: the compute stream waits for the copy before it uses the tensor (Use)
      // or before the memory goes back to its pool unused (~OffloadedTensor), so the block is
      // free for compute allocations the moment compute frees it. With record_stream, its free
      // would wait for every copy queued on the prefetch stream by then (the next groups'
      // uploads): on an H200, llama-3.2-3b 7x1536 with 25 HS_OFFLOAD blocks had up to 1.8 GiB of
      // freed blocks pending in backward and its reserved bytes ran 3.2 GB above allocated.
      auto compute = c10::cuda::getCurrentCUDAStream();
      entry.device = EmptyDeviceLike(entry.host);
      entry.device_stream = compute;
      at::cuda::CUDAEvent allocated;
      allocated.record(compute);
      allocated.block(*prefetch_stream_);
      if (entry.d2h_done.has_value()) entry.d2h_done->block(*prefetch_stream_);
      {
        c10::cuda::CUDAStreamGuard on_prefetch(*prefetch_stream_);
        entry.device.copy_(entry.host, /*non_blocking=*/true);
      }
      entry.h2d_done.emplace();
      entry.h2d_done->record(*prefetch_stream_);
    } else {
      entry.device = EmptyDeviceLike(entry.host);
      entry.device.copy_(entry.host);
    }
  }

  // The device tensor of `entry`, ready for use on the current stream. The entry keeps its host
  // copy (a second unpack uploads again) but lets go of the device copy.
  torch::Tensor Use(OffloadedTensor& entry) {
    if (entry.kept.defined()) return entry.kept;
    if (!entry.device.defined()) {
      synchronous_fetches_.fetch_add(1);
      Upload(entry);
    }
    // [One copy per saved tensor] Every consumer but the last shares the device copy.
    const bool last = entry.consumers <= 1;
    torch::Tensor device = entry.device;
    if (last) {
      entry.device = torch::Tensor();
    } else {
      --entry.consumers;
    }
    if (cuda_) {
      c10::cuda::CUDAGuard guard(options_.device);
      auto current = c10::cuda::getCurrentCUDAStream();
      if (entry.h2d_done.has_value()) entry.h2d_done->block(current);
      if (last) entry.h2d_done.reset();
      // Normally allocated from this stream's pool (see [Upload memory]); if another stream
      // consumes it, freeing must also wait for that stream.
      if (entry.device_stream.has_value() && *entry.device_stream != current) {
        device.record_stream(current);
      }
    }
    return device;
  }

  PackedTensor Pack(int group, const torch::Tensor& t, const c10::TensorImpl* block_input) {
    const bool parameter =
        t.is_leaf() && t.requires_grad() && t.unsafeGetTensorImpl() != block_input;
    const bool foreign_device = t.device() != options_.device;
    std::shared_ptr<OffloadedTensor> entry;
    if (parameter || foreign_device) {
      entry = std::make_shared<OffloadedTensor>();
      entry->kept = t;
      passthrough_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu_);
      records_[group].saved.push_back(entry);
      return {entry, std::nullopt};
    }
    // [One copy per saved tensor] Autograd packs a tensor once per op that saves it (a block's
    // normalised input feeds q, k and v): copying each would move and hold it several times,
    // where the profiler (and so the planner) counts the block's saved storage once. The second
    // and later packs share the first's copies.
    // [One copy per storage] So do other views of a storage already copied whole, as long as
    // they lie inside the copied span: on a GPU, attention keeps its output [b, heads, s, d] as
    // a view of a [b, s, heads·d] buffer, and o_proj's input is that buffer itself; copied apart,
    // they moved and held the output twice (hidden·2 bytes a token and swapped block beyond the
    // plan: 6.6 GB for qwen2.5-7b at 44 032 tokens with 21 swapped blocks).
    std::optional<SavedKey> key;
    std::pair<const c10::StorageImpl*, int64_t> storage_key{nullptr, 0};
    if (t.has_storage()) {
      key = SavedKey{t.storage().unsafeGetStorageImpl(),
                     t.storage_offset(),
                     t.sizes().vec(),
                     t.strides().vec(),
                     t.scalar_type(),
                     t._version()};
      storage_key = {t.storage().unsafeGetStorageImpl(), t._version()};
      std::lock_guard<std::mutex> lock(mu_);
      GroupRecord& record = records_[group];
      if (auto it = record.by_key.find(*key); it != record.by_key.end()) {
        if (std::shared_ptr<OffloadedTensor> shared = it->second.entry.lock()) {
          ++shared->consumers;
          shared_saves_.fetch_add(1);
          return {shared, std::nullopt};
        }
      }
      if (auto it = record.by_storage.find(storage_key); it != record.by_storage.end()) {
        const SpanCopy& span = it->second;
        std::shared_ptr<OffloadedTensor> shared = span.entry.lock();
        if (shared && span.dtype == t.scalar_type() && t.numel() > 0) {
          int64_t last = t.storage_offset();  // the view's last element
          for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
          if (t.storage_offset() >= span.offset && last < span.offset + span.numel) {
            ++shared->consumers;
            shared_saves_.fetch_add(1);
            return {shared, ViewOfCopy{t.sizes().vec(), t.strides().vec(),
                                       t.storage_offset() - span.offset}};
          }
        }
      }
    }
    entry = Offload(t);
    std::lock_guard<std::mutex> lock(mu_);
    GroupRecord& record = records_[group];
    record.saved.push_back(entry);
    if (key.has_value()) {
      record.by_key.insert_or_assign(std::move(*key),
                                     SavedCopy{entry, t.storage().getWeakStorageImpl()});
      // The copy has the tensor's own strides when it is dense (EmptyHostLike, EmptyDeviceLike):
      // then it holds the storage's elements [offset, offset + numel) in their own layout.
      if (t.is_non_overlapping_and_dense() && entry->host.strides() == t.strides()) {
        record.by_storage.try_emplace(
            storage_key, SpanCopy{entry, t.storage().getWeakStorageImpl(), t.storage_offset(),
                                  t.numel(), t.scalar_type()});
      }
    }
    return {entry, std::nullopt};
  }

  void OffloadInput(int group, const torch::Tensor& input) {
    auto entry = Offload(input);
    std::lock_guard<std::mutex> lock(mu_);
    records_[group].input = std::move(entry);
  }

  void EndForwardGroup(int group) {
    if (!cuda_) return;
    c10::cuda::CUDAGuard guard(options_.device);
    // A new forward (groups count up within one) after one that had no backward: nothing of the
    // old one is read any more.
    if (group <= last_forward_group_) ReleaseSources(std::numeric_limits<int>::max());
    last_forward_group_ = group;
    bool offloaded = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(group);
      offloaded = it != records_.end() && (!it->second.saved.empty() || it->second.input);
    }
    if (offloaded) {
      InFlight f{group, at::cuda::CUDAEvent()};
      f.done.record(*offload_stream_);
      in_flight_.push_back(std::move(f));
    }
    ReleaseSources(group - (std::max(1, options_.max_in_flight_groups) - 1));
  }

  // [Sources released in program order] Waits for the copies of every in-flight group up to
  // `last_group` and frees the device tensors they read. Called at fixed points of the step (the
  // end of each group's forward, the start of backward), so each step frees and reuses the same
  // memory in the same order.
  void ReleaseSources(int last_group) {
    while (!in_flight_.empty() && in_flight_.front().group <= last_group) {
      InFlight f = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (!f.done.query()) {
        in_flight_waits_.fetch_add(1);
        f.done.synchronize();
      }
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(f.group);
      if (it == records_.end()) continue;
      for (auto& entry : it->second.saved) entry->source = torch::Tensor();
      if (it->second.input) it->second.input->source = torch::Tensor();
    }
  }

  void Prefetch(int group) {
    // Backward has begun: every forward copy's source can go.
    last_forward_group_ = -1;
    if (cuda_ && !in_flight_.empty()) {
      c10::cuda::CUDAGuard guard(options_.device);
      ReleaseSources(std::numeric_limits<int>::max());
    }
    std::vector<std::shared_ptr<OffloadedTensor>> entries;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(group);
      if (it == records_.end() || it->second.prefetched) return;
      it->second.prefetched = true;
      entries = it->second.saved;
      if (it->second.input) entries.push_back(it->second.input);
    }
    for (auto& entry : entries) Upload(*entry);
  }

  torch::Tensor TakeInput(int group) {
    std::shared_ptr<OffloadedTensor> entry;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(group);
      TORCH_CHECK(it != records_.end() && it->second.input,
                  "ActivationOffloader: no offloaded input for group ", group);
      entry = std::move(it->second.input);
      it->second.input.reset();
    }
    return Use(*entry);
  }

  void Clear(int group) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.erase(group);
  }

  void ClearAll() {
    if (cuda_) {
      for (auto& f : in_flight_) f.done.synchronize();
    }
    in_flight_.clear();
    last_forward_group_ = -1;
    std::lock_guard<std::mutex> lock(mu_);
    records_.clear();
  }

  ActivationOffloadStats Stats() const {
    ActivationOffloadStats stats;
    stats.offloaded_bytes = offloaded_bytes_.load();
    stats.host_bytes = host_bytes_.load();
    stats.host_bytes_peak = host_bytes_peak_.load();
    stats.passthrough_tensors = passthrough_.load();
    stats.synchronous_fetches = synchronous_fetches_.load();
    stats.in_flight_waits = in_flight_waits_.load();
    stats.pinned = pinned_;
    stats.pageable_reuses = pool_.reuses();
    stats.exact_pinned_reuses = pinned_pool_.reuses();
    stats.shared_saves = shared_saves_.load();
    return stats;
  }

  const ActivationOffloadOptions& options() const { return options_; }

 private:
  torch::Tensor EmptyHostLike(const torch::Tensor& t, bool* exact_pinned) {
    auto opts = t.options().device(torch::kCPU);
    if (pinned_ && options_.exact_pinned_host && t.is_non_overlapping_and_dense()) {
      // [Exact pinned host copies]
      const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
      absl::StatusOr<c10::Storage> kept = pinned_pool_.Take(nbytes);  // undefined: none to reuse
      if (!*kept) kept = AllocateExactPinned(nbytes);
      if (kept.ok()) {
        *exact_pinned = true;
        return at::empty({0}, opts).set_(*kept, /*storage_offset=*/0, t.sizes(), t.strides());
      }
      pinned_ = false;
      MEMPLAN_LOG(kWarning, "activation offload falls back to pageable host memory")
          .Field("reason", std::string(kept.status().message()));
    }
    if (pinned_) {
      try {
        return EmptyLayoutLike(t, opts.pinned_memory(true));
      } catch (const c10::Error& e) {
        // Pinning can fail (memlock limit); copies still work from pageable memory, slower.
        pinned_ = false;
        MEMPLAN_LOG(kWarning, "activation offload falls back to pageable host memory")
            .Field("reason", std::string(e.what_without_backtrace()));
      }
    }
    // [Pageable host pool] Dense layouts (all the saved activations seen) reuse a kept storage.
    if (t.is_non_overlapping_and_dense()) {
      const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
      c10::Storage kept = pool_.Take(nbytes);
      if (kept) {
        return at::empty({0}, opts).set_(kept, /*storage_offset=*/0, t.sizes(), t.strides());
      }
    }
    return EmptyLayoutLike(t, opts);
  }

  torch::Tensor EmptyDeviceLike(const torch::Tensor& host) {
    return EmptyLayoutLike(host, host.options().device(options_.device).pinned_memory(false));
  }

  // Same sizes and, when the tensor is dense, the same strides: backward kernels then see the
  // layout they saw in forward (and, e.g., pick the same GEMM transposition).
  static torch::Tensor EmptyLayoutLike(const torch::Tensor& t, const torch::TensorOptions& opts) {
    if (t.is_non_overlapping_and_dense()) return at::empty_strided(t.sizes(), t.strides(), opts);
    return at::empty(t.sizes(), opts);
  }

  ActivationOffloadOptions options_;
  HostStoragePool pool_;         // before the records: entries give their storage back to it
  HostStoragePool pinned_pool_;  // [Exact pinned host copies]
  bool cuda_ = false;
  bool pinned_ = false;
  std::optional<c10::cuda::CUDAStream> offload_stream_;
  std::optional<c10::cuda::CUDAStream> prefetch_stream_;
  std::mutex mu_;
  std::map<int, GroupRecord> records_;
  struct InFlight {
    int group = 0;
    at::cuda::CUDAEvent done;  // recorded on the offload stream after the group's copies
  };
  std::deque<InFlight> in_flight_;
  int last_forward_group_ = -1;  // the last EndForwardGroup of the forward under way
  std::atomic<int64_t> offloaded_bytes_{0};
  std::atomic<int64_t> host_bytes_{0};
  std::atomic<int64_t> host_bytes_peak_{0};
  std::atomic<int64_t> passthrough_{0};
  std::atomic<int64_t> shared_saves_{0};
  std::atomic<int64_t> synchronous_fetches_{0};
  std::atomic<int64_t> in_flight_waits_{0};
};

namespace {

// [Saved-tensor hooks] LibTorch has no C++ API for default saved-tensor hooks; SavedVariable asks
// the default autograd Engine for them (Engine::get_default_saved_variable_hooks, virtual). We
// install an Engine subclass that hands out swap hooks while a SwapScope is active on the
// calling thread and otherwise behaves exactly like the base engine.
struct SwapTarget {
  ActivationOffloader::Impl* impl = nullptr;
  int group = 0;
  const c10::TensorImpl* block_input = nullptr;
  SwapTarget* previous = nullptr;
};
thread_local SwapTarget* tls_swap_target = nullptr;

class SwapHooks : public torch::autograd::SavedVariableHooks {
 public:
  SwapHooks(ActivationOffloader::Impl* impl, int group, const c10::TensorImpl* block_input)
      : impl_(impl), group_(group), block_input_(block_input) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    packed_ = impl_->Pack(group_, tensor, block_input_);
  }
  at::Tensor call_unpack_hook() override {
    at::Tensor copy = impl_->Use(*packed_.entry);
    if (!packed_.view.has_value()) return copy;
    const ViewOfCopy& v = *packed_.view;  // [One copy per storage]
    return copy.as_strided(v.sizes, v.strides, copy.storage_offset() + v.offset);
  }

 private:
  ActivationOffloader::Impl* impl_;
  int group_;
  const c10::TensorImpl* block_input_;
  PackedTensor packed_;
};

class SavedTensorHookEngine : public torch::autograd::Engine {
 public:
  // Engine starts its device threads (and its reentrant thread pool) behind one process-wide
  // once-flag. If the base engine already consumed it (a backward ran before us), this engine
  // would have none and fail on the first CUDA backward: start our own in that case.
  SavedTensorHookEngine() {
    initialize_device_threads_pool();
    if (!thread_pool_shared_) start_device_threads();
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    SwapTarget* target = tls_swap_target;
    if (target == nullptr) return nullptr;
    return std::make_unique<SwapHooks>(target->impl, target->group, target->block_input);
  }
};

torch::autograd::Engine& HookEngine() {
  // Never destroyed: autograd worker threads may outlive static destruction.
  static auto* engine = new SavedTensorHookEngine();
  return *engine;
}

void InstallHookEngine() {
  static std::once_flag once;
  std::call_once(once, [] { torch::autograd::set_default_engine_stub(&HookEngine); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<ActivationOffloader>> ActivationOffloader::Create(
    const ActivationOffloadOptions& options) {
  if (options.max_in_flight_groups < 1) {
    return absl::InvalidArgumentError("max_in_flight_groups must be >= 1");
  }
  if (options.device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "activation offload: CUDA device requested but CUDA is "
        "not available");
  }
  InstallHookEngine();
  try {
    return std::unique_ptr<ActivationOffloader>(
        new ActivationOffloader(std::make_unique<Impl>(options)));
  } catch (const c10::Error& e) {
    return absl::InternalError(std::string("activation offload: ") + e.what_without_backtrace());
  }
}

ActivationOffloader::ActivationOffloader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ActivationOffloader::~ActivationOffloader() = default;

ActivationOffloader::SwapScope::~SwapScope() {
  SwapTarget* target = tls_swap_target;
  tls_swap_target = static_cast<SwapTarget*>(previous_);
  delete target;
}

std::unique_ptr<ActivationOffloader::SwapScope> ActivationOffloader::BeginSwap(
    int group, const torch::Tensor& block_input) {
  InstallHookEngine();
  auto* target =
      new SwapTarget{impl_.get(), group, block_input.unsafeGetTensorImpl(), tls_swap_target};
  tls_swap_target = target;
  return std::unique_ptr<SwapScope>(new SwapScope(target->previous));
}

void ActivationOffloader::OffloadInput(int group, const torch::Tensor& input) {
  impl_->OffloadInput(group, input);
}
void ActivationOffloader::EndForwardGroup(int group) { impl_->EndForwardGroup(group); }
void ActivationOffloader::Prefetch(int group) { impl_->Prefetch(group); }
torch::Tensor ActivationOffloader::TakeInput(int group) { return impl_->TakeInput(group); }
void ActivationOffloader::Clear(int group) { impl_->Clear(group); }
void ActivationOffloader::ClearAll() { impl_->ClearAll(); }
ActivationOffloadStats ActivationOffloader::Stats() const { return impl_->Stats(); }
const ActivationOffloadOptions& ActivationOffloader::options() const { return impl_->options(); }

}  // namespace memplan
